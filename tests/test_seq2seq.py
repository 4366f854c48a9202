"""The encoder-decoder contract (models/seq2seq.py), checked on both families (models/rnn.py,
models/transformer.py): incremental decoding, causality, masks, attention weights, ties, gradients."""

from dataclasses import replace
from typing import Callable, Dict, NamedTuple

import pytest
import torch
from torch import Tensor, nn

from data.specials import BOS_ID, EOS_ID, PAD_ID
from models.build import build_model, count_parameters
from models.config import RNNConfig, TransformerConfig
from models.embeddings import TokenEmbedding
from models.rnn import RNNModel
from models.search import map_state
from models.seq2seq import ATTENTION_KEYS
from models.transformer import Transformer

from helpers import tiny_model_config

pytestmark = pytest.mark.usefixtures("seed")  # torch seeded before each test (conftest.py)

V = 50


class Family(NamedTuple):
    make: Callable[..., nn.Module]  # (src vocabulary, **config overrides) -> a tiny model in eval mode
    src_embed: Callable[[nn.Module], TokenEmbedding]
    tgt_embed: Callable[[nn.Module], TokenEmbedding]
    layout: Callable[[nn.Module], Dict[str, tuple]]  # attention key -> (layers, heads)


def tiny_rnn(src_vocab: int = V, **overrides) -> RNNModel:
    """The tiny RNN (conf/model/tiny_rnn.yaml) with ``overrides``, in eval mode unless changed."""
    return RNNModel(replace(tiny_model_config("rnn"), **overrides), src_vocab, V).eval()


def tiny_transformer(src_vocab: int = V, **overrides) -> Transformer:
    """The tiny Transformer (conf/model/tiny_transformer.yaml) with ``overrides``, in eval mode unless changed."""
    return Transformer(replace(tiny_model_config("transformer"), **overrides), src_vocab, V).eval()


FAMILIES = {
    "rnn": Family(
        tiny_rnn,
        lambda m: m.encoder.embed,
        lambda m: m.decoder.embed,
        # one cross layer: one head, or model.attention_heads of multihead attention
        lambda m: {"cross": (1, m.decoder.attention.n_heads), "encoder_self": (0, 1), "decoder_self": (0, 1)},
    ),
    "transformer": Family(
        tiny_transformer,
        lambda m: m.src_embed,
        lambda m: m.tgt_embed,
        lambda m: {
            "cross": (m.cfg.decoder_layers, m.cfg.n_heads),
            "encoder_self": (m.cfg.encoder_layers, m.cfg.n_heads),
            "decoder_self": (m.cfg.decoder_layers, m.cfg.n_heads),
        },
    ),
}

# Every variant the contract tests run on: the RNN's cells and depths, the Transformer's norms and positions.
VARIANTS = [
    ("rnn", dict(cell="gru")),
    ("rnn", dict(cell="lstm")),
    ("rnn", dict(cell="gru", encoder_layers=2, decoder_layers=2)),
    ("rnn", dict(cell="lstm", encoder_layers=2, decoder_layers=2)),
    ("transformer", dict(norm="pre", positions="sinusoidal")),
    ("transformer", dict(norm="post", positions="sinusoidal")),
    ("transformer", dict(norm="pre", positions="learned")),
    ("transformer", dict(norm="post", positions="learned")),
    # The tiny RNN is 64 wide throughout: sizes apart here, so that a mixed-up dimension fails.
    ("rnn", dict(cell="gru", embed_dim=24, attention_size=16)),
    # Every attention function of each family (model.attention).
    ("rnn", dict(attention="general")),
    ("rnn", dict(attention="scaled_dot", attention_size=16)),
    ("rnn", dict(attention="multihead", attention_heads=4, cell="lstm")),
    ("transformer", dict(attention="additive")),
    ("transformer", dict(attention="additive", norm="post", positions="learned")),
]
RNN_MULTIHEAD, TRANSFORMER_ADDITIVE = VARIANTS[-3], VARIANTS[-2]


def variant_id(variant) -> str:
    family, overrides = variant
    return "-".join([family, *(f"{key}={value}" for key, value in overrides.items())])


def model_of(variant, **extra) -> nn.Module:
    family, overrides = variant
    return FAMILIES[family].make(**{**overrides, **extra})


each_variant = pytest.mark.parametrize("variant", VARIANTS, ids=variant_id)
each_family = pytest.mark.parametrize("family", list(FAMILIES))


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


