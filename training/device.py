"""Where and how the model runs: the torch device, CPU threads and mixed precision."""

import os
from contextlib import nullcontext
from functools import partial
from typing import Callable, ContextManager, Optional

import torch


def pick_device(name: str, local_rank: int = 0) -> torch.device:
    """``auto`` (CUDA when there is one, else the CPU) or a torch device name such as ``cpu``, ``cuda:1``.
    Under torchrun, ``auto`` and ``cuda`` mean this process's GPU, ``cuda:<LOCAL_RANK>``."""
    if name in ("auto", "cuda") and torch.cuda.is_available():
        device = torch.device("cuda", local_rank if local_rank < torch.cuda.device_count() else 0)
        torch.cuda.set_device(device)
        return device
    if name == "auto":
        return torch.device("cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ValueError(f"device {name!r} is not a torch device: use auto, cpu, cuda or cuda:N") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name} asked for, but no CUDA device is available: use auto or cpu")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise ValueError(f"device {name} asked for, but there are {torch.cuda.device_count()} CUDA devices")
    return device


def set_threads(device: torch.device, num_threads: Optional[int] = None) -> None:
    """CPU threads: ``num_threads``, else the cores this process may use, shared by the ranks on
    this machine (``LOCAL_WORLD_SIZE`` under torchrun)."""
    if device.type != "cpu":
        return
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    torch.set_num_threads(num_threads or max(1, cores // int(os.environ.get("LOCAL_WORLD_SIZE", 1))))


def autocast_for(device: torch.device, amp: bool) -> Callable[[], ContextManager]:
    """A factory of the autocast context of a forward pass: bf16 on CUDA when ``amp``, else none."""
    if device.type == "cuda" and amp:
        return partial(torch.autocast, device_type="cuda", dtype=torch.bfloat16)
    return nullcontext
