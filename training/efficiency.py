"""How well a training step uses its device: the model FLOPs of a step, the device's peak, the
model FLOP utilisation (MFU) and where a step's time goes (a profile's split).

- **FLOPs** are counted, not estimated: ``torch.utils.flop_counter.FlopCounterMode`` adds up the
  matrix products of a forward and backward pass (linear layers, attention's ``Q K^T`` and
  ``weights V``, the recurrences, the output projection) on real batches, two FLOPs per
  multiply-add; the backward pass costs twice the forward. Elementwise work (softmax, layer norm,
  the optimizer) is not counted, as MFU is usually defined. Padding positions are computed, so
  they count.
- **MFU** = the model FLOPs a second / the device's dense peak in the precision the matrix products
  run in (``PEAK_TFLOPS``: NVIDIA's data sheets, without sparsity). None where the peak is unknown
  (the CPU).
- **The split** sorts the GPU kernels of profiled steps into matrix products, attention and the
  rest (elementwise, reductions, copies) by their names, and calls the time no kernel ran idle:
  the host launching work, or waiting. On a CPU (``cpu_profile``) the operators themselves are
  sorted: each one's own time (its children's apart) goes to the optimizer when it runs inside
  ``Optimizer.step``, to attention inside a fused attention, to matrix products for ``mm`` and its
  kin, else to the other operators; what no operator covers is the host's own work (Python, the
  loop). There is no peak to divide by on a CPU: the model's FLOP/s are set beside the matrix
  products' own rate on the machine, measured in the same profile (their FLOPs over their time),
  the rate of a step that did nothing but its matrix products.
"""

import time
from typing import Callable, ContextManager, Dict, Iterable, List, Optional, Sequence, Tuple

import torch
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from data.batching import Batch
from training.config import TrainerConfig
from training.distributed import World
from training.step import accumulate_gradients

# Dense TFLOP/s of a GPU by (a part of its name as torch reports it, the precision of its matrix
# products); the first match wins, so longer names come first.
PEAK_TFLOPS: Tuple[Tuple[str, Dict[str, float]], ...] = (
    ("H100 PCIe", {"bfloat16": 756.5, "tf32": 378.0, "float32": 51.2}),
    ("H100 NVL", {"bfloat16": 835.5, "tf32": 417.5, "float32": 60.0}),
    ("H100", {"bfloat16": 989.4, "tf32": 494.7, "float32": 66.9}),  # SXM5 (80GB HBM3)
    ("H200 NVL", {}),  # not in this table: no MFU rather than another card's
    ("H200", {"bfloat16": 989.4, "tf32": 494.7, "float32": 66.9}),
    ("A100", {"bfloat16": 312.0, "tf32": 156.0, "float32": 19.5}),
)