def decode_all(model: nn.Module, src: Tensor, src_mask: Tensor, tgt: Tensor) -> Tensor:
    """Logits ``(B, T, V)`` of step-wise decoding of ``tgt``."""
    state = model.start_state(model.encode(src, src_mask))
    steps = []
    for t in range(tgt.size(1)):
        logits, state = model.decode_step(tgt[:, t], state)
        steps.append(logits)
    return torch.stack(steps, 1)


@each_variant
def test_incremental_decoding_equals_full_forward(variant):
    model = model_of(variant)
    src, src_mask, tgt = batch()
    with torch.no_grad():
        full, _ = model(src, src_mask, tgt)  # (B, T, V)
        incremental = decode_all(model, src, src_mask, tgt)
    real = tgt != PAD_ID
    torch.testing.assert_close(incremental[real], full[real], atol=1e-5, rtol=1e-5)


RNN_ATTENTIONS = [("rnn", dict(cell="gru")), *[v for v in VARIANTS if v[0] == "rnn" and "attention" in v[1]]]


@pytest.mark.parametrize("variant", RNN_ATTENTIONS, ids=variant_id)
def test_the_rnn_attends_with_the_state_before_the_step(variant):
    """Bahdanau's data flow for every attention function: the query of step ``t`` is ``s_{t-1}``,
    which has read the tokens fed before step ``t``; so the token fed at step ``t`` changes the
    weights from step ``t + 1`` on, not those of step ``t`` (with Luong's ``s_t`` it would)."""
    model = model_of(variant)
    src, src_mask, tgt = batch()
    other = tgt.clone()
    other[0, 2] = 4 + (int(tgt[0, 2]) - 4 + 1) % (V - 4)  # another real token fed at step 2 of sentence 0
    with torch.no_grad():
        _, attention = model(src, src_mask, tgt, need_weights=True)
        _, changed = model(src, src_mask, other, need_weights=True)
    before, after = attention["cross"][0][0], changed["cross"][0][0]  # (H, T, S) of sentence 0
    assert torch.equal(before[:, :3], after[:, :3])  # steps 0 to 2
    assert not torch.allclose(before[:, 3], after[:, 3])


@each_variant
def test_logits_with_and_without_weights_agree_at_real_positions(variant):
    """The Transformer's weight-free pass uses a causal decoder self-attention without the padding
    mask; padding only follows real tokens, so every real position sees the same keys."""
    model = model_of(variant)
    src, src_mask, tgt = batch()  # source and target padding
    with torch.no_grad():
        fast, _ = model(src, src_mask, tgt)  # (B, T, V)
        weighted, _ = model(src, src_mask, tgt, need_weights=True)  # (B, T, V)
    real = tgt != PAD_ID
    torch.testing.assert_close(fast[real], weighted[real], atol=1e-5, rtol=1e-5)


@each_variant
def test_the_states_before_the_output_layer_make_the_logits(variant):
    """``forward(..., project=False)`` stops before the output layer (the training loss projects
    the states itself, ``training/step.py``): the output layer makes the logits of them."""
    model = model_of(variant)
    src, src_mask, tgt = batch()
    with torch.no_grad():
        logits, _ = model(src, src_mask, tgt)  # (B, T, V)
        states, _ = model(src, src_mask, tgt, project=False)  # (B, T, E)
    assert states.shape == tgt.shape + (model.output_layer.proj.weight.size(1),)
    torch.testing.assert_close(model.output_layer(states), logits)


def teacher_forced_loss(
    model: nn.Module, src: Tensor, src_mask: Tensor, tgt: Tensor, need_weights: bool
) -> Tensor:
    logits, _ = model(src, src_mask, tgt, need_weights=need_weights)
    target = torch.roll(tgt, -1, dims=1).masked_fill(tgt == PAD_ID, PAD_ID)
    return torch.nn.functional.cross_entropy(logits.reshape(-1, V), target.reshape(-1), ignore_index=PAD_ID)


@pytest.mark.parametrize("norm", ["pre", "post"])
def test_transformer_gradients_with_and_without_weights_agree(norm):
    """Padded queries, which see padding keys on the causal-only path, reach no loss term."""
    model = tiny_transformer(norm=norm, dropout=0.0, attention_dropout=0.0).train()
    src, src_mask, tgt = batch()
    grads = []
    for need_weights in (False, True):
        model.zero_grad()
        teacher_forced_loss(model, src, src_mask, tgt, need_weights).backward()
        grads.append([p.grad.clone() for p in model.parameters()])
    for fast, weighted in zip(*grads):
        torch.testing.assert_close(fast, weighted, atol=1e-5, rtol=1e-4)


