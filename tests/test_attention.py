import math

import pytest
import torch
from torch import nn

from models.attention import (
    AdditiveAttention,
    GeneralAttention,
    MultiHeadAttention,
    ScaledDotAttention,
    causal_mask,
    combine_masks,
    key_mask,
    masked_softmax,
)
from models.config import RNNConfig, TransformerConfig

B, T, S, D, H = 3, 5, 7, 16, 4


pytestmark = pytest.mark.usefixtures("seed")  # torch seeded before each test (conftest.py)


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
    """``(B, size)``: True at the first ``lengths[b]`` positions of each row."""
    return torch.arange(size) < torch.tensor(lengths).unsqueeze(1)  # (B, size)


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


# --- the two paths of the scaled dot product: explicit (with the weights) and the fused kernel -----


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


@pytest.mark.parametrize("qk_norm", [False, True])
@pytest.mark.parametrize("name", list(mixed_masks()))
def test_explicit_path_equals_fused_path(name, qk_norm):
    mask = mixed_masks()[name]
    mha = MultiHeadAttention(D, H, qk_norm=qk_norm)
    nn.init.normal_(mha.out_proj.bias)
    query, memory = torch.randn(B, T, D), torch.randn(B, S, D)
    explicit, weights = mha(query, memory, memory, mask, need_weights=True)
    fused, none = mha(query, memory, memory, mask)
    assert explicit.shape == fused.shape == (B, T, D) and weights.shape == (B, H, T, S) and none is None
    torch.testing.assert_close(explicit, fused, atol=1e-5, rtol=1e-5)


def test_masked_softmax_overwrites_only_masked_scores_and_zeroes_them():
    original = torch.randn(2, 3, 4)
    scores = original.clone().requires_grad_()
    mask = torch.tensor([True, False, True, False]).expand(2, 3, 4)
    weights = masked_softmax(scores.clone(), mask)
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
    masked_softmax(in_place, mask)
    assert torch.equal(in_place[..., ::2], original[..., ::2])  # visible scores are left alone


# --- every function against its formula, computed by hand --------------------------------------

SINGLE_HEAD = {  # name -> (module of query size 6 and key size 10, a(q, k) for one query and one key)
    "additive": (
        lambda: AdditiveAttention(query_size=6, key_size=10, d_a=8),
        lambda m, q, k: m.score_proj.weight[0] @ torch.tanh(m.query_proj.weight @ q + m.key_proj.weight @ k),
    ),
    "general": (
        lambda: GeneralAttention(query_size=6, key_size=10),
        lambda m, q, k: q @ (m.key_proj.weight @ k),
    ),
    "scaled_dot": (
        lambda: ScaledDotAttention(query_size=6, key_size=10, d_k=8),
        lambda m, q, k: (m.query_proj.weight @ q) @ (m.key_proj.weight @ k) / math.sqrt(8),
    ),
    # qk_norm (Henry et al. 2020): g times the cosine of query and key
    "general, qk_norm": (
        lambda: GeneralAttention(query_size=6, key_size=10, qk_norm=True),
        lambda m, q, k: m.qk_scale * unit(q) @ unit(m.key_proj.weight @ k),
    ),
    "scaled_dot, qk_norm": (
        lambda: ScaledDotAttention(query_size=6, key_size=10, d_k=8, qk_norm=True),
        lambda m, q, k: m.qk_scale * unit(m.query_proj.weight @ q) @ unit(m.key_proj.weight @ k),
    ),
}


def unit(x):
    """``x / ||x||``: a vector of length 1."""
    return x / torch.sqrt((x * x).sum())


def softmax_by_hand(scores: dict) -> dict:
    """key index -> weight, from key index -> score (an empty dict when no key is visible)."""
    if not scores:
        return {}
    top = max(float(v.detach()) for v in scores.values())
    exps = {s: torch.exp(v - top) for s, v in scores.items()}
    total = sum(exps.values())
    return {s: e / total for s, e in exps.items()}


