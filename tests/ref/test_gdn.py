"""Gated DeltaNet references: recurrent vs chunk form, state carry, chunk alignment, closed
forms, and (when torch + transformers import) transformers' own implementations.

Tolerance: both forms accumulate in float64 and round once to float32, so they agree to a
few float32 ulps; asserted with rtol 1e-5, atol 1e-6 (values are O(1)).
"""
from __future__ import annotations

import numpy as np
import pytest

from luce.ref.conv1d import causal_conv1d
from luce.ref.gated_rmsnorm import gated_rmsnorm
from luce.ref.gdn_chunked import chunk_spans, gdn_chunked
from luce.ref.gdn_recurrent import gdn_recurrent

RTOL, ATOL = 1e-5, 1e-6
LENGTHS = (1, 2, 63, 64, 65, 129)


def gdn_inputs(T: int, seed: int, H: int = 3, Dk: int = 16, Dv: int = 12, zero_state: bool = False):
    """Model-like inputs: q, k unit-norm (q / sqrt(Dk)), g <= 0, beta in (0, 1), random state."""
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((T, H, Dk))
    k = rng.standard_normal((T, H, Dk))
    q /= np.linalg.norm(q, axis=-1, keepdims=True) * np.sqrt(Dk)
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    v = rng.standard_normal((T, H, Dv))
    g = -rng.uniform(0.0, 1.5, (T, H))
    beta = rng.uniform(0.0, 1.0, (T, H))
    state = np.zeros((H, Dk, Dv)) if zero_state else rng.standard_normal((H, Dk, Dv))
    return [a.astype(np.float32) for a in (q, k, v, g, beta, state)]


