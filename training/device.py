"""Which torch device to run on."""
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