def by_hand(score, values, visible, n_queries, n_keys):
    """Weights ``(T, S)`` and outputs ``(T, d_v)`` of one sentence (and head) one pair at a time:
    ``score(t, s)``, ``values`` ``(S, d_v)``, ``visible(t, s)``; a row with no visible key is zero."""
    weights = torch.zeros(n_queries, n_keys, dtype=values.dtype)
    out = torch.zeros(n_queries, values.size(-1), dtype=values.dtype)
    for t in range(n_queries):
        row = softmax_by_hand({s: score(t, s) for s in range(n_keys) if visible(t, s)})
        for s, weight in row.items():
            weights[t, s] = weight
            out[t] += weight * values[s]
    return weights, out


def hand_masks(n_queries: int, n_keys: int) -> dict:
    """Masks of every shape a layer passes, each with rows that have no visible key."""
    keys = padding([n_keys, 3, 0], n_keys)  # the last sentence is all padding
    queries = padding([n_queries, 2, n_queries], n_queries)
    return {
        "padding": key_mask(keys),  # (B, 1, 1, S)
        "padding and queries": combine_masks(key_mask(keys), queries[:, None, :, None]),  # (B, 1, T, S)
        "causal and padding": combine_masks(causal_mask(n_queries, n_keys), key_mask(keys)),  # (B, 1, T, S)
    }


@pytest.mark.parametrize("mask_name", ["padding", "padding and queries", "causal and padding"])
@pytest.mark.parametrize("name", list(SINGLE_HEAD))
def test_single_head_functions_equal_their_formula(name, mask_name):
    build, score = SINGLE_HEAD[name]
    attn = build().double()
    query, keys = torch.randn(B, T, 6, dtype=torch.float64), torch.randn(B, S, 10, dtype=torch.float64)
    values = torch.randn(B, S, 5, dtype=torch.float64)
    mask = hand_masks(T, S)[mask_name]
    out, weights = attn(query, keys, values, mask=mask, need_weights=True)
    assert out.shape == (B, T, 5) and weights.shape == (B, 1, T, S)
    full = mask.expand(B, 1, T, S)
    for b in range(B):
        expected_weights, expected_out = by_hand(
            lambda t, s, b=b: score(attn, query[b, t], keys[b, s]),
            values[b],
            lambda t, s, b=b: bool(full[b, 0, t, s]),
            T,
            S,
        )
        torch.testing.assert_close(weights[b, 0], expected_weights)
        torch.testing.assert_close(out[b], expected_out)
    assert (out[2] == 0).all() and (weights[2] == 0).all()  # no visible key: zeros, no NaN


def multi_head_by_hand(mha, query, key, value, visible, additive: bool):
    """``W_O [head_1; ...; head_H] + b_O`` of one sentence, each head scored pair by pair; a query
    with no visible key returns zeros."""
    d_k, heads = mha.d_k, []
    q_all = query @ mha.q_proj.weight.T + mha.q_proj.bias  # (T, D)
    k_all = key @ mha.k_proj.weight.T + mha.k_proj.bias  # (S, D)
    v_all = value @ mha.v_proj.weight.T + mha.v_proj.bias  # (S, D)
    weights = []
    for h in range(mha.n_heads):
        part = slice(h * d_k, (h + 1) * d_k)
        q, k, v = q_all[:, part], k_all[:, part], v_all[:, part]
        if additive:
            w_v = mha.score_proj[h]
            score = lambda t, s, q=q, k=k, w_v=w_v: w_v @ torch.tanh(q[t] + k[s])  # noqa: E731
        elif mha.qk_norm:
            score = lambda t, s, q=q, k=k: mha.qk_scale * unit(q[t]) @ unit(k[s])  # noqa: E731
        else:
            score = lambda t, s, q=q, k=k: q[t] @ k[s] / math.sqrt(d_k)  # noqa: E731
        head_weights, head_out = by_hand(score, v, visible, query.size(0), key.size(0))
        weights.append(head_weights)
        heads.append(head_out)
    out = torch.cat(heads, dim=-1) @ mha.out_proj.weight.T + mha.out_proj.bias  # (T, D)
    empty = [t for t in range(query.size(0)) if not any(visible(t, s) for s in range(key.size(0)))]
    out[empty] = 0
    return torch.stack(weights), out  # (H, T, S), (T, D)


