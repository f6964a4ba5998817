"""The host backends, numpy (the reference) and cpu (C kernels): each op against an
independent formulation, and every op's batch invariance: a row's result alone, at any
position, in any batch is bitwise the same on the cpu backend and equal within rounding on
numpy (whose arithmetic, BLAS included, promises no bitwise property)."""
from __future__ import annotations

import numpy as np
import pytest

from luce.models.packer import SegmentSpec, build_batch
from luce.models.kv_cache import PAGE_SIZE, PagedKV
from luce.ops import get_backend
from luce.ops.api import Backend
from luce.ref.rotary import imrope_section_of_pair



@pytest.fixture(params=["numpy", "cpu"])
def B(request):
    return get_backend(request.param, threads=2) if request.param == "cpu" else get_backend("numpy")


def same(B, got, want, what=""):
    """Bitwise on the cpu backend; within f32 rounding on numpy."""
    if B.name == "cpu":
        assert np.array_equal(np.asarray(got), np.asarray(want)), what
    else:
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7, err_msg=str(what))


def rng(seed=0):
    return np.random.default_rng(seed)


def randn(r, *shape, scale=1.0):
    return (r.standard_normal(shape) * scale).astype(np.float32)


def test_backend_satisfies_protocol(B):
    assert isinstance(B, Backend)


# ---- matmul ------------------------------------------------------------------------------

def test_matmul_matches_float64_and_adds_bias(B):
    r = rng(2)
    x, w, bias = randn(r, 21, 70), randn(r, 33, 70), randn(r, 33)
    want = x.astype(np.float64) @ w.T.astype(np.float64) + bias
    np.testing.assert_allclose(B.matmul(x, B.weight_from_array(w), bias), want, rtol=1e-5, atol=1e-5)


def test_matmul_rejects_shape_mismatch(B):
    with pytest.raises(ValueError, match="matmul wants|does not match the weight"):
        B.matmul(np.zeros((2, 3), np.float32), np.zeros((4, 5), np.float32))


def test_weight_rows_is_the_first_output_columns(B):
    """weight_rows(w, n): a view of w's first n rows; its matmul is the full matmul's first n
    columns (bitwise on the cpu backend: a column's reduction never depends on the others)."""
    from gguf import GGMLQuantizationType as Q

    from luce.gguf import quants

    r = rng(9)
    x = randn(r, 5, 256)
    full = B.weight_from_array(randn(r, 40, 256))
    quant = quants.quantize(randn(r, 40, 256), Q.Q4_K)
    weights = [full] if B.name == "numpy" else [full, B._weight(quant, int(Q.Q4_K), (40, 256), "q4k")]
    for w in weights:
        cut = B.weight_rows(w, 17)
        assert cut.shape == (17, 256)
        same(B, B.matmul(x, cut), np.asarray(B.matmul(x, w))[:, :17])
        with pytest.raises(ValueError, match="weight_rows"):
            B.weight_rows(w, 41)


# ---- elementwise and norms ----------------------------------------------------------------

