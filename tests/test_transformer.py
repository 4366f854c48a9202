"""The Transformer (models/transformer.py): incremental decoding, causality, masks, weights, ties."""
import pytest
import torch

from data.specials import BOS_ID, EOS_ID, PAD_ID
from models.build import build_model, count_parameters
from models.config import TransformerConfig
from models.transformer import Transformer

V = 50


@pytest.fixture(autouse=True)
def seed():
    torch.manual_seed(0)


def tiny(**overrides) -> Transformer:
    """A two-layer Transformer of width 32, in eval mode unless changed."""
    values = dict(d_model=32, n_heads=4, ff_size=64, encoder_layers=2, decoder_layers=2, max_positions=64)
    values.update(overrides)
    return Transformer(TransformerConfig(**values), V, V).eval()


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


CONFIGS = [
    dict(norm="pre", positions="sinusoidal"),
    dict(norm="post", positions="sinusoidal"),
    dict(norm="pre", positions="learned"),
    dict(norm="post", positions="learned"),
]


@pytest.mark.parametrize("overrides", CONFIGS, ids=lambda o: f"{o['norm']}-{o['positions']}")
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
    model = tiny()
    src, src_mask, tgt = batch()
    with torch.no_grad():
        state = model.start_state(model.encode(src, src_mask))
        first, next_state, _ = model.decode_step(tgt[:, 0], state)
        again, _, _ = model.decode_step(tgt[:, 0], state)
    assert state["layers"][0]["self_k"].size(2) == 0
    assert next_state["layers"][0]["self_k"].size(2) == 1
    torch.testing.assert_close(first, again)


@pytest.mark.parametrize("norm", ["pre", "post"])
@pytest.mark.parametrize("t", [1, 3])
def test_causality(norm, t):
    """Changing target token ``t`` leaves logits before ``t`` unchanged and changes some after."""
    model = tiny(norm=norm)
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


@pytest.mark.parametrize("positions", ["sinusoidal", "learned"])
def test_source_padding_is_invisible(positions):
    model = tiny(positions=positions)
    src, src_mask, tgt = batch()
    extra = torch.full((3, 4), PAD_ID)
    longer = torch.cat([src, extra], dim=1)
    with torch.no_grad():
        logits, _ = model(src, src_mask, tgt)
        padded, _ = model(longer, longer != PAD_ID, tgt)
    torch.testing.assert_close(padded, logits, atol=1e-5, rtol=1e-5)


def test_sentence_alone_equals_sentence_in_padded_batch():
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
    B, S, T, H = src.size(0), src.size(1), tgt.size(1), model.cfg.n_heads
    assert len(attention["cross"]) == len(attention["encoder_self"]) == len(attention["decoder_self"]) == 2
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    tgt_keys = (tgt != PAD_ID)[:, None, None, :]  # (B, 1, 1, T)
    src_keys = src_mask[:, None, None, :]  # (B, 1, 1, S)
    for cross, encoder_self, decoder_self in zip(attention["cross"], attention["encoder_self"], attention["decoder_self"]):
        assert cross.shape == (B, H, T, S)
        assert encoder_self.shape == (B, H, S, S)
        assert decoder_self.shape == (B, H, T, T)
        assert_rows_are_distributions(cross, src_keys.expand_as(cross))
        assert_rows_are_distributions(encoder_self, src_keys.expand_as(encoder_self))
        assert_rows_are_distributions(decoder_self, (causal & tgt_keys).expand_as(decoder_self))


def test_no_attention_weights_unless_asked():
    model = tiny()
    src, src_mask, tgt = batch()
    with torch.no_grad():
        _, attention = model(src, src_mask, tgt)
    assert attention["cross"] == [None, None]
    assert "encoder_self" not in attention


def test_attention_weights_of_a_decoding_step():
    model = tiny()
    src, src_mask, tgt = batch()
    with torch.no_grad():
        state = model.start_state(model.encode(src, src_mask))
        for t in range(3):
            _, state, weights = model.decode_step(tgt[:, t], state, need_weights=True)
            assert weights.shape == src.shape
            assert_rows_are_distributions(weights, src_mask)


def test_shared_and_tied_embeddings():
    model = tiny(tie_output=True, share_embeddings=True)
    assert model.output.proj.weight is model.tgt_embed.weight
    assert model.src_embed is model.tgt_embed


def test_source_embedding_is_separate_for_different_vocabularies():
    model = Transformer(TransformerConfig(d_model=32, n_heads=4, ff_size=64, encoder_layers=1, decoder_layers=1), 60, V)
    assert model.src_embed is not model.tgt_embed
    assert model.src_embed.weight.shape == (60, 32)
    assert model.output.proj.weight is model.tgt_embed.weight


def test_untied_output_layer_is_its_own_parameter():
    model = tiny(tie_output=False)
    assert model.output.proj.weight is not model.tgt_embed.weight
    assert count_parameters(model) == count_parameters(tiny()) + V * 32


def test_parameter_count_of_the_default_config():
    """The number in the README and conf/model/transformer.yaml (joint 8k vocabulary)."""
    assert count_parameters(build_model(TransformerConfig(), 8000, 8000)) == 7_578_624


@pytest.mark.parametrize("overrides", [dict(norm="pre", positions="learned"), dict(norm="post", tie_output=False)])
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