MULTI_HEAD = {  # name -> a multi-head module
    "scaled_dot": lambda: MultiHeadAttention(D, H),  # the Transformer's: every size d_model
    "additive": lambda: MultiHeadAttention(D, H, score="additive"),
    # the RNN's multihead: a decoder state of 6 attends over encoder states of 10 and returns 10
    "scaled_dot, the RNN's sizes": lambda: MultiHeadAttention(8, 2, query_size=6, key_size=10, out_size=10),
    "scaled_dot, qk_norm": lambda: MultiHeadAttention(D, H, qk_norm=True),
}


def test_qk_norm_learns_its_scale_from_log2_of_l_squared_minus_l():
    """g starts at log2(32^2 - 32) (Henry et al.'s initial value at a length of 32) and is trained."""
    mha = MultiHeadAttention(D, H, qk_norm=True)
    assert mha.qk_scale.item() == pytest.approx(math.log2(32**2 - 32))
    x = torch.randn(B, T, D)
    mha(x, x, x)[0].pow(2).sum().backward()
    assert mha.qk_scale.grad is not None and mha.qk_scale.grad != 0
    with pytest.raises(ValueError, match="qk_norm"):
        MultiHeadAttention(D, H, score="additive", qk_norm=True)
    assert not hasattr(MultiHeadAttention(D, H), "qk_scale")  # off: the parameters are as before
    for config in (RNNConfig, TransformerConfig):
        with pytest.raises(
            ValueError, match="model.qk_norm normalises the queries and keys of a dot product"
        ):
            config(attention="additive", qk_norm=True)


@pytest.mark.parametrize("mask_name", ["padding", "padding and queries", "causal and padding"])
@pytest.mark.parametrize("name", list(MULTI_HEAD))
def test_multi_head_functions_equal_their_formula(name, mask_name):
    mha = MULTI_HEAD[name]().double()
    nn.init.normal_(mha.out_proj.bias)  # an empty row returns zeros, not this bias
    query = torch.randn(B, T, mha.q_proj.in_features, dtype=torch.float64)
    memory = torch.randn(B, S, mha.k_proj.in_features, dtype=torch.float64)
    mask = hand_masks(T, S)[mask_name]
    full = mask.expand(B, 1, T, S)
    for need_weights in (True, False):
        out, weights = mha(query, memory, memory, mask=mask, need_weights=need_weights)
        for b in range(B):
            expected_weights, expected_out = multi_head_by_hand(
                mha,
                query[b],
                memory[b],
                memory[b],
                lambda t, s, b=b: bool(full[b, 0, t, s]),
                mha.additive,
            )
            torch.testing.assert_close(out[b], expected_out)
            if need_weights:
                torch.testing.assert_close(weights[b], expected_weights)
        assert (out[2] == 0).all()


@pytest.mark.parametrize("need_weights", [True, False])
def test_multi_head_additive_causal_flag_equals_the_causal_mask(need_weights):
    mha = MultiHeadAttention(D, H, score="additive")
    x = torch.randn(B, T, D)
    flag, _ = mha(x, x, x, causal=True, need_weights=need_weights)
    mask, _ = mha(x, x, x, mask=causal_mask(T), need_weights=need_weights)
    torch.testing.assert_close(flag, mask)
    pad = key_mask(padding([5, 3, 0], T))
    both, _ = mha(x, x, x, mask=pad, causal=True, need_weights=need_weights)
    torch.testing.assert_close(both, mha(x, x, x, mask=combine_masks(causal_mask(T), pad))[0])
    assert (both[2] == 0).all()


def test_additive_attention_has_no_biases():
    attn = AdditiveAttention(6, 10, 8)
    assert {name for name, _ in attn.named_parameters()} == {
        "query_proj.weight",
        "key_proj.weight",
        "score_proj.weight",
    }


