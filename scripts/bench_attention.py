"""What each attention function costs as sentences grow, and our multi-head paths against PyTorch's.

Default: every attention function of ``models/attention.py`` at the same ``d_model`` and batch,
self-attention over ``L`` positions with a key padding mask, at lengths 16 to 1024 (doubling):

- ``additive``, ``general``, ``scaled_dot``: the single-head functions (the RNN's choices), their
  inner size ``d_a`` / ``d_k`` = ``d_model``, the values attended as they are;
- ``multihead``: ``H`` heads of scaled dot product (``W_Q, W_K, W_V, W_O``) on the fused kernel,
  and ``multihead weights`` the same with ``need_weights=True`` (the softmax written out);
- ``multihead additive``: ``H`` heads of additive attention, as the Transformer's ``additive``.

For each: the median milliseconds of forward+backward, and the memory the forward pass holds for
the backward pass (the tensors autograd saves, counted once each: the part that grows with
length; on CUDA also the peak allocated). Then how each grows: the exponent ``p`` of a power law
``cost ~ L^p`` fitted over the longer lengths, and the ratio of the last doubling, beside the
textbook complexity (``T S`` pairs times ``d_k`` for a dot product, ``d_a`` for additive: both
``L^2``; additive holds a ``(T, S, d_a)`` tensor where a dot product holds ``(T, S)``).

    python scripts/bench_attention.py                          # the grid above, CPU (and CUDA)
    python scripts/bench_attention.py --figure docs/attention_cost.png
    python scripts/bench_attention.py --against-torch          # ours fused/explicit vs nn.MultiheadAttention

A case whose memory would pass ``--max-gib`` (extrapolated from the shorter lengths) is skipped and
said so.
"""

import argparse
import math
import platform
import statistics
import sys
import time
from typing import Callable, Dict, List, Optional

import torch
from torch import nn

from models.attention import (
    AdditiveAttention,
    GeneralAttention,
    MultiHeadAttention,
    ScaledDotAttention,
    key_mask,
)

FUNCTIONS = ["additive", "general", "scaled_dot", "multihead", "multihead weights", "multihead additive"]
TEXTBOOK = {  # time (pairs x work per pair), memory held for the backward pass
    "additive": ("O(T S d_a)", "O(T S d_a)"),
    "general": ("O(T S D)", "O(T S)"),
    "scaled_dot": ("O(T S d_k)", "O(T S)"),
    "multihead": ("O(T S D)", "O(T) (no weights kept)"),  # the fused kernel; the weights: next row
    "multihead weights": ("O(T S D)", "O(T S H)"),
    "multihead additive": ("O(T S D)", "O(T S D)"),
}
FIT_FROM = 128  # lengths from here on are fitted: below, the projections (linear in L) dominate


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batch", type=int, default=None, help="sentences (default: 4; --against-torch 32)")
    parser.add_argument(
        "--dims", type=int, nargs="+", default=None, help="d_model (default: 256; --against-torch 256 512)"
    )
    parser.add_argument("--heads", type=int, default=None, help="heads (default: 4; --against-torch 8)")
    parser.add_argument("--lengths", type=int, nargs="+", default=None, help="default: 16 32 ... 1024")
    parser.add_argument("--devices", nargs="+", default=None, help="default: cpu, plus cuda when present")
    parser.add_argument("--repeats", type=int, default=None, help="timed runs per case (default: by size)")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    parser.add_argument("--max-gib", type=float, default=8.0, help="skip cases that would hold more (GiB)")
    parser.add_argument("--figure", default=None, help="write the cost curves to this PNG")
    parser.add_argument(
        "--against-torch", action="store_true", help="our multi-head paths vs nn.MultiheadAttention"
    )
    return parser.parse_args()


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def time_fwd_bwd(
    steps: Dict[str, Callable[[], torch.Tensor]], device: str, warmup: int, repeats: int
) -> Dict[str, float]:
    """Median milliseconds of ``step().backward()`` for every step, after ``warmup`` runs.

    The implementations take turns (one run of each per round) so that a slow phase of a shared
    machine hits all of them alike instead of whichever happened to be running.
    """
    times: Dict[str, List[float]] = {name: [] for name in steps}
    for i in range(warmup + repeats):
        for name, step in steps.items():
            synchronize(device)
            start = time.perf_counter()
            step().backward()
            synchronize(device)
            if i >= warmup:
                times[name].append((time.perf_counter() - start) * 1000.0)
    return {name: statistics.median(values) for name, values in times.items()}


