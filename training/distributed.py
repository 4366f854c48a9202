"""Data-parallel training under ``torchrun``: the process group and the few collectives the
trainer needs. A process started without torchrun (no ``WORLD_SIZE`` in its environment, or 1)
is a world of one: every helper here is then a no-op, and nothing needs torch.distributed.

Rank 0 is the main process: it alone writes the run folder (TensorBoard, checkpoints,
``results.json``, ``.hydra/``, the log file) and evaluates. Every decision that ends or pauses
training (a stop signal, early stopping, a limit, too many non-finite steps) is agreed by all
ranks at the same step, so no rank waits for a collective the others never reach.
"""

import datetime
import os
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any, Iterator, List, Optional, Tuple, Union

import torch
import torch.distributed as dist
from torch import Tensor

TIMEOUT_MINUTES = 30  # a collective that waits longer (a rank died or hangs) fails instead of hanging


@dataclass(frozen=True)
class World:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1  # the ranks on this machine

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def main(self) -> bool:
        return self.rank == 0


def export_job_ranks() -> None:
    """In a submitit job of several tasks (Hydra's submitit launcher, SLURM or local) or a SLURM
    job of several tasks (``srun python train.py``), started without torchrun: set torchrun's
    variables from the job's with submitit's ``TorchDistributedEnvironment``, so that the rest is
    the torchrun path."""
    if "RANK" in os.environ:
        return
    if "SUBMITIT_EXECUTOR" not in os.environ and int(os.environ.get("SLURM_NTASKS", 1)) <= 1:
        return
    try:
        from submitit.helpers import TorchDistributedEnvironment
    except ImportError:
        raise RuntimeError(
            "a SLURM job of several tasks needs submitit (pip install hydra-submitit-launcher), "
            "or one task per node that starts torchrun"
        ) from None
    job = TorchDistributedEnvironment()
    if job.world_size > 1:
        job.export()  # narrows CUDA_VISIBLE_DEVICES to the task's GPU: pick_device takes it


def world_from_env() -> World:
    """The ranks torchrun set in the environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
    ``LOCAL_WORLD_SIZE``)."""
    return World(
        int(os.environ.get("RANK", 0)),
        int(os.environ.get("WORLD_SIZE", 1)),
        int(os.environ.get("LOCAL_RANK", 0)),
        int(os.environ.get("LOCAL_WORLD_SIZE", 1)),
    )


def init(world: World, device: torch.device) -> None:
    """Join the process group: NCCL on CUDA, gloo on the CPU (torchrun's rendezvous variables)."""
    if not world.distributed or dist.is_initialized():
        return
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(
        backend,
        timeout=datetime.timedelta(minutes=TIMEOUT_MINUTES),
        device_id=device if device.type == "cuda" else None,
    )


def active() -> bool:
    return dist.is_available() and dist.is_initialized()


@contextmanager
def main_first(world: World) -> Iterator[None]:
    """Rank 0 runs the block first (it may write caches, such as the token store); then the first
    rank of each other machine (a cache folder local to each machine is written there once); then
    all the others, which find what those wrote."""
    if not world.distributed:
        yield
        return
    first, machine_first = world.main, world.local_rank == 0 and not world.main
    if not first:
        dist.barrier()  # rank 0 is done
    if not first and not machine_first:
        dist.barrier()  # the first rank of every machine is done
    yield
    if first:
        dist.barrier()
    if first or machine_first:
        dist.barrier()


def wrap(model: torch.nn.Module, world: World, device: torch.device) -> torch.nn.Module:
    """``model`` in DistributedDataParallel when there are several ranks, else itself."""
    if not world.distributed:
        return model
    from torch.nn.parallel import DistributedDataParallel

    # The loss multiplies by the output layer's weight outside this module's forward (training/step.py):
    # an untied weight is not in the forward's graph, which DDP's defaults allow (every parameter
    # gets its gradient in the backward); find_unused_parameters or static_graph would not.
    return DistributedDataParallel(model, device_ids=[device] if device.type == "cuda" else None)


def no_sync(module: torch.nn.Module, last: bool):
    """Inside gradient accumulation, skip DDP's all-reduce for every micro-batch but the last."""
    if last or not hasattr(module, "no_sync"):
        return nullcontext()
    return module.no_sync()


def close() -> None:
    if active():
        dist.destroy_process_group()


def total_on_device(value: Union[int, Tensor], device: torch.device) -> Union[int, Tensor]:
    """The sum of ``value`` (a count or a device scalar) over the ranks, left on the device: no
    rank waits for it until it is read. Without a process group, ``value`` itself."""
    if not active():
        return value
    tensor = (
        value.clone()
        if isinstance(value, Tensor)
        else torch.full((), value, dtype=torch.float32, device=device)
    )
    dist.all_reduce(tensor)
    return tensor


def gather(value: Any, device: torch.device) -> List[Any]:
    """Every rank's ``value`` (a picklable object), in rank order, on every rank."""
    if not active():
        return [value]
    found: List[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(found, value)
    return found


def broadcast(value: Any, device: torch.device) -> Any:
    """Rank 0's ``value`` on every rank (a picklable object: a path, a reason to stop)."""
    if not active():
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0, device=device if device.type == "cuda" else None)
    return box[0]


def agree_to_stop(signum: Optional[int], stopping: bool, device: torch.device) -> Tuple[Optional[int], bool]:
    """One all-reduce (max) of the control flags of a step: a stop signal any rank received (the
    highest number), and whether a rank (rank 0, which holds the scores and the limits) stops."""
    if not active():
        return signum, stopping
    tensor = torch.tensor([signum or 0, int(stopping)], dtype=torch.int64, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    signal_max, stop = tensor.tolist()  # one read of the device
    return signal_max or None, bool(stop)
