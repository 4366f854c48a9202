"""The RNN with additive attention (models/rnn.py): incremental decoding, causality, masks, weights, ties."""
import pytest
import torch

from data.specials import BOS_ID, EOS_ID, PAD_ID
from models.build import build_model, count_parameters
from models.config import RNNConfig
from models.rnn import RNNModel

V = 50


@pytest.fixture(autouse=True)
def seed():
    torch.manual_seed(0)


def tiny(**overrides) -> RNNModel:
    """A GRU model of width 32, in eval mode unless changed."""
    values = dict(embed_dim=24, hidden_size=32, attention_size=16)
    values.update(overrides)
    return RNNModel(RNNConfig(**values), V, V).eval()


def batch():
    """Padded source ``(3, 6)`` and target input ``(3, 5)`` (BOS first), with the source mask."""
    src_lengths, tgt_lengths = [6, 4, 2], [5, 3, 1]
    src = torch.randint(4, V, (3, 6))
    tgt = torch.randint(4, V, (3, 5))
    tgt[:, 0] = BOS_ID
    for row, (s, t) in enumerate(zip(src_lengths, tgt_lengths)):
        src[row, s - 1] = EOS_ID
        src[row, s:] = PAD_ID
        tgt[row, t:] = PAD_ID
    return src, src != PAD_ID, tgt


CELLS = [
    dict(cell="gru"),
    dict(cell="lstm"),
    dict(cell="gru", encoder_layers=2, decoder_layers=2),
    dict(cell="lstm", encoder_layers=2, decoder_layers=2),
]


def cell_id(overrides):
    return f"{overrides['cell']}-{overrides.get('decoder_layers', 1)}layer"


@pytest.mark.parametrize("overrides", CELLS, ids=cell_id)
def test_incremental_decoding_equals_full_forward(overrides):
    model = tiny(**overrides)
    src, src_mask, tgt = batch()
    with torch.no_grad():
        full, _ = model(src, src_mask, tgt)  # (B, T, V)
        state = model.start_state(model.encode(src, src_mask))
        steps = []
        for t in range(tgt.size(1)):
            logits, state, weights = model.decode_step(tgt[:, t], state)
            steps.append(logits)
            assert weights is None
    incremental = torch.stack(steps, 1)  # (B, T, V)
    real = tgt != PAD_ID
    torch.testing.assert_close(incremental[real], full[real], atol=1e-5, rtol=1e-5)


def test_decode_step_does_not_modify_the_state_passed_in():
    model = tiny(cell="lstm", decoder_layers=2, encoder_layers=2)
    src, src_mask, tgt = batch()
    with torch.no_grad():
        state = model.start_state(model.encode(src, src_mask))
        hidden, cell = state["hidden"].clone(), state["cell"].clone()
        first, _, _ = model.decode_step(tgt[:, 0], state)
        again, _, _ = model.decode_step(tgt[:, 0], state)
    assert torch.equal(state["hidden"], hidden) and torch.equal(state["cell"], cell)
    torch.testing.assert_close(first, again)


@pytest.mark.parametrize("cell", ["gru", "lstm"])
@pytest.mark.parametrize("t", [1, 3])
def test_causality(cell, t):
    """Changing target token ``t`` leaves logits before ``t`` unchanged and changes some after."""
    model = tiny(cell=cell)
    src, src_mask, _ = batch()
    tgt = torch.randint(4, V, (3, 5))
    tgt[:, 0] = BOS_ID
    changed = tgt.clone()
    changed[:, t] = 4 + (tgt[:, t] - 4 + 1) % (V - 4)  # another real token
    with torch.no_grad():
        before, _ = model(src, src_mask, tgt)
        after, _ = model(src, src_mask, changed)
    torch.testing.assert_close(after[:, :t], before[:, :t], atol=1e-6, rtol=0)
    assert (after[:, t:] - before[:, t:]).abs().amax(dim=-1).gt(1e-4).all()


