"""Which torch device to run on."""
import torch


def pick_device(name: str) -> torch.device:
    """``auto`` (CUDA when there is one, else the CPU) or a torch device name such as ``cpu``, ``cuda:1``."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ValueError(f"device {name!r} is not a torch device: use auto, cpu, cuda or cuda:N") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name} asked for, but no CUDA device is available: use auto or cpu")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise ValueError(f"device {name} asked for, but there are {torch.cuda.device_count()} CUDA devices")
    return device
