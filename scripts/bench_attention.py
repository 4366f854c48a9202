"""Benchmark forward+backward time of multi-head attention implementations.

Compares, on the same self-attention problem (a key padding mask, dropout 0):

- ``ours fused``: ``models.attention.MultiHeadAttention`` (the ``F.scaled_dot_product_attention`` path);
- ``ours explicit``: the same module with ``need_weights=True`` (softmax written out, weights returned);
- ``nn.MHA``: ``torch.nn.MultiheadAttention(batch_first=True)`` with ``need_weights=False``;
- ``nn.MHA weights``: the same with ``need_weights=True, average_attn_weights=False`` (for reference);
- ``bare SDPA``: ``F.scaled_dot_product_attention`` alone on pre-split heads (no projections).

Prints a Markdown table of median milliseconds per forward+backward and the ratios of our paths to
``nn.MHA`` (the targets: fused <= 1.10x, explicit <= 1.6x on CPU).

    python scripts/bench_attention.py                      # full grid, CPU (and CUDA when present)
    python scripts/bench_attention.py --lengths 16 64 --dims 256 --repeats 5
"""

import argparse
import platform
import statistics
import sys
import time
from typing import Callable, Dict, List

import torch
from torch import nn

from models.attention import MultiHeadAttention
from models.masks import key_mask, padding_mask_from_lengths


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--dims", type=int, nargs="+", default=[256, 512])
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--lengths", type=int, nargs="+", default=[16, 64, 256, 1024])
    parser.add_argument("--devices", nargs="+", default=None, help="default: cpu, plus cuda when present")
    parser.add_argument("--repeats", type=int, default=None, help="timed runs per case (default: by size)")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
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


def copy_into_torch_mha(ours: MultiHeadAttention, theirs: nn.MultiheadAttention) -> None:
    with torch.no_grad():
        theirs.in_proj_weight.copy_(torch.cat([ours.q_proj.weight, ours.k_proj.weight, ours.v_proj.weight]))
        theirs.in_proj_bias.copy_(torch.cat([ours.q_proj.bias, ours.k_proj.bias, ours.v_proj.bias]))
        theirs.out_proj.weight.copy_(ours.out_proj.weight)
        theirs.out_proj.bias.copy_(ours.out_proj.bias)


def bench_case(
    batch: int, dim: int, heads: int, length: int, device: str, warmup: int, repeats: int
) -> Dict[str, float]:
    torch.manual_seed(0)
    x = torch.randn(batch, length, dim, device=device, requires_grad=True)  # (B, T, D)
    lengths = torch.randint(max(1, length // 2), length + 1, (batch,), device=device)  # (B,)
    lengths[0] = length
    padding = padding_mask_from_lengths(lengths, length)  # (B, S) True = real token
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


def default_repeats(batch: int, dim: int, length: int) -> int:
    work = batch * dim * length * max(length, 64)
    return max(5, min(40, int(6e9 / work)))


def markdown_table(rows: List[Dict]) -> str:
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


def main() -> None:
    args = parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    devices = args.devices or (["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"])
    rows = []
    for device in devices:
        for dim in args.dims:
            for length in args.lengths:
                repeats = args.repeats or default_repeats(args.batch, dim, length)
                times = bench_case(args.batch, dim, args.heads, length, device, args.warmup, repeats)
                rows.append({"device": device, "dim": dim, "length": length, "times": times})
                print(f"done {device} D={dim} L={length} ({repeats} runs)", file=sys.stderr, flush=True)
    print(
        f"B={args.batch}, H={args.heads}, self-attention with a key padding mask, forward+backward, median ms; "
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, {platform.processor() or platform.machine()}"
    )
    print()
    print(markdown_table(rows))


if __name__ == "__main__":
    main()