def _rowwise_invariant(B, fn, x):
    whole = fn(x)
    for i in (0, len(x) // 2, len(x) - 1):
        same(B, fn(x[i:i + 1])[0], whole[i], i)


def test_rowwise_ops_are_batch_invariant(B):
    r = rng(3)
    x, z, w = randn(r, 33, 96), randn(r, 33, 96), randn(r, 96)
    _rowwise_invariant(B, lambda a: B.rmsnorm(a, w, 1e-6), x)
    _rowwise_invariant(B, lambda a: B.l2norm(a, 1e-6), x)
    _rowwise_invariant(B, lambda a: B.swiglu(a, a[:, ::-1].copy()), x)
    _rowwise_invariant(B, B.silu, x)
    _rowwise_invariant(B, B.sigmoid, x)
    _rowwise_invariant(B, B.softplus, x)
    _rowwise_invariant(B, B.exp, x)
    _rowwise_invariant(B, lambda a: B.add(a, w), x)
    _rowwise_invariant(B, lambda a: B.mul(a, w), x)
    _rowwise_invariant(B, lambda a: B.rmsnorm(a.reshape(len(a), 12, 8), w[:8], 1e-6), x)


def test_elementwise_values(B):
    x = np.array([-30.0, -1.0, 0.0, 2.0, 40.0], np.float32)
    sig = 1 / (1 + np.exp(-x.astype(np.float64)))
    np.testing.assert_allclose(B.sigmoid(x), sig, rtol=1e-6)
    np.testing.assert_allclose(B.silu(x), x * sig, rtol=1e-6)
    np.testing.assert_allclose(B.swiglu(x, x + 1), x * sig * (x + 1), rtol=1e-6)
    np.testing.assert_allclose(B.softplus(x), np.log1p(np.exp(x.astype(np.float64))), rtol=1e-6)
    y = B.l2norm(np.array([[3.0, 4.0]], np.float32), 0.0)
    np.testing.assert_allclose(y, [[0.6, 0.8]], rtol=1e-6)


def test_split_take_rows_embedding(B):
    x = np.arange(24, dtype=np.float32).reshape(4, 6)
    a, b = B.split(x, [2, 4])
    assert np.array_equal(a, x[:, :2]) and np.array_equal(b, x[:, 2:]) and b.flags.c_contiguous
    assert np.array_equal(B.take_rows(x, np.array([3, 0])), x[[3, 0]])
    dst = x.copy()
    B.put_rows(dst, np.array([3, 0]), x[[1, 2]])
    assert np.array_equal(dst, x[[2, 1, 2, 1]])
    with pytest.raises(IndexError, match="outside"):
        B.put_rows(dst, np.array([4]), x[:1])
    with pytest.raises(ValueError, match="is not 2 rows"):
        B.put_rows(dst, np.array([0, 1]), x[:1])
    assert np.array_equal(B.concat_rows([x[:1], x[1:3], x[3:]]), x)
    assert np.array_equal(B.embedding(x, np.array([2, 2, 1])), x[[2, 2, 1]])
    with pytest.raises(IndexError):
        B.embedding(x, np.array([4]))
    with pytest.raises(ValueError, match="do not add up"):
        B.split(x, [2, 3])


# ---- rotary --------------------------------------------------------------------------------

def rotate_half_rope(x, pos, rope_dim, theta):
    """transformers' formulation: cat(freqs, freqs), x * cos + rotate_half(x) * sin."""
    inv = 1.0 / theta ** (np.arange(0, rope_dim, 2, dtype=np.float64) / rope_dim)
    emb = np.concatenate([np.outer(pos, inv)] * 2, axis=-1)[:, None, :]
    xr = x[..., :rope_dim].astype(np.float64)
    half = rope_dim // 2
    rot = np.concatenate([-xr[..., half:], xr[..., :half]], axis=-1)
    out = x.astype(np.float64).copy()
    out[..., :rope_dim] = xr * np.cos(emb) + rot * np.sin(emb)
    return out


@pytest.mark.parametrize("rope_dim,d", [(16, 16), (8, 32), (64, 256)])
def test_rope_matches_rotate_half_and_partial_dims_pass_through(B, rope_dim, d):
    r = rng(rope_dim)
    x = randn(r, 9, 3, d)
    pos = np.array([0, 1, 2, 7, 100, 1000, 4095, 30000, 5])
    y = B.rope(x, pos, rope_dim, 1e6)
    np.testing.assert_allclose(y, rotate_half_rope(x, pos, rope_dim, 1e6), rtol=1e-5, atol=1e-5)
    assert np.array_equal(y[..., rope_dim:], x[..., rope_dim:])
    assert np.array_equal(B.rope(x[:1], pos[:1], rope_dim, 1e6), x[:1])  # position 0 is identity


def test_rope_row_invariance_at_its_position(B):
    r = rng(5)
    x, pos = randn(r, 12, 2, 32), np.arange(40, 52)
    whole = B.rope(x, pos, 32, 1e4)
    for i in range(12):
        same(B, B.rope(x[i:i + 1], pos[i:i + 1], 32, 1e4)[0], whole[i], i)


def test_rope_dot_products_depend_on_relative_position_only(B):
    r = rng(6)
    q, k = randn(r, 1, 1, 32), randn(r, 1, 1, 32)
    dots = [float((B.rope(q, np.array([p + 5]), 32, 1e4) * B.rope(k, np.array([p]), 32, 1e4)).sum())
            for p in (0, 17, 300)]
    np.testing.assert_allclose(dots, dots[0], rtol=1e-5)


def hf_interleaved_sections(n_pairs, mrope_section):
    """transformers Qwen3.5 recomposition: t everywhere, then h on pairs 1::3 below 3*s_h
    and w on pairs 2::3 below 3*s_w."""
    which = np.zeros(n_pairs, dtype=np.int64)
    for axis, offset in ((1, 1), (2, 2)):
        which[slice(offset, mrope_section[axis] * 3, 3)] = axis
    return which


def test_imrope_section_map_matches_transformers_layout(B):
    assert np.array_equal(imrope_section_of_pair(32, [11, 11, 10, 0]), hf_interleaved_sections(32, [11, 11, 10]))
    # llama.cpp's rule beyond the h/w ranges: t while sector < 3*s_t, else the 4th (e) position
    assert imrope_section_of_pair(8, [2, 1, 1, 0]).tolist() == [0, 1, 2, 0, 0, 1, 2, 0]
    assert imrope_section_of_pair(4, [1, 1, 2, 0]).tolist() == [0, 1, 2, 3]


def test_imrope_with_equal_positions_is_plain_rope(B):
    r = rng(7)
    x = randn(r, 6, 4, 256)
    pos = np.array([0, 3, 64, 999, 12345, 2])
    plain = B.rope(x, pos, 64, 1e7)
    same(B, B.rope(x, pos, 64, 1e7, sections=[11, 11, 10, 0]), plain)
    pos4 = np.repeat(pos[:, None], 4, axis=1)
    same(B, B.rope(x, pos4, 64, 1e7, sections=[11, 11, 10, 0]), plain)


def test_imrope_uses_each_sections_position(B):
    r = rng(8)
    x = randn(r, 1, 1, 64)
    pos4 = np.array([[5, 9, 13, 0]])
    y = B.rope(x, pos4, 64, 1e4, sections=[11, 11, 10, 0])
    which = hf_interleaved_sections(32, [11, 11, 10])
    for axis in range(3):
        plain = B.rope(x, pos4[:, axis], 64, 1e4)
        pairs = np.nonzero(which == axis)[0]
        cols = np.concatenate([pairs, pairs + 32])
        same(B, y[..., cols], plain[..., cols], axis)


# ---- attention -----------------------------------------------------------------------------

def naive_attention(q, k, v, scale, causal=True):
    """One sequence, no paging: q [n, Hq, D] are the last n of the kv_len keys."""
    n, hq, d = q.shape
    L, hkv, _ = k.shape
    g = hq // hkv
    out = np.zeros((n, hq, d))
    for i in range(n):
        visible = L - n + i + 1 if causal else L
        for h in range(hq):
            s = k[:visible, h // g].astype(np.float64) @ q[i, h].astype(np.float64) * scale
            p = np.exp(s - s.max())
            out[i, h] = (p / p.sum()) @ v[:visible, h // g]
    return out


def scattered_pages(r, n_pages_total, n):
    return [int(p) for p in r.permutation(n_pages_total)[:n]]


def test_attention_matches_naive_gqa_over_scattered_pages(B):
    r = rng(9)
    hq, hkv, d, kv_len, n_rows = 6, 2, 16, 37, 5
    kv = PagedKV(12, hkv, d)
    pages = scattered_pages(r, 12, 3)
    k_all, v_all, q = randn(r, kv_len, hkv, d), randn(r, kv_len, hkv, d), randn(r, n_rows, hq, d)
    prior = build_batch([SegmentSpec(0, [0] * (kv_len - n_rows), 0, pages)])
    B.kv_write(kv, prior, k_all[:kv_len - n_rows], v_all[:kv_len - n_rows])
    batch = build_batch([SegmentSpec(0, [0] * n_rows, kv_len - n_rows, pages)])
    B.kv_write(kv, batch, k_all[kv_len - n_rows:], v_all[kv_len - n_rows:])
    got_k, got_v = kv.gather_sequence(np.array(pages), kv_len)
    assert np.array_equal(got_k, k_all) and np.array_equal(got_v, v_all)
    for causal in (True, False):
        got = B.attention(q, kv, batch, 0.25, causal)
        np.testing.assert_allclose(got, naive_attention(q, k_all, v_all, 0.25, causal), rtol=1e-5, atol=1e-6)


def test_attention_row_is_batch_invariant_and_padding_is_skipped(B):
    r = rng(10)
    hq, hkv, d = 4, 2, 8
    kv = PagedKV(40, hkv, d)
    lens = {0: 40, 1: 17, 2: 3}
    pages = {s: scattered_pages(r, 40, 0)[:0] for s in lens}
    free = list(r.permutation(40))
    for s, n in lens.items():
        pages[s] = [int(free.pop()) for _ in range((n + PAGE_SIZE - 1) // PAGE_SIZE)]
        seg = build_batch([SegmentSpec(s, [0] * n, 0, pages[s])])
        B.kv_write(kv, seg, randn(r, n, hkv, d), randn(r, n, hkv, d))
    # every segment re-reads its last 3 rows (already written) as this step's rows
    q = {s: randn(r, 3, hq, d) for s in lens}

    def run(order, pad_first=False):
        segs = [SegmentSpec(s, [0] * 3, lens[s] - 3, pages[s]) for s in order]
        if pad_first:
            segs.insert(0, SegmentSpec(-1, [0] * 2, 0, []))
        batch = build_batch(segs)
        qs = np.concatenate(([np.full((2, hq, d), np.nan, np.float32)] if pad_first else []) + [q[s] for s in order])
        out = B.attention(qs, kv, batch, 0.3)
        off = 2 if pad_first else 0
        if pad_first:
            assert np.array_equal(out[:2], np.zeros((2, hq, d), np.float32))
        return {s: out[off + 3 * i: off + 3 * i + 3] for i, s in enumerate(order)}

    alone = {s: run([s])[s] for s in lens}
    for order, pad in (([0, 1, 2], False), ([2, 0, 1], True), ([1, 2], True)):
        for s, o in run(order, pad).items():
            same(B, o, alone[s], (order, s))


def test_kv_write_skips_padding_rows_and_reads_back(B):
    r = rng(11)
    kv = PagedKV(4, 1, 4)
    batch = build_batch([SegmentSpec(-1, [1, 2], 0, [3]), SegmentSpec(0, [1, 2, 3], 0, [1])])
    k, v = randn(r, 5, 1, 4), randn(r, 5, 1, 4)
    B.kv_write(kv, batch, k, v)
    rk, rv = kv.read(np.array([1, 1, 1]), np.array([0, 1, 2]))
    assert np.array_equal(rk, k[2:]) and np.array_equal(rv, v[2:])
    assert not kv.k[3].any() and not kv.v[3].any()


# ---- sampling ------------------------------------------------------------------------------

def test_argmax_ties_go_to_lowest_id_and_nan_is_rejected(B):
    logits = np.array([[1.0, 3.0, 3.0, 2.0], [5.0, 5.0, 5.0, 5.0], [-1.0, -2.0, -1.0, -3.0]], np.float32)
    assert B.argmax(logits).tolist() == [1, 0, 0]
    _rowwise_invariant(B, B.argmax, randn(rng(12), 7, 50))
    with pytest.raises(ValueError, match="NaN"):
        B.argmax(np.array([[0.0, np.nan]], np.float32))


def test_top_k_logprobs(B):
    logits = np.array([[0.0, 2.0, 1.0, 2.0, -1.0]], np.float32)
    ids, lp = B.top_k_logprobs(logits, 3)
    assert ids.tolist() == [[1, 3, 2]]
    z = np.log(np.exp(logits.astype(np.float64)).sum())
    np.testing.assert_allclose(lp, [[2.0 - z, 2.0 - z, 1.0 - z]], rtol=1e-6)
    x = randn(rng(13), 6, 300)
    ids, lp = B.top_k_logprobs(x, 5)
    assert np.array_equal(ids[:, 0], B.argmax(x)) and np.all(np.diff(lp, axis=1) <= 0)
    _rowwise_invariant(B, lambda a: B.top_k_logprobs(a, 5)[1], x)
    with pytest.raises(ValueError):
        B.top_k_logprobs(x, 0)
