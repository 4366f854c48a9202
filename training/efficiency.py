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
  the host launching work, or waiting.
"""

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


def peak_tflops(device_name: str, precision: str) -> Optional[float]:
    """The dense peak of a GPU named ``device_name`` in ``precision`` (``common.device.PRECISIONS``),
    None when it is not in ``PEAK_TFLOPS``."""
    for part, peaks in PEAK_TFLOPS:
        if part in device_name:
            return peaks.get(precision)
    return None


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
    with FlopCounterMode(display=False) as counter, math, torch.backends.cudnn.flags(enabled=False):
        for batch in batches:
            accumulate_gradients(model, [batch], tc, world, device, autocast)
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