def saved_bytes(step: Callable[[], torch.Tensor]) -> int:
    """Bytes of the tensors the forward pass of ``step`` saves for the backward pass (each storage
    once): the activation memory, on any device."""
    storages: Dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        loss = step()
    loss.backward()
    return sum(storages.values())


def peak_bytes(step: Callable[[], torch.Tensor], device: str) -> Optional[int]:
    """The peak memory allocated by a forward+backward on CUDA (None elsewhere)."""
    if device != "cuda":
        return None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    step().backward()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base


def function_modules(dim: int, heads: int) -> Dict[str, nn.Module]:
    return {
        "additive": AdditiveAttention(dim, dim, dim),
        "general": GeneralAttention(dim, dim),
        "scaled_dot": ScaledDotAttention(dim, dim, dim),
        "multihead": MultiHeadAttention(dim, heads),
        "multihead weights": MultiHeadAttention(dim, heads),
        "multihead additive": MultiHeadAttention(dim, heads, score="additive"),
    }


def self_attention_input(batch: int, dim: int, length: int, device: str):
    """``x`` ``(B, L, D)`` and a key padding mask ``(B, 1, 1, L)`` (the first sentence full length)."""
    torch.manual_seed(0)
    x = torch.randn(batch, length, dim, device=device, requires_grad=True)  # (B, L, D)
    lengths = torch.randint(max(1, length // 2), length + 1, (batch,), device=device)  # (B,)
    lengths[0] = length
    return x, torch.arange(length, device=device) < lengths.unsqueeze(
        1
    )  # (B, L, D), (B, L) True at real positions


def function_steps(
    modules: Dict[str, nn.Module], batch: int, dim: int, length: int, device: str, names: List[str]
) -> Dict[str, Callable[[], torch.Tensor]]:
    x, padding = self_attention_input(batch, dim, length, device)
    mask = key_mask(padding)  # (B, 1, 1, L)
    steps = {}
    for name in names:
        module, weights = modules[name].to(device), name == "multihead weights"
        steps[name] = lambda module=module, weights=weights: module(x, x, x, mask, need_weights=weights)[
            0
        ].sum()
    return steps


def bench_functions(args: argparse.Namespace, device: str, dim: int) -> List[Dict]:
    """Every function at every length: milliseconds, saved MiB (and the CUDA peak)."""
    modules = function_modules(dim, args.heads)
    rows: List[Dict] = []
    last_saved: Dict[str, tuple] = {}  # name -> (length, bytes) of its last measured case
    for length in args.lengths:
        names = []
        for name in FUNCTIONS:
            if name in last_saved:
                seen_length, seen = last_saved[name]
                expected = seen * (length / seen_length) ** 2
                if expected > args.max_gib * 2**30:
                    rows.append(
                        {"device": device, "dim": dim, "length": length, "name": name, "skipped": expected}
                    )
                    continue
            names.append(name)
        steps = function_steps(modules, args.batch, dim, length, device, names)
        saved = {name: saved_bytes(step) for name, step in steps.items()}
        peaks = {name: peak_bytes(step, device) for name, step in steps.items()}
        repeats = args.repeats or default_repeats(args.batch, dim, length)
        times = time_fwd_bwd(steps, device, args.warmup, repeats)
        for name in names:
            last_saved[name] = (length, saved[name])
            rows.append(
                {
                    "device": device,
                    "dim": dim,
                    "length": length,
                    "name": name,
                    "ms": times[name],
                    "saved": saved[name],
                    "peak": peaks[name],
                }
            )
        print(f"done {device} D={dim} L={length} ({repeats} runs)", file=sys.stderr, flush=True)
    return rows


def power_law(lengths: List[int], values: List[float]) -> Optional[float]:
    """The exponent ``p`` of ``value ~ L^p``: the least-squares slope of log value on log L."""
    if len(lengths) < 2:
        return None
    xs, ys = [math.log(n) for n in lengths], [math.log(v) for v in values]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)


def growth(rows: List[Dict], name: str, key: str) -> Dict[str, Optional[float]]:
    """How ``key`` grows for function ``name``: the fitted exponent over L >= FIT_FROM (all lengths
    when fewer than two are that long) and the ratio of the last doubling measured."""
    measured = [r for r in rows if r["name"] == name and "ms" in r]
    long = [r for r in measured if r["length"] >= FIT_FROM]
    fitted = long if len(long) >= 2 else measured
    exponent = power_law([r["length"] for r in fitted], [r[key] for r in fitted])
    doubling = None
    if len(measured) >= 2 and measured[-1]["length"] == 2 * measured[-2]["length"]:
        doubling = measured[-1][key] / measured[-2][key]
    return {"exponent": exponent, "doubling": doubling, "from": fitted[0]["length"] if fitted else None}


def functions_table(rows: List[Dict]) -> str:
    lines = [
        "| device | D | L | function | ms (fwd+bwd) | saved for backward (MiB) | CUDA peak (MiB) |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        head = f"| {r['device']} | {r['dim']} | {r['length']} | {r['name']} |"
        if "skipped" in r:
            lines.append(f"{head} skipped: would hold about {r['skipped'] / 2**30:.0f} GiB | – | – |")
            continue
        peak = f"{r['peak'] / 2**20:.1f}" if r["peak"] is not None else "–"
        lines.append(f"{head} {r['ms']:.2f} | {r['saved'] / 2**20:.1f} | {peak} |")
    return "\n".join(lines)


def fmt(value: Optional[float], spec: str) -> str:
    return "–" if value is None else format(value, spec)


def growth_table(rows: List[Dict]) -> str:
    lines = [
        "| device | D | function | time ~ L^p | last doubling | memory ~ L^p | last doubling "
        "| textbook time | textbook memory |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for device, dim in dict.fromkeys((r["device"], r["dim"]) for r in rows):
        part = [r for r in rows if r["device"] == device and r["dim"] == dim]
        for name in FUNCTIONS:
            if not any(r["name"] == name and "ms" in r for r in part):
                continue
            t, m = growth(part, name, "ms"), growth(part, name, "saved")
            lines.append(
                f"| {device} | {dim} | {name} | {fmt(t['exponent'], '.2f')} (L >= {t['from']}) | "
                f"{fmt(t['doubling'], '.2f')}x | {fmt(m['exponent'], '.2f')} | {fmt(m['doubling'], '.2f')}x | "
                f"{TEXTBOOK[name][0]} | {TEXTBOOK[name][1]} |"
            )
    return "\n".join(lines)


def write_figure(rows: List[Dict], path: str) -> None:
    """Time and saved memory against length, log-log, one line per function (the first device and
    size measured), with dotted ``L`` and ``L^2`` guides."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    device, dim = rows[0]["device"], rows[0]["dim"]
    part = [r for r in rows if r["device"] == device and r["dim"] == dim and "ms" in r]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, key, label in (
        (axes[0], "ms", "forward+backward (ms)"),
        (axes[1], "saved", "held for backward (MiB)"),
    ):
        scale = 1.0 if key == "ms" else 2.0**-20
        for name in FUNCTIONS:
            points = [r for r in part if r["name"] == name]
            if points:
                ax.plot(
                    [r["length"] for r in points], [r[key] * scale for r in points], marker="o", label=name
                )
        lengths = sorted({r["length"] for r in part})
        top = max(r[key] * scale for r in part)
        for power, style in ((1, ":"), (2, "--")):
            guide = [top * (n / lengths[-1]) ** power for n in lengths]
            ax.plot(lengths, guide, style, color="grey", linewidth=1, label=f"~ L^{power}")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("length L (T = S)")
        ax.set_ylabel(label)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"Attention functions as sentences grow: {device}, d_model {dim}, batch {rows[0]['batch']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}", file=sys.stderr)


# ----- ours against PyTorch's multi-head attention -----
def copy_into_torch_mha(ours: MultiHeadAttention, theirs: nn.MultiheadAttention) -> None:
    with torch.no_grad():
        theirs.in_proj_weight.copy_(torch.cat([ours.q_proj.weight, ours.k_proj.weight, ours.v_proj.weight]))
        theirs.in_proj_bias.copy_(torch.cat([ours.q_proj.bias, ours.k_proj.bias, ours.v_proj.bias]))
        theirs.out_proj.weight.copy_(ours.out_proj.weight)
        theirs.out_proj.bias.copy_(ours.out_proj.bias)


def torch_case(
    batch: int, dim: int, heads: int, length: int, device: str, warmup: int, repeats: int
) -> Dict[str, float]:
    x, padding = self_attention_input(batch, dim, length, device)
    ours = MultiHeadAttention(dim, heads).to(device)
    theirs = nn.MultiheadAttention(dim, heads, batch_first=True).to(device)
    copy_into_torch_mha(ours, theirs)
    mask = key_mask(padding)  # (B, 1, 1, S)
    qkv = torch.randn(3, batch, heads, length, dim // heads, device=device, requires_grad=True)
    cases = {
        "ours fused": lambda: ours(x, x, x, mask=mask)[0].sum(),
        "ours explicit": lambda: ours(x, x, x, mask=mask, need_weights=True)[0].sum(),
        "nn.MHA": lambda: theirs(x, x, x, key_padding_mask=~padding, need_weights=False)[0].sum(),
        "nn.MHA weights": lambda: theirs(
            x, x, x, key_padding_mask=~padding, need_weights=True, average_attn_weights=False
        )[0].sum(),
        "bare SDPA": lambda: nn.functional.scaled_dot_product_attention(
            qkv[0], qkv[1], qkv[2], attn_mask=mask
        ).sum(),
    }
    return time_fwd_bwd(cases, device, warmup, repeats)


def torch_table(rows: List[Dict]) -> str:
    names = ["ours fused", "ours explicit", "nn.MHA", "nn.MHA weights", "bare SDPA"]
    header = (
        "| device | D | L | "
        + " | ".join(f"{n} (ms)" for n in names)
        + " | fused / nn.MHA | explicit / nn.MHA |"
    )
    lines = [header, "|" + " --- |" * (len(names) + 5)]
    for row in rows:
        t = row["times"]
        cells = " | ".join(f"{t[n]:.2f}" for n in names)
        lines.append(
            f"| {row['device']} | {row['dim']} | {row['length']} | {cells} | "
            f"{t['ours fused'] / t['nn.MHA']:.2f}x | {t['ours explicit'] / t['nn.MHA']:.2f}x |"
        )
    return "\n".join(lines)


def default_repeats(batch: int, dim: int, length: int) -> int:
    work = batch * dim * length * max(length, 64)
    return max(3, min(40, int(6e9 / work)))


def main() -> None:
    args = parse_args()
    torch_mode = args.against_torch
    args.batch = args.batch or (32 if torch_mode else 4)
    args.dims = args.dims or ([256, 512] if torch_mode else [256])
    args.heads = args.heads or (8 if torch_mode else 4)
    args.lengths = args.lengths or ([16, 64, 256, 1024] if torch_mode else [16 * 2**i for i in range(7)])
    if args.threads:
        torch.set_num_threads(args.threads)
    devices = args.devices or (["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"])
    machine = f"torch {torch.__version__}, {torch.get_num_threads()} threads, {platform.processor() or platform.machine()}"
    if torch_mode:
        rows = []
        for device in devices:
            for dim in args.dims:
                for length in args.lengths:
                    repeats = args.repeats or default_repeats(args.batch, dim, length)
                    times = torch_case(args.batch, dim, args.heads, length, device, args.warmup, repeats)
                    rows.append({"device": device, "dim": dim, "length": length, "times": times})
                    print(f"done {device} D={dim} L={length} ({repeats} runs)", file=sys.stderr, flush=True)
        what = "self-attention with a key padding mask, forward+backward, median ms"
        print(f"B={args.batch}, H={args.heads}, {what}; {machine}")
        print()
        print(torch_table(rows))
        return
    rows = [row for device in devices for dim in args.dims for row in bench_functions(args, device, dim)]
    for row in rows:
        row["batch"] = args.batch
    print(
        f"B={args.batch}, H={args.heads} (multi-head), self-attention over L positions with a key padding mask, "
        f"forward+backward, median ms; {machine}"
    )
    print()
    print(functions_table(rows))
    print()
    print(f"How each grows with L (fitted over L >= {FIT_FROM} where measured):")
    print()
    print(growth_table(rows))
    if args.figure:
        write_figure(rows, args.figure)


if __name__ == "__main__":
    main()
