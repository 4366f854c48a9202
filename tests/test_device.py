"""Where the model runs (training/device.py): one GPU per rank or none, and one precision rule for
training, the test decoding and translate.py."""

import pytest
import torch

from training.device import (
    cuda_index,
    decode_precision,
    pick_device,
    precision_name,
    run_precision,
    use_precision,
)


def test_each_local_rank_takes_its_own_gpu():
    assert [cuda_index(rank, 4, 4, narrowed=False) for rank in range(4)] == [0, 1, 2, 3]
    assert [cuda_index(rank, 2, 8, narrowed=False) for rank in range(2)] == [0, 1]
    assert cuda_index(0, 1, 1, narrowed=False) == 0


def test_more_ranks_than_gpus_gives_no_rank_a_gpu():
    # two ranks on one GPU would both land on cuda:0, which NCCL refuses: no rank takes one
    assert [cuda_index(rank, 2, 1, narrowed=False) for rank in range(2)] == [None, None]
    assert [cuda_index(rank, 4, 2, narrowed=False) for rank in range(4)] == [None] * 4
    assert cuda_index(0, 1, 0, narrowed=False) is None


def test_a_task_shown_one_gpu_of_its_own_takes_it():
    # submitit / SLURM --gpus-per-task: CUDA_VISIBLE_DEVICES names one GPU, another for each task
    assert [cuda_index(rank, 4, 1, narrowed=True) for rank in range(4)] == [0, 0, 0, 0]


def test_without_cuda_auto_is_the_cpu_and_cuda_an_error():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert pick_device("auto", local_rank=1, local_world_size=2) == torch.device("cpu")
    with pytest.raises(ValueError, match="no CUDA device is available"):
        pick_device("cuda")
    with pytest.raises(ValueError, match="not a torch device"):
        pick_device("gpu0")


def test_the_precision_rule():
    cuda, cpu = torch.device("cuda", 0), torch.device("cpu")
    assert precision_name(cuda, amp=True, tf32=True) == "bfloat16"
    assert precision_name(cuda, amp=False, tf32=True) == "tf32"
    assert precision_name(cuda, amp=False, tf32=False) == "float32"
    assert precision_name(cpu, amp=True, tf32=True) == "float32"  # the CPU trains and decodes in float32
    assert use_precision(cpu, amp=True, tf32=True) is not None
    with use_precision(cpu, amp=True, tf32=True)():
        assert not torch.is_autocast_enabled("cpu")


def test_translation_decodes_as_the_run_was_tested_unless_told_otherwise():
    amp_run = {"trainer": {"amp": True, "tf32": True}}
    assert decode_precision(None, amp_run) == {"amp": True, "tf32": True}
    assert decode_precision("auto", amp_run) == run_precision(amp_run)
    assert decode_precision("float32", amp_run) == {"amp": False, "tf32": False}
    assert decode_precision("bfloat16", {"trainer": {"amp": False, "tf32": False}}) == {
        "amp": True,
        "tf32": False,
    }
    # a run from before trainer.tf32 ran its products in full float32
    assert run_precision({"trainer": {"amp": False}}) == {"amp": False, "tf32": False}
    assert run_precision({}) == {"amp": False, "tf32": False}
    with pytest.raises(ValueError, match="float16"):
        decode_precision("float16", amp_run)
