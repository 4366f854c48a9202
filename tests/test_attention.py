import math

import pytest
import torch
from torch import nn

from models.attention import (
    AdditiveAttention,
    MultiHeadAttention,
    masked_softmax_,
    scaled_dot_product_attention,
    scaled_dot_product_explicit,
    scaled_dot_product_fused,
)
from models.masks import causal_mask, combine_masks, key_mask, padding_mask_from_lengths

B, T, S, D, H = 3, 5, 7, 16, 4


@pytest.fixture(autouse=True)
def seed():
    torch.manual_seed(0)


def torch_mha_copy(ours: MultiHeadAttention) -> nn.MultiheadAttention:
    """PyTorch's multi-head attention holding the same parameters as ours."""
    theirs = nn.MultiheadAttention(D, H, batch_first=True)
    with torch.no_grad():
        theirs.in_proj_weight.copy_(torch.cat([ours.q_proj.weight, ours.k_proj.weight, ours.v_proj.weight]))
        theirs.in_proj_bias.copy_(torch.cat([ours.q_proj.bias, ours.k_proj.bias, ours.v_proj.bias]))
        theirs.out_proj.weight.copy_(ours.out_proj.weight)
        theirs.out_proj.bias.copy_(ours.out_proj.bias)
    return theirs


def padding(lengths, size):
    return padding_mask_from_lengths(torch.tensor(lengths), size)  # (B, size)


# --- multi-head attention against torch.nn.MultiheadAttention ------------------------------------


@pytest.mark.parametrize("need_weights", [True, False])
def test_mha_equals_torch_with_padding_mask(need_weights):
    ours = MultiHeadAttention(D, H)
    theirs = torch_mha_copy(ours)
    x = torch.randn(B, T, D)
    pad = padding([5, 3, 1], T)
    out, weights = ours(x, x, x, mask=key_mask(pad), need_weights=need_weights)
    ref, ref_weights = theirs(x, x, x, key_padding_mask=~pad, average_attn_weights=False)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    if need_weights:
        assert weights.shape == (B, H, T, T)
        torch.testing.assert_close(weights, ref_weights, atol=1e-5, rtol=1e-5)
    else:
        assert weights is None


