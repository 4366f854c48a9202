"""Where the model runs (common/device.py): one GPU per rank or none, and one precision rule for
training, the test decoding and translate.py."""

from contextlib import nullcontext

import pytest
import torch

from common.device import (
    amp_choice,
    attention_kernels,
    autocast_for,
    cpu_flags,
    cuda_index,
    decode_precision,
    native_bf16,
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
    assert precision_name(cpu, amp=True, tf32=True) == "bfloat16"  # a CPU's bf16 autocast
    assert precision_name(cpu, amp=False, tf32=True) == "float32"  # TF32 is CUDA's
    assert use_precision(cpu, amp=False, tf32=True) is nullcontext
    assert {precision_flags(name)["amp"] for name in ("float32", "tf32")} == {False}
    assert precision_flags("bfloat16") == {"amp": True, "tf32": False}


# /proc/cpuinfo's first lines of three machines: an AVX2 EPYC, a Sapphire Rapids Xeon (AMX), an Arm
# Neoverse V1 (FEAT_BF16)
AVX2 = "processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu sse2 avx avx2 fma bmi2\n"
AMX = "processor\t: 0\nflags\t\t: avx2 avx512f avx512_bf16 amx_bf16 amx_tile amx_int8\n"
ARM = "processor\t: 0\nFeatures\t: fp asimd sve i8mm bf16\nCPU implementer\t: 0x41\n"


def test_native_bf16_is_read_from_the_cpus_flags():
    assert cpu_flags(AVX2) == {"fpu", "sse2", "avx", "avx2", "fma", "bmi2"}
    assert {"avx512_bf16", "amx_bf16"} <= cpu_flags(AMX) and "bf16" in cpu_flags(ARM)
    assert cpu_flags("processor\t: 0\n") == set()
    found = native_bf16()  # this machine's: a subset of the flags that mean native bf16
    assert set(found) <= {"avx512_bf16", "amx_bf16", "bf16"}


def test_amp_auto_takes_bf16_only_where_the_hardware_computes_in_it():
    cpu, cuda = torch.device("cpu"), torch.device("cuda", 0)
    avx2, amx = (
        tuple(sorted(cpu_flags(AVX2) & {"avx512_bf16", "amx_bf16", "bf16"})),
        ("amx_bf16", "avx512_bf16"),
    )
    assert avx2 == ()
    amp, why = amp_choice("auto", cpu, avx2)
    assert (
        not amp
        and why == "trainer.amp=auto: float32, this CPU has no native bf16 (no avx512_bf16 or amx_bf16 flag)"
    )
    amp, why = amp_choice("auto", cpu, amx)
    assert amp and why == "trainer.amp=auto: bf16 autocast, this CPU computes in bf16 (amx_bf16, avx512_bf16)"
    assert amp_choice("auto", cuda, avx2) == (True, "trainer.amp=auto: bf16 autocast on CUDA")
    amp, why = amp_choice("true", cpu, avx2)  # asked for: given, with what it costs
    assert amp and "emulated and much slower than float32" in why
    assert not any(amp_choice("false", device, amx)[0] for device in (cpu, cuda))


def test_a_cpu_autocast_runs_the_matrix_products_in_bf16():
    layer = torch.nn.Linear(8, 8)
    with autocast_for(torch.device("cpu"), amp=True)():
        assert layer(torch.randn(2, 8)).dtype == torch.bfloat16
    assert autocast_for(torch.device("cpu"), amp=False) is nullcontext


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
    cuda, cpu = torch.device("cuda", 0), torch.device("cpu")
    bf16_run = {"precision": "bfloat16", "config": {"trainer": {"amp": "auto", "tf32": True}}}
    assert decode_precision(None, bf16_run, cuda) == {"amp": True, "tf32": False}
    assert decode_precision("auto", bf16_run, cuda) == run_precision(bf16_run)
    assert decode_precision("float32", bf16_run, cuda) == {"amp": False, "tf32": False}
    # on a CPU: bf16 where it computes in it, float32 where bf16 would be emulated (unless asked for)
    assert decode_precision(None, bf16_run, cpu, ("amx_bf16",)) == {"amp": True, "tf32": False}
    assert decode_precision(None, bf16_run, cpu, ()) == {"amp": False, "tf32": False}
    assert decode_precision("bfloat16", bf16_run, cpu, ()) == {"amp": True, "tf32": False}
    # trained on a CPU without native bf16 (trainer.amp=auto): validated in float32, decoded so on a GPU
    cpu_run = {"precision": "float32", "config": {"trainer": {"amp": "auto", "tf32": True}}}
    assert decode_precision(None, cpu_run, cuda) == {"amp": False, "tf32": False}
    assert decode_precision("bfloat16", cpu_run, cuda) == {"amp": True, "tf32": False}
    # a checkpoint without its precision: its config, an absent trainer.tf32 off
    assert run_precision({"config": {"trainer": {"amp": False}}}) == {"amp": False, "tf32": False}
    assert run_precision({"config": {"trainer": {"amp": True}}}) == {"amp": True, "tf32": False}
    assert run_precision({}) == {"amp": False, "tf32": False}
    with pytest.raises(ValueError, match="float16"):
        decode_precision("float16", bf16_run, cuda)


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
