"""Where the model runs (common/device.py): one GPU per rank or none, and one precision rule for
training, the test decoding and translate.py."""

from contextlib import nullcontext

import pytest
import torch

from common.device import (
    attention_kernels,
    cuda_index,
    decode_precision,
    pick_device,
    precision_flags,
    precision_name,
    run_precision,
    set_tf32,
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
    assert use_precision(cpu, amp=True, tf32=True) is nullcontext
    assert {precision_flags(name)["amp"] for name in ("float32", "tf32")} == {False}
    assert precision_flags("bfloat16") == {"amp": True, "tf32": False}


def test_tf32_is_set_inside_a_forward_pass_and_put_back_after():
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    try:
        set_tf32(False)
        with use_precision(torch.device("cuda", 0), amp=False, tf32=True)():
            assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
        assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


def test_translation_decodes_as_the_run_was_validated_unless_told_otherwise():
    cuda_amp = {"precision": "bfloat16", "config": {"trainer": {"amp": True, "tf32": True}}}
    assert decode_precision(None, cuda_amp) == {"amp": True, "tf32": False}
    assert decode_precision("auto", cuda_amp) == run_precision(cuda_amp)
    assert decode_precision("float32", cuda_amp) == {"amp": False, "tf32": False}
    # trained on the CPU with trainer.amp (the default): validated in float32, decoded so on a GPU
    cpu_run = {"precision": "float32", "config": {"trainer": {"amp": True, "tf32": True}}}
    assert decode_precision(None, cpu_run) == {"amp": False, "tf32": False}
    assert decode_precision("bfloat16", cpu_run) == {"amp": True, "tf32": False}
    # a checkpoint without its precision: its config, an absent trainer.tf32 off
    assert run_precision({"config": {"trainer": {"amp": False}}}) == {"amp": False, "tf32": False}
    assert run_precision({}) == {"amp": False, "tf32": False}
    with pytest.raises(ValueError, match="float16"):
        decode_precision("float16", cuda_amp)


def test_cuda_attention_never_uses_cudnn_kernels():
    """On CUDA the fused attention may not take cuDNN's kernels (a graph built for every new shape);
    the CPU's choice is left as it is. The flag is process-wide: put back after the test."""
    before = torch.backends.cuda.cudnn_sdp_enabled()
    try:
        torch.backends.cuda.enable_cudnn_sdp(True)
        attention_kernels(torch.device("cpu"))
        assert torch.backends.cuda.cudnn_sdp_enabled()
        attention_kernels(torch.device("cuda", 0))
        assert not torch.backends.cuda.cudnn_sdp_enabled()
        assert torch.backends.cuda.flash_sdp_enabled() and torch.backends.cuda.mem_efficient_sdp_enabled()
    finally:
        torch.backends.cuda.enable_cudnn_sdp(before)