@pytest.mark.parametrize("need_weights", [True, False])
def test_mha_equals_torch_with_causal_mask(need_weights):
    ours = MultiHeadAttention(D, H)
    theirs = torch_mha_copy(ours)
    x = torch.randn(B, T, D)
    out, weights = ours(x, x, x, mask=causal_mask(T), need_weights=need_weights)
    ref, ref_weights = theirs(x, x, x, attn_mask=~causal_mask(T), average_attn_weights=False)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    if need_weights:
        torch.testing.assert_close(weights, ref_weights, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("need_weights", [True, False])
def test_mha_equals_torch_for_cross_attention(need_weights):
    ours = MultiHeadAttention(D, H)
    theirs = torch_mha_copy(ours)
    decoder_states, memory = torch.randn(B, T, D), torch.randn(B, S, D)  # T != S
    pad = padding([7, 4, 2], S)
    out, weights = ours(decoder_states, memory, memory, mask=key_mask(pad), need_weights=need_weights)
    ref, ref_weights = theirs(
        decoder_states, memory, memory, key_padding_mask=~pad, average_attn_weights=False
    )
    assert out.shape == (B, T, D)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    if need_weights:
        assert weights.shape == (B, H, T, S)
        torch.testing.assert_close(weights, ref_weights, atol=1e-5, rtol=1e-5)


def test_mha_accepts_every_documented_mask_shape():
    mha = MultiHeadAttention(D, H)
    x = torch.randn(B, T, D)
    full = combine_masks(causal_mask(T), key_mask(padding([5, 4, 2], T)))  # (B, 1, T, T)
    expected, _ = mha(x, x, x, mask=full.expand(B, H, T, T), need_weights=True)
    for need_weights in (True, False):
        torch.testing.assert_close(mha(x, x, x, mask=full, need_weights=need_weights)[0], expected)
    keys_only = key_mask(padding([5, 4, 2], T))  # (B, 1, 1, T)
    torch.testing.assert_close(
        mha(x, x, x, mask=keys_only)[0], mha(x, x, x, mask=keys_only.expand(B, H, T, T))[0]
    )
    torch.testing.assert_close(
        mha(x, x, x, mask=causal_mask(T))[0], mha(x, x, x, mask=causal_mask(T)[None, None])[0]
    )
    with pytest.raises(ValueError, match="key_mask"):
        mha(x, x, x, mask=padding([5, 4, 2], T)[:, None, :])  # 3-d would align B with H
    with pytest.raises(ValueError, match="key_mask"):
        mha(x, x, x, mask=padding([5, 4, 2], T))  # a bare (B, S) padding mask is not (T, S)


def test_mha_rejects_d_model_not_divisible_by_heads():
    with pytest.raises(ValueError, match="divisible"):
        MultiHeadAttention(10, 4)


# --- the two scaled dot-product paths --------------------------------------------------------------


def mixed_masks():
    """Masks of every documented shape, including rows with no visible key."""
    pad = padding([7, 3, 0], S)  # the last sequence is all padding
    query_pad = padding([5, 2, 5], T)
    return {
        "none": None,
        "causal (T, S)": causal_mask(T, S),
        "padding (B, 1, 1, S)": key_mask(pad),
        "padding and queries (B, 1, T, S)": combine_masks(key_mask(pad), query_pad[:, None, :, None]),
    }


@pytest.mark.parametrize("name", list(mixed_masks()))
def test_explicit_path_equals_fused_path(name):
    mask = mixed_masks()[name]
    q, k, v = torch.randn(B, H, T, 8), torch.randn(B, H, S, 8), torch.randn(B, H, S, 6)
    explicit, weights = scaled_dot_product_explicit(q, k, v, mask)
    fused = scaled_dot_product_fused(q, k, v, mask)
    assert explicit.shape == fused.shape == (B, H, T, 6) and weights.shape == (B, H, T, S)
    torch.testing.assert_close(explicit, fused, atol=1e-5, rtol=1e-5)


def test_explicit_path_is_the_formula():
    q, k, v = torch.randn(B, H, T, 8), torch.randn(B, H, S, 8), torch.randn(B, H, S, 6)
    out, weights = scaled_dot_product_explicit(q, k, v)
    expected_weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(8), dim=-1)
    torch.testing.assert_close(weights, expected_weights)
    torch.testing.assert_close(out, expected_weights @ v)


def test_masked_softmax_overwrites_only_masked_scores_and_zeroes_them():
    original = torch.randn(2, 3, 4)
    scores = original.clone().requires_grad_()
    mask = torch.tensor([True, False, True, False]).expand(2, 3, 4)
    weights = masked_softmax_(scores.clone(), mask)
    assert (weights[..., 1::2] == 0).all()
    torch.testing.assert_close(weights[..., ::2], torch.softmax(original[..., ::2], dim=-1))
    # Gradients equal those of a softmax over the visible keys only; masked scores get zero.
    upstream = torch.randn(2, 3, 4)
    (grad,) = torch.autograd.grad((weights * upstream).sum(), scores)
    reference = original[..., ::2].clone().requires_grad_()
    (expected,) = torch.autograd.grad((torch.softmax(reference, -1) * upstream[..., ::2]).sum(), reference)
    torch.testing.assert_close(grad[..., ::2], expected)
    assert (grad[..., 1::2] == 0).all()
    in_place = original.clone()
    masked_softmax_(in_place, mask)
    assert torch.equal(in_place[..., ::2], original[..., ::2])  # visible scores are left alone


# --- additive attention ----------------------------------------------------------------------------


def additive_by_formula(attn: AdditiveAttention, query, keys, values, mask):
    """Score every (query, key) pair one at a time with w_v^T tanh(W_q q + W_k k)."""
    W_q, W_k, w_v = attn.query_proj.weight, attn.key_proj.weight, attn.score_proj.weight[0]
    batch, n_queries, n_keys = query.size(0), query.size(1), keys.size(1)
    context = torch.zeros(batch, n_queries, values.size(-1), dtype=query.dtype)
    weights = torch.zeros(batch, n_queries, n_keys, dtype=query.dtype)
    for b in range(batch):
        for t in range(n_queries):
            visible = [s for s in range(n_keys) if mask[b, 0, s]]
            scores = torch.stack([w_v @ torch.tanh(W_q @ query[b, t] + W_k @ keys[b, s]) for s in visible])
            for s, weight in zip(visible, torch.softmax(scores, dim=0)):
                weights[b, t, s] = weight
                context[b, t] += weight * values[b, s]
    return context, weights