def test_transformer_training_pass_gives_decoder_self_attention_no_mask_tensor(monkeypatch):
    """CUDA's flash-attention kernel takes ``is_causal`` but no ``attn_mask``: the weight-free pass
    must reach it with the decoder self-attention (encoder and cross-attention keep their padding)."""
    calls = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, **rest):
        calls.append((attn_mask is None, is_causal))
        return sdpa(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, **rest)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    model = tiny_transformer()
    src, src_mask, tgt = batch()
    with torch.no_grad():
        model(src, src_mask, tgt)
    assert calls.count((True, True)) == model.cfg.decoder_layers
    assert len(calls) == model.cfg.encoder_layers + 2 * model.cfg.decoder_layers


def test_transformer_decode_refuses_causal_after_cached_steps():
    model = tiny_transformer()
    src, src_mask, tgt = batch()
    with torch.no_grad():
        state = model.start_state(model.encode(src, src_mask))
        _, state = model.decode_step(tgt[:, 0], state)
        with pytest.raises(ValueError, match="causal"):
            model.decode(tgt[:, 1:3], state, None, causal=True)


def tensors(state) -> list:
    found = []
    map_state(state, found.append)
    return found


@each_variant
def test_decode_step_does_not_modify_the_state_passed_in(variant):
    model = model_of(variant)
    src, src_mask, tgt = batch()
    with torch.no_grad():
        state = model.start_state(model.encode(src, src_mask))
        before = [t.clone() for t in tensors(state)]
        first, next_state = model.decode_step(tgt[:, 0], state)
        again, _ = model.decode_step(tgt[:, 0], state)
    after = tensors(state)
    assert len(after) == len(before) and all(torch.equal(a, b) for a, b in zip(after, before))
    assert any(a.shape != b.shape or not torch.equal(a, b) for a, b in zip(tensors(next_state), before))
    torch.testing.assert_close(first, again)


@each_variant
@pytest.mark.parametrize("t", [1, 3])
def test_causality(variant, t):
    """Changing target token ``t`` leaves logits before ``t`` unchanged and changes some after."""
    model = model_of(variant)
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


@each_variant
def test_source_padding_is_invisible(variant):
    model = model_of(variant)
    src, src_mask, tgt = batch()
    longer = torch.cat([src, torch.full((3, 4), PAD_ID)], dim=1)
    with torch.no_grad():
        logits, _ = model(src, src_mask, tgt)
        padded, _ = model(longer, longer != PAD_ID, tgt)
    torch.testing.assert_close(padded, logits, atol=1e-5, rtol=1e-5)


@each_family
def test_sentence_alone_equals_sentence_in_padded_batch(family):
    """The RNN's backward encoder starts at the last real token, not at the padding."""
    model = FAMILIES[family].make()
    src, src_mask, tgt = batch()
    with torch.no_grad():
        together, _ = model(src, src_mask, tgt)
        alone, _ = model(src[2:, :2], src_mask[2:, :2], tgt[2:, :1])
    torch.testing.assert_close(alone[0, 0], together[2, 0], atol=1e-5, rtol=1e-5)


def assert_rows_are_distributions(weights, visible):
    """Rows sum to 1 over the visible keys and are exactly 0 at the hidden ones."""
    assert (weights.masked_select(~visible) == 0).all()
    torch.testing.assert_close(weights.sum(-1), torch.ones(weights.shape[:-1]), atol=1e-5, rtol=0)


@each_family
def test_attention_weights_of_a_full_pass_have_one_structure(family):
    """``{key: [(B, H, query, key)] per layer}`` for both families; the RNN is 1 cross layer of 1 head."""
    model = FAMILIES[family].make()
    src, src_mask, tgt = batch()
    with torch.no_grad():
        _, attention = model(src, src_mask, tgt, need_weights=True)
    B, S, T = src.size(0), src.size(1), tgt.size(1)
    assert set(attention) == set(ATTENTION_KEYS)
    queries_keys = {"cross": (T, S), "encoder_self": (S, S), "decoder_self": (T, T)}
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    visible = {
        "cross": src_mask[:, None, None, :],  # (B, 1, 1, S)
        "encoder_self": src_mask[:, None, None, :],  # (B, 1, 1, S)
        "decoder_self": causal & (tgt != PAD_ID)[:, None, None, :],  # (B, 1, T, T)
    }
    for key, (n_layers, heads) in FAMILIES[family].layout(model).items():
        assert isinstance(attention[key], list) and len(attention[key]) == n_layers, key
        for weights in attention[key]:
            assert weights.shape == (B, heads, *queries_keys[key]), key
            assert_rows_are_distributions(weights, visible[key].expand_as(weights))


