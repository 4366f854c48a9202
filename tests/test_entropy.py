"""Each attention's entropy at every evaluation (TensorBoard scalars) and the line ``train.log``
gets when a cross-attention collapses (``training/validation.py``: ``watch_entropy``)."""

import logging
import math

import pytest
import torch

from alignment.heads import row_entropy
from data.batching import ParallelDataset
from models.build import build_model
from models.config import RNNConfig, TransformerConfig
from training.board import Board
from training.validation import COLLAPSE_NATS, ENTROPY_PAIRS, watch_entropy

from helpers import scalars

pytestmark = pytest.mark.usefixtures("seed")


def pairs(n: int = 12) -> ParallelDataset:
    """``n`` random pairs of 5 to 9 tokens (ids 4..29: no special token)."""
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(5, 10, (2, n), generator=g)
    src = [torch.randint(4, 30, (int(n),), generator=g).tolist() for n in lengths[0]]
    tgt = [torch.randint(4, 30, (int(n),), generator=g).tolist() for n in lengths[1]]
    return ParallelDataset(src, tgt)


def watch(model, tmp_path, caplog):
    """One evaluation's entropy watch: the scalars written, the warning lines logged."""
    board, said = Board(tmp_path / "tb"), set()
    with caplog.at_level(logging.WARNING, logger="training.validation"):
        watch_entropy(board, model.eval(), pairs(), 4000, 7, said)
        watch_entropy(board, model, pairs(), 4000, 8, said)  # a second evaluation: said once
    board.writer.close()
    lines = [r.getMessage() for r in caplog.records if "collapsed" in r.getMessage()]
    return lines, said


def test_a_collapsed_cross_attention_is_said_once_and_a_healthy_one_never(tmp_path, caplog):
    model = build_model(
        RNNConfig(attention="scaled_dot", embed_dim=8, hidden_size=8, attention_size=8), 30, 30
    )
    lines, said = watch(model, tmp_path / "healthy", caplog)
    assert lines == [] and said == set()
    (step, healthy), _ = scalars(tmp_path / "healthy" / "tb", "entropy/cross/layer1/head1")
    assert step == 7 and healthy > 1.0  # an untrained attention spreads its weight: near log(S)
    with torch.no_grad():  # the collapse: scores so large that every row's softmax is one-hot
        model.decoder.attention.key_proj.weight.mul_(1e3)
        model.decoder.attention.query_proj.weight.mul_(1e3)
    caplog.clear()
    lines, said = watch(model, tmp_path / "collapsed", caplog)
    assert said == {(1, 1)} and len(lines) == 1
    assert lines[0].startswith("cross-attention layer 1 head 1 collapsed: mean entropy 0.0")
    assert f"on the first {ENTROPY_PAIRS} validation pairs (under {COLLAPSE_NATS})" in lines[0]
    assert lines[0].endswith("try a lower trainer.lr, or model.qk_norm=true for a dot-product score")
    (_, collapsed), _ = scalars(tmp_path / "collapsed" / "tb", "entropy/cross/layer1/head1")
    assert collapsed < COLLAPSE_NATS


def test_the_transformer_has_a_scalar_per_kind_and_layer_and_per_cross_head(tmp_path, caplog):
    cfg = TransformerConfig(d_model=8, n_heads=2, ff_size=16, encoder_layers=2, decoder_layers=1)
    lines, _ = watch(build_model(cfg, 30, 30), tmp_path, caplog)
    assert lines == []
    tags = {"entropy/encoder_self/layer1", "entropy/encoder_self/layer2", "entropy/decoder_self/layer1"}
    tags |= {"entropy/cross/layer1", "entropy/cross/layer1/head1", "entropy/cross/layer1/head2"}
    for tag in tags:
        values = [v for _, v in scalars(tmp_path / "tb", tag)]
        assert len(values) == 2 and all(0.0 < v <= math.log(10) for v in values)  # at most log(S), S <= 10


def test_a_rows_entropy_is_zero_on_one_key_and_log_of_the_keys_when_uniform():
    one_key = torch.eye(5)[None, :3]  # (1, 3, 5)
    uniform = torch.full((1, 3, 5), 1 / 5)
    means = row_entropy(torch.cat([one_key, uniform])).mean(-1)  # (2,): per head, the mean over rows
    assert means.tolist() == pytest.approx([0.0, math.log(5)])