def test_additive_attention_equals_the_formula():
    attn = AdditiveAttention(query_size=6, key_size=10, hidden_size=8).double()
    query, keys = torch.randn(B, T, 6, dtype=torch.float64), torch.randn(B, S, 10, dtype=torch.float64)
    values = torch.randn(B, S, 5, dtype=torch.float64)
    mask = key_mask(padding([7, 4, 1], S), n_heads_dim=False)  # (B, 1, S)
    context, weights = attn(query, keys, values, mask=mask)
    expected_context, expected_weights = additive_by_formula(attn, query, keys, values, mask)
    assert context.shape == (B, T, 5) and weights.shape == (B, T, S)
    torch.testing.assert_close(weights, expected_weights)
    torch.testing.assert_close(context, expected_context)


def test_additive_attention_has_no_biases():
    attn = AdditiveAttention(6, 10, 8)
    assert {name for name, _ in attn.named_parameters()} == {
        "query_proj.weight",
        "key_proj.weight",
        "score_proj.weight",
    }


def test_additive_attention_reuses_projected_keys():
    attn = AdditiveAttention(6, 10, 8)
    keys, values = torch.randn(B, S, 10), torch.randn(B, S, 10)
    mask = key_mask(padding([7, 4, 1], S), n_heads_dim=False)
    projected = attn.project_keys(keys)  # once per sentence
    for _ in range(3):  # decoder steps
        query = torch.randn(B, 1, 6)
        full = attn(query, keys, values, mask=mask)
        reused = attn(query, None, values, mask=mask, projected_keys=projected)
        torch.testing.assert_close(reused, full)
    with pytest.raises(ValueError, match="projected_keys"):
        attn(query, None, values)
    with pytest.raises(ValueError, match="3-d"):
        attn(query, keys, values, mask=padding([7, 4, 1], S))


# --- masks: exact zeros, normalised rows, empty rows -----------------------------------------------


def attention_calls():
    """name -> (module, fn(mask) -> (output, weights or None), (B, S) padding -> mask)."""
    additive = AdditiveAttention(D, D, 12)
    mha = MultiHeadAttention(D, H)
    query, memory = torch.randn(B, T, D), torch.randn(B, S, D)
    return {
        "additive": (
            additive,
            lambda m: additive(query, memory, memory, mask=m),
            lambda pad: key_mask(pad, False),
        ),
        "mha explicit": (mha, lambda m: mha(query, memory, memory, mask=m, need_weights=True), key_mask),
        "mha fused": (mha, lambda m: mha(query, memory, memory, mask=m), key_mask),
    }


@pytest.mark.parametrize("name", ["additive", "mha explicit"])
def test_masked_keys_get_exactly_zero_weight_and_rows_sum_to_one(name):
    _, call, lift = attention_calls()[name]
    pad = padding([7, 3, 5], S)
    _, weights = call(lift(pad))
    hidden = ~pad.view(B, *([1] * (weights.dim() - 2)), S).expand_as(weights)
    assert (weights[hidden] == 0).all()
    torch.testing.assert_close(weights.sum(-1), torch.ones(weights.shape[:-1]))


@pytest.mark.parametrize("name", ["additive", "mha explicit", "mha fused"])
def test_fully_masked_rows_give_zeros_and_finite_gradients(name):
    module, call, lift = attention_calls()[name]
    pad = padding([7, 0, 3], S)  # the second sentence has no visible key at all
    out, weights = call(lift(pad))
    assert torch.isfinite(out).all()
    if weights is not None:
        assert (weights[1] == 0).all()
    out.sum().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in module.parameters())


def test_fully_masked_rows_give_zero_output_in_mha():
    mha = MultiHeadAttention(D, H)
    nn.init.normal_(mha.out_proj.bias)  # a query with no key returns zeros, not this bias
    x = torch.randn(B, T, D, requires_grad=True)
    mask = key_mask(padding([0, 5, 2], T))
    for need_weights in (True, False):
        out, _ = mha(x, x, x, mask=mask, need_weights=need_weights)
        assert (out[0] == 0).all()
        (grad,) = torch.autograd.grad(out.sum(), x)
        assert torch.isfinite(grad).all()


