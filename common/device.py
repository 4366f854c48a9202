"""Where and how the model runs: the torch device, CPU threads and numeric precision.

One precision rule serves training, validation, the test decoding and ``translate.py``: with
``amp`` the forward passes run under bf16 autocast (on CUDA, or on a CPU); otherwise in float32
(TF32 matrix products on CUDA when ``trainer.tf32``). ``trainer.amp=auto`` (``amp_choice``) takes
bf16 where the hardware computes in it: every CUDA device, and CPUs whose feature flags show native
bf16 (AVX-512 BF16, AMX, Arm's BF16); elsewhere bf16 is emulated and much slower than float32. A
checkpoint records the precision its run was validated in, and ``translate.py --dtype auto``
decodes in it where this machine runs it natively.
"""

import functools
import logging
import os
from contextlib import contextmanager, nullcontext
from functools import partial
from pathlib import Path
from typing import Any, Callable, ContextManager, Dict, Iterator, Optional, Set, Tuple

import torch

log = logging.getLogger(__name__)

DTYPES = ("auto", "float32", "bfloat16")  # translate.py --dtype, Translator(dtype=...)
PRECISIONS = ("float32", "tf32", "bfloat16")  # what forward passes run in (precision_name)
# CPU feature flags of native bf16 arithmetic: x86's AVX-512 BF16 and AMX's bf16 tiles
# (/proc/cpuinfo "flags"), Arm's FEAT_BF16 ("Features")
NATIVE_BF16 = ("avx512_bf16", "amx_bf16", "bf16")


def gpu_of_its_own() -> bool:
    """Whether a scheduler gave this process one GPU of its own: ``CUDA_VISIBLE_DEVICES`` names one
    device, as submitit and SLURM's ``--gpus-per-task`` set it per task. Not under torchrun, whose
    ranks all see the same ``CUDA_VISIBLE_DEVICES``: one device named there is one GPU for all."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").strip()
    return bool(visible) and "," not in visible and "TORCHELASTIC_RUN_ID" not in os.environ


@functools.lru_cache(maxsize=None)
def warn_once(message: str) -> None:
    """``message`` as a warning, once per process (the trainer and train.py both pick the device)."""
    log.warning("%s", message)


def cuda_index(local_rank: int, local_world_size: int, n_gpus: int, narrowed: bool) -> Optional[int]:
    """The GPU of local rank ``local_rank`` of ``local_world_size`` ranks on a machine that shows
    ``n_gpus``; None when the ranks cannot have one GPU each (NCCL refuses two ranks on one GPU).

    Each rank takes ``cuda:<local_rank>``; a process given one GPU of its own (``narrowed``:
    ``gpu_of_its_own``) takes it.
    """
    if n_gpus == 0:
        return None
    if n_gpus == 1 and narrowed:
        return 0
    if local_world_size > n_gpus or local_rank >= n_gpus:
        return None
    return local_rank


def attention_kernels(device: torch.device, cudnn: bool = False) -> None:
    """On CUDA, ``F.scaled_dot_product_attention`` may pick flash attention (no mask), memory-efficient
    attention (a mask) or the math path, and cuDNN's attention only with ``cudnn``
    (``trainer.cudnn_attention``): recent PyTorch tries cuDNN's first on Hopper GPUs, and it builds
    and compiles a graph for every new shape (hundreds of milliseconds), which batches of varying
    lengths and every decoding step (one key more) are. A process-wide setting, as TF32 is."""
    if device.type == "cuda":
        torch.backends.cuda.enable_cudnn_sdp(cudnn)


def pick_device(name: str, local_rank: int = 0, local_world_size: int = 1) -> torch.device:
    """``auto`` (CUDA when there is one, else the CPU) or a torch device name such as ``cpu``, ``cuda:1``;
    its attention kernels set (``attention_kernels``).

    Under torchrun, ``auto`` and ``cuda`` mean this process's GPU, ``cuda:<LOCAL_RANK>``. With more
    ranks on the machine than GPUs, ``auto`` trains every rank on the CPU (with a warning: all ranks
    must use one backend) and ``cuda`` is an error.
    """
    device = _device(name, local_rank, local_world_size)
    attention_kernels(device)
    return device


def _device(name: str, local_rank: int, local_world_size: int) -> torch.device:
    """``pick_device``'s choice."""
    if name in ("auto", "cuda") and torch.cuda.is_available():
        n_gpus = torch.cuda.device_count()
        index = cuda_index(local_rank, local_world_size, n_gpus, gpu_of_its_own())
        if index is not None:
            device = torch.device("cuda", index)
            torch.cuda.set_device(device)
            return device
        if name == "cuda":
            raise ValueError(
                f"device=cuda with {local_world_size} ranks on this machine but {n_gpus} GPU(s): start at most "
                f"{n_gpus} ranks per machine (torchrun --nproc-per-node={n_gpus}) or use device=cpu"
            )
        if local_rank == 0:
            warn_once(
                f"{local_world_size} ranks on this machine but {n_gpus} GPU(s): device=auto trains every "
                f"rank on the CPU (start --nproc-per-node={n_gpus} for the GPUs)"
            )
        return torch.device("cpu")
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