@pytest.mark.parametrize("name", list(SINGLE_HEAD))
def test_single_head_functions_reuse_projected_keys(name):
    attn = SINGLE_HEAD[name][0]()
    keys, values = torch.randn(B, S, 10), torch.randn(B, S, 10)
    mask = key_mask(padding([7, 4, 1], S))
    k, v = attn.project_kv(keys, values)  # once per sentence
    assert k.shape[:3] == (B, 1, S) and v.shape == (B, 1, S, 10)
    for _ in range(3):  # decoder steps
        query = torch.randn(B, 1, 6)
        full = attn(query, keys, values, mask=mask, need_weights=True)
        reused = attn.attend(query, k, v, mask=mask, need_weights=True)
        torch.testing.assert_close(reused, full)
    with pytest.raises(ValueError, match="key_mask"):
        attn.attend(query, k, v, mask=padding([7, 4, 1], S))  # a bare (B, S) padding mask


# --- masks: exact zeros, normalised rows, empty rows -----------------------------------------------


def attention_calls():
    """name -> (module, fn(mask) -> (output, weights or None)) for a (B, 1, 1, S) key mask."""
    additive = AdditiveAttention(D, D, 12)
    mha = MultiHeadAttention(D, H)
    mh_additive = MultiHeadAttention(D, H, score="additive")
    query, memory = torch.randn(B, T, D), torch.randn(B, S, D)
    return {
        "additive": (additive, lambda m: additive(query, memory, memory, mask=m, need_weights=True)),
        "mha explicit": (mha, lambda m: mha(query, memory, memory, mask=m, need_weights=True)),
        "mha fused": (mha, lambda m: mha(query, memory, memory, mask=m)),
        "mha additive": (
            mh_additive,
            lambda m: mh_additive(query, memory, memory, mask=m, need_weights=True),
        ),
    }


@pytest.mark.parametrize("name", ["additive", "mha explicit", "mha additive"])
def test_masked_keys_get_exactly_zero_weight_and_rows_sum_to_one(name):
    _, call = attention_calls()[name]
    pad = padding([7, 3, 5], S)
    _, weights = call(key_mask(pad))
    hidden = ~pad.view(B, *([1] * (weights.dim() - 2)), S).expand_as(weights)
    assert (weights[hidden] == 0).all()
    torch.testing.assert_close(weights.sum(-1), torch.ones(weights.shape[:-1]))


@pytest.mark.parametrize("name", ["additive", "mha explicit", "mha fused", "mha additive"])
def test_fully_masked_rows_give_zeros_and_finite_gradients(name):
    module, call = attention_calls()[name]
    pad = padding([7, 0, 3], S)  # the second sentence has no visible key at all
    out, weights = call(key_mask(pad))
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
    mask = key_mask(padding([3, 2], 3))
    assert torch.autograd.gradcheck(
        lambda q, k, v: attn(q, k, v, mask=mask, need_weights=True), (query, keys, values)
    )


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
    first, second = attn(query, keys, keys, need_weights=True), attn(query, keys, keys, need_weights=True)
    torch.testing.assert_close(first, second)
    attn.train()
    context, weights = attn(query, keys, keys, need_weights=True)
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
def test_causal_flag_hides_the_future_as_the_explicit_causal_mask_does(need_weights):
    mha = MultiHeadAttention(D, H)
    x = torch.randn(B, T, D)
    out, _ = mha(x, x, x, causal=True, need_weights=need_weights)
    expected, weights = mha(x, x, x, causal_mask(T), need_weights=True)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    assert (weights[~causal_mask(T).expand_as(weights)] == 0).all()
    _, flag_weights = mha(x, x, x, causal=True, need_weights=True)
    assert torch.equal(flag_weights, weights)


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
    mha = MultiHeadAttention(D, H)
    query, memory = torch.randn(B, 2, D), torch.randn(B, S, D)
    with pytest.raises(ValueError, match="causal"):
        mha(query, memory, memory, causal=True, need_weights=need_weights)
    with pytest.raises(ValueError, match="causal"):
        mha(query, memory, memory, key_mask(padding([7, 4, 2], S)), causal=True, need_weights=need_weights)
    x = torch.randn(B, T, D)
    cached_k, cached_v = mha.project_kv(x, x)  # (B, H, T, d_k): T earlier steps
    new = torch.randn(B, 1, D)
    k, v = mha.project_kv(new, new)
    keys, values = torch.cat([cached_k, k], dim=2), torch.cat([cached_v, v], dim=2)
    with pytest.raises(ValueError, match="causal"):
        mha.attend(new, keys, values, causal=True, need_weights=need_weights)