@pytest.mark.parametrize("overrides", [dict(cell="gru"), dict(cell="lstm", encoder_layers=2)], ids=["gru", "lstm-2layer"])
def test_source_padding_is_invisible(overrides):
    model = tiny(**overrides)
    src, src_mask, tgt = batch()
    longer = torch.cat([src, torch.full((3, 4), PAD_ID)], dim=1)
    with torch.no_grad():
        logits, _ = model(src, src_mask, tgt)
        padded, _ = model(longer, longer != PAD_ID, tgt)
    torch.testing.assert_close(padded, logits, atol=1e-5, rtol=1e-5)


def test_sentence_alone_equals_sentence_in_padded_batch():
    """The backward encoder starts at the last real token, not at the padding."""
    model = tiny()
    src, src_mask, tgt = batch()
    with torch.no_grad():
        together, _ = model(src, src_mask, tgt)
        alone, _ = model(src[2:, :2], src_mask[2:, :2], tgt[2:, :1])
    torch.testing.assert_close(alone[0, 0], together[2, 0], atol=1e-5, rtol=1e-5)


def assert_rows_are_distributions(weights, visible):
    """Rows sum to 1 over the visible keys and are exactly 0 at the hidden ones."""
    assert (weights.masked_select(~visible) == 0).all()
    torch.testing.assert_close(weights.sum(-1), torch.ones(weights.shape[:-1]), atol=1e-5, rtol=0)


def test_attention_weights_of_a_full_pass():
    model = tiny()
    src, src_mask, tgt = batch()
    with torch.no_grad():
        _, attention = model(src, src_mask, tgt, need_weights=True)
        _, without = model(src, src_mask, tgt)
    cross = attention["cross"]
    assert cross.shape == (src.size(0), tgt.size(1), src.size(1))
    assert_rows_are_distributions(cross, src_mask[:, None, :].expand_as(cross))
    assert without == {}


def test_attention_weights_of_a_decoding_step():
    model = tiny(cell="lstm")
    src, src_mask, tgt = batch()
    with torch.no_grad():
        state = model.start_state(model.encode(src, src_mask))
        for t in range(3):
            _, state, weights = model.decode_step(tgt[:, t], state, need_weights=True)
            assert weights.shape == src.shape
            assert_rows_are_distributions(weights, src_mask)


def test_shared_and_tied_embeddings():
    model = tiny(tie_output=True, share_embeddings=True)
    assert model.decoder.output.proj.weight is model.decoder.embed.weight
    assert model.encoder.embed is model.decoder.embed


def test_source_embedding_is_separate_for_different_vocabularies():
    model = RNNModel(RNNConfig(embed_dim=24, hidden_size=32, attention_size=16), 60, V)
    assert model.encoder.embed is not model.decoder.embed
    assert model.encoder.embed.weight.shape == (60, 24)
    assert model.decoder.output.proj.weight is model.decoder.embed.weight


def test_untied_output_layer_is_its_own_parameter():
    model = tiny(tie_output=False)
    assert model.decoder.output.proj.weight is not model.decoder.embed.weight
    assert count_parameters(model) == count_parameters(tiny()) + V * 24


def test_parameter_count_of_the_default_config():
    """The number in the README and conf/model/rnn.yaml (joint 8k vocabulary)."""
    assert count_parameters(build_model(RNNConfig(), 8000, 8000)) == 4_216_064


@pytest.mark.parametrize("overrides", CELLS[:2] + [dict(cell="lstm", encoder_layers=2, decoder_layers=2, tie_output=False)])
def test_gradients_reach_every_parameter(overrides):
    model = tiny(**overrides).train()
    src, src_mask, tgt = batch()
    logits, _ = model(src, src_mask, tgt)
    target = torch.roll(tgt, -1, dims=1).masked_fill(tgt == PAD_ID, PAD_ID)
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, V), target.reshape(-1), ignore_index=PAD_ID)
    loss.backward()
    for name, parameter in model.named_parameters():
        assert parameter.grad is not None, name
        assert parameter.grad.abs().sum() > 0, name