# kernel name parts of each kind, matched in lower case; attention first (its kernels hold "gemm"
# in their names too)
KERNEL_KINDS = (
    ("attention", ("flash", "fmha", "attention", "sdpa", "softmax_warp")),
    ("matrix products", ("gemm", "cutlass", "xmma", "cublas", "wgmma", "nvjet", "matmul")),
)
KINDS = ("matrix products", "attention", "elementwise and other", "idle")
# a CPU step's time, by where it went (cpu_profile); the first three as KINDS
CPU_KINDS = ("matrix products", "attention", "other operators", "optimizer", "outside operators")
MATRIX_OPS = frozenset(
    {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::addbmm", "aten::_addmm_activation"}
)


def peak_tflops(device_name: str, precision: str) -> Optional[float]:
    """The dense peak of a GPU named ``device_name`` in ``precision`` (``common.device.PRECISIONS``),
    None when it is not in ``PEAK_TFLOPS``."""
    for part, peaks in PEAK_TFLOPS:
        if part in device_name:
            return peaks.get(precision)
    return None


def addmm_flops(_sum_shape, a_shape, b_shape, out_shape=None, **_) -> int:
    """The FLOPs of ``addmm_`` (``(n, k) @ (k, m)`` added in place), which ``FlopCounterMode``'s own
    table leaves out: the loss sums the output weight's gradient with it (``training/step.py``)."""
    return 2 * a_shape[0] * a_shape[1] * b_shape[1]


def step_flops(
    model: nn.Module,
    batches: Sequence[Batch],
    tc: TrainerConfig,
    world: World,
    device: torch.device,
    autocast: Callable[[], ContextManager],
) -> int:
    """The FLOPs of a forward and backward pass over each of ``batches``, added up (the gradients
    are dropped after: nothing is learnt)."""
    # attention through the math path: its matrix products are counted on any device, and they
    # are the model's (a fused kernel's backward recomputes Q K^T, which is not); the RNNs without
    # cuDNN, whose fused recurrence the counter does not know (on the CPU they are matrix products)
    math = sdpa_kernel(SDPBackend.MATH)
    counter = FlopCounterMode(display=False, custom_mapping={torch.ops.aten.addmm_: addmm_flops})
    with counter, math, torch.backends.cudnn.flags(enabled=False):
        for batch in batches:
            accumulate_gradients(model, model.output_layer.proj.weight, [batch], tc, world, device, autocast)
    model.zero_grad(set_to_none=True)
    return int(counter.get_total_flops())


def mfu(flops_per_second: float, peak: Optional[float]) -> Optional[float]:
    """The model FLOP utilisation, ``flops_per_second`` over ``peak`` TFLOP/s (None without a peak)."""
    return None if not peak else flops_per_second / (peak * 1e12)


def kernel_kind(name: str) -> str:
    """The kind of a GPU kernel by its name (``KERNEL_KINDS``); else ``elementwise and other``."""
    lower = name.lower()
    for kind, parts in KERNEL_KINDS:
        if any(part in lower for part in parts):
            return kind
    return KINDS[2]


def busy_time(intervals: Iterable[Tuple[float, float]]) -> float:
    """The length of the union of ``(start, end)`` intervals (kernels of several streams may overlap)."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def split(kernels: Sequence[Tuple[str, float, float]], wall: float) -> Dict[str, float]:
    """The share of ``wall`` seconds of each of ``KINDS``, from ``kernels`` ``(name, start, end)`` in
    seconds: each kind's kernel time (overlapping kernels of one kind counted once each), idle the
    time no kernel ran. The kernel kinds' shares are scaled down together when overlaps make them
    add up to more than the busy time."""
    seconds = {kind: 0.0 for kind in KINDS}
    for name, start, end in kernels:
        seconds[kernel_kind(name)] += end - start
    busy = busy_time((start, end) for _, start, end in kernels)
    summed = sum(seconds.values())
    scale = busy / summed if summed > busy > 0 else 1.0
    shares = {kind: seconds[kind] * scale / wall for kind in KINDS[:3]}
    shares["idle"] = max(0.0, 1.0 - busy / wall)
    return shares


def profiled_kernels(run: Callable[[], None]) -> Tuple[List[Tuple[str, float, float]], float]:
    """The CUDA kernels of ``run()`` ``(name, start, end)`` in seconds and its wall time, by
    ``torch.profiler`` (the device is synchronised before and after)."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    # the device's kernels, not the ranges the profiler annotates them with (an optimizer step, a
    # compiled region), whose spans cover the gaps between kernels
    events = [
        e
        for e in prof.events()
        if e.device_type == torch.autograd.DeviceType.CUDA and not getattr(e, "is_user_annotation", False)
    ]
    kernels = [(e.name, e.time_range.start / 1e6, e.time_range.end / 1e6) for e in events]
    steps = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CPU]
    start = min((e.time_range.start for e in steps), default=0) / 1e6
    end = max((e.time_range.end for e in steps + events), default=0) / 1e6
    return kernels, max(end - start, 1e-9)


def cpu_kind(names: Sequence[str]) -> str:
    """The ``CPU_KINDS`` entry of an operator, from its own name and its callers' (``names``: itself
    first, then its parent, up to the outermost): the optimizer's and a fused attention's operators
    go to those, whatever they are."""
    if any(name.startswith("Optimizer.step") for name in names):
        return "optimizer"
    if any("scaled_dot_product" in name or "flash_attention" in name for name in names):
        return "attention"
    return "matrix products" if names[0] in MATRIX_OPS else "other operators"


def cpu_profile(run: Callable[[], None], steps: int) -> Dict[str, float]:
    """Where the wall time of ``run()`` (``steps`` training steps on a CPU) goes, by
    ``torch.profiler``: each of ``CPU_KINDS``' share, the profiled steps' own seconds
    (``seconds_per_step``), the outermost operators per step (``ops_per_step``) and the matrix
    products' own rate (``matmul_gflops``: their FLOPs over their time)."""
    from torch.profiler import ProfilerActivity, profile

    start = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU], with_flops=True) as prof:
        run()
    wall = time.perf_counter() - start
    seconds = dict.fromkeys(CPU_KINDS, 0.0)
    matmul_flops = matmul_seconds = 0.0
    top_level = 0
    for event in prof.events():
        names, parent = [event.name], event.cpu_parent
        while parent is not None:
            names.append(parent.name)
            parent = parent.cpu_parent
        kind = cpu_kind(names)
        own = event.self_cpu_time_total / 1e6
        seconds[kind] += own
        if kind == "matrix products":
            matmul_flops, matmul_seconds = matmul_flops + (event.flops or 0), matmul_seconds + own
        top_level += event.name.startswith("aten::") and not any(n.startswith("aten::") for n in names[1:])
    seconds["outside operators"] = max(0.0, wall - sum(seconds.values()))
    shares = {kind: value / wall for kind, value in seconds.items()}
    rate = matmul_flops / matmul_seconds if matmul_seconds else 0.0
    per_step = {"seconds_per_step": wall / steps, "ops_per_step": top_level / steps}
    return {**shares, **per_step, "matmul_gflops": rate / 1e9}