def cpu_flags(cpuinfo: str) -> Set[str]:
    """The feature flags of the first processor in the text of ``/proc/cpuinfo`` (x86's ``flags``
    line, Arm's ``Features``); empty when it has neither."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return set(value.split())
    return set()


@functools.lru_cache(maxsize=None)
def native_bf16() -> Tuple[str, ...]:
    """This machine's CPU flags of native bf16 (``NATIVE_BF16``); none where ``/proc/cpuinfo``
    cannot be read (not Linux): such a CPU trains in float32 under ``trainer.amp=auto``."""
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return ()
    return tuple(sorted(cpu_flags(text) & set(NATIVE_BF16)))


def amp_choice(amp: str, device: torch.device, bf16_flags: Tuple[str, ...]) -> Tuple[bool, str]:
    """Whether the forward passes run under bf16 autocast for ``trainer.amp`` (auto, true, false) on
    ``device``, given the CPU's native bf16 flags (``native_bf16``), and the reason, said once in
    ``train.log``. ``auto``: bf16 on CUDA and on a CPU with native bf16, float32 elsewhere (on a CPU
    without it bf16 is emulated: a Transformer's step measured 23x slower on an AVX2 machine);
    ``true``: bf16 on either; ``false``: never."""
    if amp == "false" or device.type not in ("cuda", "cpu"):
        return False, f"trainer.amp={amp}: float32"
    if device.type == "cuda":
        return True, f"trainer.amp={amp}: bf16 autocast on CUDA"
    if bf16_flags:
        return True, f"trainer.amp={amp}: bf16 autocast, this CPU computes in bf16 ({', '.join(bf16_flags)})"
    if amp == "true":
        return True, (
            "trainer.amp=true: bf16 autocast on a CPU without native bf16 (no avx512_bf16 or amx_bf16 flag), "
            "emulated and much slower than float32; trainer.amp=auto trains in float32 here"
        )
    return False, "trainer.amp=auto: float32, this CPU has no native bf16 (no avx512_bf16 or amx_bf16 flag)"


def precision_name(device: torch.device, amp: bool, tf32: bool) -> str:
    """The precision forward passes run in: ``bfloat16`` (autocast, on CUDA or a CPU), ``tf32``
    (float32 tensors, TF32 matrix products: CUDA only) or ``float32``."""
    if device.type == "cpu":
        return "bfloat16" if amp else "float32"
    if device.type != "cuda":
        return "float32"
    return "bfloat16" if amp else "tf32" if tf32 else "float32"


def precision_flags(precision: str) -> Dict[str, bool]:
    """``amp`` and ``tf32`` of a precision name of ``precision_name``."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision {precision!r}: one of {', '.join(PRECISIONS)}")
    return {"amp": precision == "bfloat16", "tf32": precision == "tf32"}


def run_precision(payload: Dict[str, Any]) -> Dict[str, bool]:
    """``amp`` and ``tf32`` of the forward passes that scored a checkpoint's run: its
    ``precision`` (where and how it was trained: a run trained on the CPU is float32 whatever its
    ``trainer.amp``), else, for a checkpoint without one, its config's ``trainer.amp`` and
    ``trainer.tf32`` (absent: off)."""
    if "precision" in payload:
        return precision_flags(payload["precision"])
    trainer = (payload.get("config") or {}).get("trainer") or {}
    return {"amp": trainer.get("amp") is True, "tf32": bool(trainer.get("tf32", False))}


def decode_precision(
    dtype: Optional[str], payload: Dict[str, Any], device: torch.device, bf16_flags: Tuple[str, ...] = ()
) -> Dict[str, bool]:
    """``amp`` and ``tf32`` of decoding a checkpoint ``payload`` on ``device`` with ``dtype``
    (``DTYPES``; None or ``auto``: as its run was validated and tested, so that ``translate.py`` and
    ``results.json`` agree, except that a run validated in bf16 decodes in float32 on a CPU without
    native bf16, ``bf16_flags`` empty: emulated bf16 would be many times slower)."""
    if dtype in (None, "auto"):
        flags = run_precision(payload)
        if device.type == "cpu" and not bf16_flags:
            flags["amp"] = False
        return flags
    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r}: choose one of {', '.join(DTYPES)}")
    return {"amp": dtype == "bfloat16", "tf32": False}


def set_tf32(tf32: bool) -> None:
    """TF32 for this process's CUDA matrix products and cuDNN convolutions and RNNs (or not)."""
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32


@contextmanager
def tf32_only_inside(tf32: bool) -> Iterator[None]:
    """``set_tf32(tf32)`` while inside, the process's own setting back afterwards."""
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    set_tf32(tf32)
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


def autocast_for(device: torch.device, amp: bool) -> Callable[[], ContextManager]:
    """A factory of the autocast context of a forward pass: bf16 on CUDA or a CPU when ``amp``, else none."""
    if amp and device.type in ("cuda", "cpu"):
        return partial(torch.autocast, device_type=device.type, dtype=torch.bfloat16)
    return nullcontext


def use_precision(device: torch.device, amp: bool, tf32: bool) -> Callable[[], ContextManager]:
    """The factory of a forward pass's precision context on ``device`` for code that shares its
    process (the Translator): ``autocast_for``, with TF32 as ``tf32`` inside and the process's own
    setting back after (a training sets its TF32 once, ``set_tf32``). On a CPU: ``autocast_for``."""
    autocast = autocast_for(device, amp)
    if device.type != "cuda":
        return autocast

    @contextmanager
    def scope() -> Iterator[None]:
        with tf32_only_inside(tf32), autocast():
            yield

    return scope