def close(a, b):
    np.testing.assert_allclose(a, b, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("T", LENGTHS)
@pytest.mark.parametrize("start_pos", [0, 5, 64])
def test_chunked_equals_recurrent(T, start_pos):
    args = gdn_inputs(T, seed=T + start_pos)
    o_r, h_r = gdn_recurrent(*args)
    o_c, h_c = gdn_chunked(*args, start_pos=start_pos)
    close(o_c, o_r)
    close(h_c, h_r)
    assert h_c.dtype == np.float32 and o_c.dtype == np.float32


@pytest.mark.parametrize("split", [1, 30, 64, 100])
@pytest.mark.parametrize("order", ["chunked_then_recurrent", "recurrent_then_chunked"])
def test_state_carried_across_forms_equals_one_call(split, order):
    T = 129
    q, k, v, g, beta, state = gdn_inputs(T, seed=split)
    o_one, h_one = gdn_recurrent(q, k, v, g, beta, state)
    first, second = (gdn_chunked, gdn_recurrent) if order == "chunked_then_recurrent" \
        else (gdn_recurrent, gdn_chunked)
    a, b = slice(0, split), slice(split, T)
    o1, h_mid = first(q[a], k[a], v[a], g[a], beta[a], state)
    kw = {"start_pos": split} if second is gdn_chunked else {}
    o2, h_end = second(q[b], k[b], v[b], g[b], beta[b], h_mid, **kw)
    close(np.concatenate([o1, o2]), o_one)
    close(h_end, h_one)


def test_chunked_segments_at_chunk_multiples_equal_one_call():
    """A prompt cut into segments at multiples of 64 (as the scheduler does) equals one call."""
    T = 200
    q, k, v, g, beta, state = gdn_inputs(T, seed=3)
    o_one, h_one = gdn_chunked(q, k, v, g, beta, state)
    outs, h = [], state
    for a, b in ((0, 64), (64, 192), (192, 200)):
        o, h = gdn_chunked(q[a:b], k[a:b], v[a:b], g[a:b], beta[a:b], h, start_pos=a)
        outs.append(o)
    close(np.concatenate(outs), o_one)
    close(h, h_one)


def test_state_is_f32_between_steps_so_splits_are_bitwise():
    """Recurrent calls split anywhere, and chunked calls split at chunk multiples, give
    bitwise the one-call result (the state is rounded to f32 where a call would end)."""
    T = 150
    q, k, v, g, beta, state = gdn_inputs(T, seed=8)
    for form, cuts in ((gdn_recurrent, (0, 1, 2, 37, 150)), (gdn_chunked, (0, 64, 128, 150))):
        o_one, h_one = form(q, k, v, g, beta, state)
        outs, h = [], state
        for a, b in zip(cuts, cuts[1:]):
            o, h = form(q[a:b], k[a:b], v[a:b], g[a:b], beta[a:b], h)
            outs.append(o)
        np.testing.assert_array_equal(np.concatenate(outs), o_one)
        np.testing.assert_array_equal(h, h_one)


def test_chunk_spans_cut_at_absolute_multiples():
    assert chunk_spans(0, 129) == [(0, 64), (64, 128), (128, 129)]
    assert chunk_spans(5, 130) == [(0, 59), (59, 123), (123, 130)]
    assert chunk_spans(63, 2) == [(0, 1), (1, 2)]
    assert chunk_spans(64, 64) == [(0, 64)]
    assert chunk_spans(10, 3) == [(0, 3)]
    assert chunk_spans(0, 0) == []
    for p in (0, 1, 63, 64, 100):
        spans = chunk_spans(p, 150)
        assert spans[0][0] == 0 and spans[-1][1] == 150
        assert all(end == nxt for (_, end), (nxt, _) in zip(spans, spans[1:]))
        assert all((p + b) % 64 == 0 for _, b in spans[:-1])


@pytest.mark.parametrize("form", [gdn_recurrent, gdn_chunked])
def test_single_token_from_zero_state_closed_form(form):
    """h = k (beta v)^T, so o = (q . k) beta v and the state is that outer product."""
    q, k, v, g, beta, state = gdn_inputs(1, seed=9, zero_state=True)
    o, h = form(q, k, v, g, beta, state)
    qk = np.einsum("thd,thd->th", q.astype(np.float64), k)
    close(o[0], (qk[0] * beta[0])[:, None] * v[0])
    close(h, k[0][:, :, None] * (beta[0][:, None] * v[0])[:, None, :])


@pytest.mark.parametrize("form", [gdn_recurrent, gdn_chunked])
def test_zero_beta_only_decays_the_state(form):
    """beta = 0 writes nothing: state * exp(sum g); o_t = exp(G_t) S^T q_t."""
    q, k, v, g, beta, state = gdn_inputs(70, seed=4)
    beta[:] = 0
    o, h = form(q, k, v, g, beta, state)
    G = np.cumsum(g.astype(np.float64), axis=0)                       # [T, H]
    expect_o = np.exp(G)[:, :, None] * np.einsum("hkv,thk->thv", state.astype(np.float64), q)
    close(o, expect_o)
    close(h, np.exp(G[-1])[:, None, None] * state)


def test_beta_one_overwrites_the_key_direction():
    """With beta = 1 and g = 0 the state maps k to v exactly after the write."""
    q, k, v, g, beta, state = gdn_inputs(1, seed=5)
    g[:] = 0
    beta[:] = 1
    _, h = gdn_recurrent(q, k, v, g, beta, state)
    close(np.einsum("hkv,hk->hv", h.astype(np.float64), k[0]), v[0])


def test_inputs_not_modified_and_shapes_checked():
    args = gdn_inputs(5, seed=1)
    copies = [a.copy() for a in args]
    gdn_chunked(*args)
    gdn_recurrent(*args)
    for a, c in zip(args, copies):
        np.testing.assert_array_equal(a, c)
    q, k, v, g, beta, state = args
    with pytest.raises(ValueError, match="state"):
        gdn_recurrent(q, k, v, g, beta, state[:, :, :-1])
    with pytest.raises(ValueError, match="beta"):
        gdn_chunked(q, k, v, g, beta[:, :1], state)


# ---- causal conv1d and gated RMSNorm ------------------------------------------------------

@pytest.mark.parametrize("T", [1, 2, 7, 65])
def test_conv1d_matches_direct_formula_and_carries_state(T):
    rng = np.random.default_rng(T)
    C, K = 10, 4
    x = rng.standard_normal((T, C)).astype(np.float32)
    w = rng.standard_normal((C, K)).astype(np.float32)
    state = rng.standard_normal((K - 1, C)).astype(np.float32)
    y, new_state = causal_conv1d(x, w, state, silu=False)
    full = np.concatenate([state, x]).astype(np.float64)
    expect = np.stack([sum(w[:, j] * full[t + j] for j in range(K)) for t in range(T)])
    close(y, expect)
    np.testing.assert_array_equal(new_state, full[-(K - 1):].astype(np.float32))
    y_silu, _ = causal_conv1d(x, w, state)
    close(y_silu, expect / (1 + np.exp(-expect)))
    # one token at a time, carrying the state, equals one call
    rows, s = [], state
    for t in range(T):
        r, s = causal_conv1d(x[t:t + 1], w, s)
        rows.append(r)
    close(np.concatenate(rows), y_silu)
    np.testing.assert_array_equal(s, new_state)


def test_gated_rmsnorm_formula():
    rng = np.random.default_rng(0)
    x, z = rng.standard_normal((2, 5, 8)).astype(np.float32)
    w = rng.standard_normal(8).astype(np.float32)
    x64, z64 = x.astype(np.float64), z.astype(np.float64)
    expect = x64 / np.sqrt((x64 ** 2).mean(-1, keepdims=True) + 1e-6) * w * z64 / (1 + np.exp(-z64))
    close(gated_rmsnorm(x, z, w, 1e-6), expect)


# ---- transformers' implementations (oracle), when installed -------------------------------

def _hf_module():
    pytest.importorskip("torch")
    return pytest.importorskip("transformers.models.qwen3_5.modeling_qwen3_5")


@pytest.mark.parametrize("T", [1, 65, 129])
@pytest.mark.parametrize("hf_fn", ["torch_recurrent_gated_delta_rule", "torch_chunk_gated_delta_rule"])
def test_matches_transformers_gated_delta_rule(T, hf_fn):
    mod = _hf_module()
    import torch

    rng = np.random.default_rng(T)
    H, Dk, Dv = 4, 16, 8
    raw_q, raw_k = rng.standard_normal((2, T, H, Dk)).astype(np.float32)
    v = rng.standard_normal((T, H, Dv)).astype(np.float32)
    g = -rng.uniform(0, 1.5, (T, H)).astype(np.float32)
    beta = rng.uniform(0, 1, (T, H)).astype(np.float32)
    state = rng.standard_normal((H, Dk, Dv)).astype(np.float32)
    t = lambda a: torch.from_numpy(a)[None]  # noqa: E731  batch of one
    o_hf, h_hf = getattr(mod, hf_fn)(t(raw_q), t(raw_k), t(v), g=t(g), beta=t(beta),
                                    initial_state=t(state), output_final_state=True,
                                    use_qk_l2norm_in_kernel=True)
    q = raw_q / np.sqrt((raw_q.astype(np.float64) ** 2).sum(-1, keepdims=True) + 1e-6) / np.sqrt(Dk)
    k = raw_k / np.sqrt((raw_k.astype(np.float64) ** 2).sum(-1, keepdims=True) + 1e-6)
    args = (q.astype(np.float32), k.astype(np.float32), v, g, beta, state)
    for form in (gdn_recurrent, gdn_chunked):
        o, h = form(*args)
        np.testing.assert_allclose(o, o_hf[0].numpy(), rtol=1e-4, atol=2e-5)
        np.testing.assert_allclose(h, h_hf[0].numpy(), rtol=1e-4, atol=2e-5)


def test_conv1d_and_gated_norm_match_transformers():
    mod = _hf_module()
    import torch

    rng = np.random.default_rng(1)
    T, C, K = 9, 12, 4
    x = rng.standard_normal((T, C)).astype(np.float32)
    w = rng.standard_normal((C, K)).astype(np.float32)
    y_hf = mod.causal_conv1d_fn(torch.from_numpy(x.T.copy())[None], torch.from_numpy(w),
                                activation="silu")[0].numpy().T
    y, _ = causal_conv1d(x, w, np.zeros((K - 1, C), np.float32))
    np.testing.assert_allclose(y, y_hf, rtol=1e-5, atol=1e-6)

    norm = mod.Qwen3_5RMSNormGated(8, eps=1e-6)
    weight = rng.standard_normal(8).astype(np.float32)
    with torch.no_grad():
        norm.weight.copy_(torch.from_numpy(weight))
        xs, zs = rng.standard_normal((2, 6, 8)).astype(np.float32)
        ref = norm(torch.from_numpy(xs), torch.from_numpy(zs)).numpy()
    np.testing.assert_allclose(gated_rmsnorm(xs, zs, weight, 1e-6), ref, rtol=1e-5, atol=1e-6)