@each_family
def test_no_attention_weights_unless_asked(family):
    model = FAMILIES[family].make()
    src, src_mask, tgt = batch()
    with torch.no_grad():
        _, attention = model(src, src_mask, tgt)
        encoded = model.encode(src, src_mask)
    assert attention == {} and encoded.attention == {}


@each_family
def test_encoder_self_attention_of_encode_is_that_of_the_full_pass(family):
    model = FAMILIES[family].make()
    src, src_mask, tgt = batch()
    with torch.no_grad():
        _, attention = model(src, src_mask, tgt, need_weights=True)
        encoded = model.encode(src, src_mask, need_weights=True)
    assert list(encoded.attention) == ["encoder_self"]
    assert len(encoded.attention["encoder_self"]) == len(attention["encoder_self"])
    for ours, theirs in zip(encoded.attention["encoder_self"], attention["encoder_self"]):
        torch.testing.assert_close(ours, theirs)


@pytest.mark.parametrize("activation, expected", [(None, 0.3), (0.05, 0.05)])
def test_the_feed_forward_blocks_dropout_is_activation_dropout_or_else_dropout(activation, expected):
    model = tiny_transformer(dropout=0.3, activation_dropout=activation)
    blocks = [layer.feed_forward.net for layer in [*model.encoder_layers, *model.decoder_layers]]
    assert [block[2].p for block in blocks] == [expected] * len(blocks)  # Linear, ReLU, Dropout, Linear
    assert model.dropout.p == 0.3  # the rest keeps model.dropout


@each_family
def test_shared_and_tied_embeddings(family):
    f = FAMILIES[family]
    model = f.make(tie_output=True, share_embeddings=True)
    assert model.output_layer.proj.weight is f.tgt_embed(model).weight
    assert f.src_embed(model) is f.tgt_embed(model)


@each_family
def test_source_embedding_is_separate_for_different_vocabularies(family):
    f = FAMILIES[family]
    model = f.make(60)
    dim = f.tgt_embed(model).weight.size(1)
    assert f.src_embed(model) is not f.tgt_embed(model)
    assert f.src_embed(model).weight.shape == (60, dim)
    assert model.output_layer.proj.weight is f.tgt_embed(model).weight


@each_family
def test_untied_output_layer_is_its_own_parameter(family):
    f = FAMILIES[family]
    model = f.make(tie_output=False)
    dim = f.tgt_embed(model).weight.size(1)
    assert model.output_layer.proj.weight is not f.tgt_embed(model).weight
    assert count_parameters(model) == count_parameters(f.make()) + V * dim


@pytest.mark.parametrize(
    "cfg, params", [(RNNConfig(), 4_216_064), (TransformerConfig(), 7_578_624)], ids=["rnn", "transformer"]
)
def test_parameter_count_of_the_default_config(cfg, params):
    """The numbers in docs/training.md and conf/model/*.yaml (joint 8k vocabulary)."""
    assert count_parameters(build_model(cfg, 8000, 8000)) == params


@pytest.mark.parametrize(
    "family, vocab, params",
    [
        ("rnn", 1000, 200_512),
        ("transformer", 1000, 231_680),
        ("rnn", 8000, 648_512),
        ("transformer", 8000, 679_680),
    ],
)
def test_parameter_count_of_the_tiny_config(family, vocab, params):
    """The numbers in conf/model/tiny_*.yaml (a joint vocabulary of 1,000, the debug run's) and in
    docs/training.md (a joint 8k vocabulary)."""
    assert count_parameters(build_model(tiny_model_config(family), vocab, vocab)) == params


@pytest.mark.parametrize(
    "variant",
    VARIANTS[:2]
    + [("rnn", dict(cell="lstm", encoder_layers=2, decoder_layers=2, tie_output=False))]
    + [("transformer", dict(norm="pre", positions="learned"))]
    + [("transformer", dict(norm="post", tie_output=False))],
    ids=variant_id,
)
def test_gradients_reach_every_parameter(variant):
    model = model_of(variant).train()
    src, src_mask, tgt = batch()
    logits, _ = model(src, src_mask, tgt)
    target = torch.roll(tgt, -1, dims=1).masked_fill(tgt == PAD_ID, PAD_ID)
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, V), target.reshape(-1), ignore_index=PAD_ID)
    loss.backward()
    for name, parameter in model.named_parameters():
        assert parameter.grad is not None, name
        assert parameter.grad.abs().sum() > 0, name