# --- gradients ------------------------------------------------------------------------------------


def test_additive_attention_gradcheck():
    attn = AdditiveAttention(3, 4, 5).double()
    query = torch.randn(2, 2, 3, dtype=torch.float64, requires_grad=True)
    keys = torch.randn(2, 3, 4, dtype=torch.float64, requires_grad=True)
    values = torch.randn(2, 3, 2, dtype=torch.float64, requires_grad=True)
    mask = key_mask(padding([3, 2], 3), n_heads_dim=False)
    assert torch.autograd.gradcheck(lambda q, k, v: attn(q, k, v, mask=mask), (query, keys, values))


@pytest.mark.parametrize("need_weights", [True, False])
def test_mha_gradcheck(need_weights):
    mha = MultiHeadAttention(4, 2).double()
    query = torch.randn(2, 3, 4, dtype=torch.float64, requires_grad=True)
    memory = torch.randn(2, 4, 4, dtype=torch.float64, requires_grad=True)
    mask = key_mask(padding([4, 2], 4))

    def fn(q, m):
        out, weights = mha(q, m, m, mask=mask, need_weights=need_weights)
        return (out, weights) if need_weights else out

    assert torch.autograd.gradcheck(fn, (query, memory))


# --- dropout ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("need_weights", [True, False])
def test_mha_dropout_only_in_training_mode(need_weights):
    with_dropout = MultiHeadAttention(D, H, dropout=0.5)
    without = MultiHeadAttention(D, H)
    without.load_state_dict(with_dropout.state_dict())
    x = torch.randn(B, T, D)
    with_dropout.eval()
    eval_out, eval_weights = with_dropout(x, x, x, need_weights=need_weights)
    torch.testing.assert_close(eval_out, without(x, x, x, need_weights=need_weights)[0])
    with_dropout.train()
    train_out, train_weights = with_dropout(x, x, x, need_weights=need_weights)
    assert not torch.allclose(train_out, eval_out)
    if need_weights:  # the returned weights are the distribution itself, before dropout
        torch.testing.assert_close(train_weights, eval_weights)


def test_additive_dropout_only_in_training_mode():
    attn = AdditiveAttention(6, 6, 8, dropout=0.5)
    query, keys = torch.randn(B, T, 6), torch.randn(B, S, 6)
    attn.eval()
    first, second = attn(query, keys, keys), attn(query, keys, keys)
    torch.testing.assert_close(first, second)
    attn.train()
    context, weights = attn(query, keys, keys)
    assert not torch.allclose(context, first[0])
    torch.testing.assert_close(weights, first[1])


# --- room for a key/value cache and causality ----------------------------------------------------


@pytest.mark.parametrize("need_weights", [True, False])
def test_stepwise_self_attention_with_cached_keys_equals_full_causal_pass(need_weights):
    mha = MultiHeadAttention(D, H).eval()
    x = torch.randn(B, T, D)
    full, _ = mha(x, x, x, mask=causal_mask(T))
    cached_k = cached_v = None
    for t in range(T):
        step = x[:, t : t + 1]  # (B, 1, D)
        k, v = mha.project_kv(step, step)  # (B, H, 1, d_k)
        cached_k = k if cached_k is None else torch.cat([cached_k, k], dim=2)
        cached_v = v if cached_v is None else torch.cat([cached_v, v], dim=2)
        out, _ = mha.attend(step, cached_k, cached_v, mask=causal_mask(1, t + 1), need_weights=need_weights)
        torch.testing.assert_close(out[:, 0], full[:, t], atol=1e-5, rtol=1e-5)


def test_several_new_queries_over_cached_keys_use_the_bottom_right_causal_mask():
    mha = MultiHeadAttention(D, H).eval()
    x = torch.randn(B, T, D)
    full, _ = mha(x, x, x, mask=causal_mask(T))
    cached_k, cached_v = mha.project_kv(x[:, :2], x[:, :2])  # two earlier steps
    new = x[:, 2:]  # (B, T - 2, D)
    k, v = mha.project_kv(new, new)
    keys, values = torch.cat([cached_k, k], dim=2), torch.cat([cached_v, v], dim=2)
    for need_weights in (True, False):
        out, _ = mha.attend(new, keys, values, mask=causal_mask(T - 2, T), need_weights=need_weights)
        torch.testing.assert_close(out, full[:, 2:], atol=1e-5, rtol=1e-5)


