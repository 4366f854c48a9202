"""The FLOPs, MFU and time split of a training step (training/efficiency.py)."""

from contextlib import nullcontext

import pytest
import torch

from data.batching import collate
from models.build import build_model
from models.config import TransformerConfig
from training.config import TrainerConfig
from training.distributed import World
from training.efficiency import busy_time, cpu_kind, kernel_kind, mfu, peak_tflops, split, step_flops


def transformer_flops(batch: int, src: int, tgt: int, d: int, ff: int, vocab: int, layers: int) -> int:
    """A forward and backward pass of a pre-norm Transformer (``layers`` encoder and decoder layers)
    over ``batch`` sentences of ``src`` source and ``tgt`` target positions, by hand: two FLOPs per
    multiply-add, the backward pass twice the forward."""
    n_src, n_tgt = batch * src, batch * tgt
    encoder = 4 * 2 * n_src * d * d + 2 * 2 * batch * src * src * d + 2 * 2 * n_src * d * ff
    decoder_self = 4 * 2 * n_tgt * d * d + 2 * 2 * batch * tgt * tgt * d
    cross = 2 * 2 * n_tgt * d * d + 2 * 2 * n_src * d * d + 2 * 2 * batch * tgt * src * d
    decoder = decoder_self + cross + 2 * 2 * n_tgt * d * ff
    forward = layers * (encoder + decoder) + 2 * n_tgt * d * vocab
    return 3 * forward


def test_the_flops_of_a_step_are_the_matrix_products_by_hand():
    torch.manual_seed(0)
    d, ff, vocab, layers = 32, 64, 50, 2
    cfg = TransformerConfig(d_model=d, n_heads=4, ff_size=ff, encoder_layers=layers, decoder_layers=layers)
    model = build_model(cfg, vocab, vocab)
    # 3 pairs of 6 source and 4 target ids: 7 source positions (EOS added), 5 target ones (BOS or
    # EOS added), no padding
    batch = collate([(i, list(range(4, 10)), list(range(10, 14))) for i in range(3)])
    tc = TrainerConfig(guided_alignment=0.0)  # the hand count has no guided alignment
    flops = step_flops(model, [batch], tc, World(), torch.device("cpu"), nullcontext)
    assert flops == transformer_flops(3, 7, 5, d, ff, vocab, layers)
    assert all(p.grad is None for p in model.parameters())  # nothing learnt


def test_mfu_and_the_peaks():
    assert peak_tflops("NVIDIA H100 80GB HBM3", "bfloat16") == 989.4
    assert peak_tflops("NVIDIA H100 PCIe", "bfloat16") == 756.5
    assert peak_tflops("NVIDIA H200", "tf32") == 494.7
    assert peak_tflops("cpu", "float32") is None
    assert mfu(494.7e12, 989.4) == pytest.approx(0.5)
    assert mfu(1e12, None) is None


def test_kernels_are_sorted_by_kind_and_idle_is_what_no_kernel_covers():
    assert kernel_kind("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64") == "matrix products"
    assert kernel_kind("nvjet_tst_128x64_64x8_1x2_h_bz_NNT") == "matrix products"
    assert kernel_kind("fmha_cutlassF_bf16_aligned_64x64_rf_sm80") == "attention"
    assert kernel_kind("void at::native::vectorized_elementwise_kernel<4, ...>") == "elementwise and other"
    assert busy_time([(0.0, 2.0), (1.0, 3.0), (5.0, 6.0)]) == 4.0
    kernels = [("gemm_a", 0.0, 2.0), ("fmha_b", 2.0, 3.0), ("elementwise_c", 4.0, 5.0)]
    shares = split(kernels, wall=10.0)
    assert shares == {"matrix products": 0.2, "attention": 0.1, "elementwise and other": 0.1, "idle": 0.6}
    # two streams' kernels overlap: the kinds are scaled to the busy time, never above the wall
    overlapped = split([("gemm_a", 0.0, 4.0), ("elementwise_c", 0.0, 4.0)], wall=8.0)
    assert overlapped["idle"] == 0.5 and sum(overlapped.values()) == pytest.approx(1.0)


def test_cpu_operators_are_sorted_by_where_they_run():
    # (the operator, then its callers)
    assert cpu_kind(["aten::addmm", "aten::linear"]) == "matrix products"
    assert cpu_kind(["aten::mm", "autograd::engine::evaluate_function: MmBackward0"]) == "matrix products"
    assert cpu_kind(["aten::mul", "aten::_scaled_dot_product_flash_attention_for_cpu"]) == "attention"
    assert cpu_kind(["aten::_foreach_add_", "Optimizer.step#Adam.step"]) == "optimizer"
    assert cpu_kind(["aten::bernoulli_", "aten::native_dropout", "aten::dropout"]) == "other operators"