def test_causal_mask_keeps_earlier_outputs_independent_of_later_inputs():
    mha = MultiHeadAttention(D, H)
    x = torch.randn(B, T, D)
    changed = x.clone()
    changed[:, 3] += 1.0
    before, _ = mha(x, x, x, mask=causal_mask(T))
    after, _ = mha(changed, changed, changed, mask=causal_mask(T))
    torch.testing.assert_close(before[:, :3], after[:, :3])
    assert not torch.allclose(before[:, 3:], after[:, 3:])


# --- causal=True: the triangle without a mask tensor (the fused kernel's is_causal) ---------------


@pytest.mark.parametrize("need_weights", [False, True])
def test_causal_flag_equals_the_explicit_causal_mask(need_weights):
    q, k, v = torch.randn(B, H, T, 8), torch.randn(B, H, T, 8), torch.randn(B, H, T, 6)
    out, _ = scaled_dot_product_attention(q, k, v, causal=True, need_weights=need_weights)
    expected, weights = scaled_dot_product_explicit(q, k, v, causal_mask(T))
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    above_diagonal = ~causal_mask(T).expand_as(weights)
    assert (weights[above_diagonal] == 0).all()
    _, flag_weights = scaled_dot_product_attention(q, k, v, causal=True, need_weights=True)
    assert torch.equal(flag_weights, weights)


@pytest.mark.parametrize("need_weights", [False, True])
def test_causal_flag_with_a_padding_mask_hides_both(need_weights):
    q, k, v = torch.randn(B, H, T, 8), torch.randn(B, H, T, 8), torch.randn(B, H, T, 6)
    pad = key_mask(padding([5, 3, 0], T))  # the last sequence has no visible key
    out, _ = scaled_dot_product_attention(q, k, v, pad, causal=True, need_weights=need_weights)
    expected, _ = scaled_dot_product_explicit(q, k, v, combine_masks(causal_mask(T), pad))
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    assert (out[2] == 0).all()


@pytest.mark.parametrize("need_weights", [False, True])
def test_mha_causal_flag_equals_causal_mask(need_weights):
    mha = MultiHeadAttention(D, H)
    nn.init.normal_(mha.out_proj.bias)  # rows emptied by padding return zeros, not this bias
    x = torch.randn(B, T, D)
    flag, flag_weights = mha(x, x, x, causal=True, need_weights=need_weights)
    mask, mask_weights = mha(x, x, x, mask=causal_mask(T), need_weights=need_weights)
    torch.testing.assert_close(flag, mask, atol=1e-5, rtol=1e-5)
    if need_weights:
        torch.testing.assert_close(flag_weights, mask_weights)
    pad = key_mask(padding([5, 3, 0], T))
    both, _ = mha(x, x, x, mask=pad, causal=True, need_weights=need_weights)
    combined, _ = mha(x, x, x, mask=combine_masks(causal_mask(T), pad), need_weights=need_weights)
    torch.testing.assert_close(both, combined, atol=1e-5, rtol=1e-5)
    assert (both[2] == 0).all()


@pytest.mark.parametrize("need_weights", [False, True])
def test_causal_flag_refuses_more_keys_than_queries(need_weights):
    """``is_causal`` is top-left aligned: wrong for queries after cached keys, so it is refused."""
    q, k, v = torch.randn(B, H, 2, 8), torch.randn(B, H, S, 8), torch.randn(B, H, S, 6)
    with pytest.raises(ValueError, match="causal"):
        scaled_dot_product_attention(q, k, v, causal=True, need_weights=need_weights)
    with pytest.raises(ValueError, match="causal"):
        scaled_dot_product_attention(
            q, k, v, key_mask(padding([7, 4, 2], S)), causal=True, need_weights=need_weights
        )
    mha = MultiHeadAttention(D, H)
    x = torch.randn(B, T, D)
    cached_k, cached_v = mha.project_kv(x, x)  # (B, H, T, d_k): T earlier steps
    new = torch.randn(B, 1, D)
    k, v = mha.project_kv(new, new)
    keys, values = torch.cat([cached_k, k], dim=2), torch.cat([cached_v, v], dim=2)
    with pytest.raises(ValueError, match="causal"):
        mha.attend(new, keys, values, causal=True, need_weights=need_weights)
