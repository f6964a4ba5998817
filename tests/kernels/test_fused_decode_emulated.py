"""The fused decode producers' own source on the CPU (tests/kernels/emu): cuda/norm_quant.cu's
add + RMSNorm + quantization runs several blocks a row, each summing the whole row; its normed
row and sum must be the bits of the one-block form (norm_row, no quantization) and its
quantized x must hold that row chunk by chunk. Its SwiGLU + quantization gives luce_swiglu's bits
(cuda/swiglu.cu), its gate + quantization luce_binary's MUL_SIGMOID bits (cuda/pointwise.cu),
each held quantized. cuda/rope_kv.cu runs several blocks a row (a warp
a head): q', k' close to luce/ref/rope_kv.py, v copied bitwise, padding rows write no KV.
tests/kernels/test_norm_quant.py and test_rope_kv.py check the same kernels on a GPU against
the unfused kernels.
"""
from __future__ import annotations

import ctypes as C

import numpy as np
import pytest

from luce.ref import norm_quant as ref_norm
from luce.ref import rope_kv as ref_rope
from tests.kernels.emu import build as emu

pytestmark = pytest.mark.slow
_P = C.c_void_p
EPS = 1e-6


class NormParams(C.Structure):
    """luce_add_rmsnorm_params (cuda/luce_ops.h), field for field."""
    _fields_ = [(n, _P) for n in "x residual weight sum out workspace".split()] + \
               [(n, C.c_int64) for n in "workspace_bytes rows cols".split()] + [("eps", C.c_float)]


class GateParams(C.Structure):
    """luce_gate_quant_params (cuda/luce_ops.h), field for field."""
    _fields_ = [(n, _P) for n in "o qg out workspace".split()] + \
               [(n, C.c_int64) for n in "workspace_bytes rows heads head_dim qg_stride".split()]


class SwigluQuantParams(C.Structure):
    """luce_swiglu_quant_params (cuda/luce_ops.h), field for field."""
    _fields_ = [(n, _P) for n in "gate up out workspace".split()] + \
               [(n, C.c_int64) for n in "workspace_bytes rows cols gate_stride up_stride".split()]


class SwigluParams(C.Structure):
    """luce_swiglu_params (cuda/luce_ops.h), field for field."""
    _fields_ = [(n, _P) for n in "gate up out".split()] + \
               [(n, C.c_int64) for n in "rows cols gate_stride up_stride out_stride".split()]


class BinaryParams(C.Structure):
    """luce_binary_params (cuda/luce_ops.h), field for field."""
    _fields_ = [("a", _P), ("b", _P), ("out", _P), ("shape", C.c_int64 * 4), ("a_strides", C.c_int64 * 4),
                ("b_strides", C.c_int64 * 4), ("b_scalar", C.c_float), ("op", C.c_int32)]


class RopeParams(C.Structure):
    """luce_rope_kv_params (cuda/luce_ops.h), field for field."""
    _fields_ = [(n, _P) for n in "q k v q_norm k_norm q_out k_pages v_pages kv_dst positions".split()] + \
               [(n, C.c_int64) for n in "rows q_stride k_stride v_stride q_head_stride".split()] + \
               [(n, C.c_int32) for n in "heads_q heads_kv head_dim rope_dim n_pos".split()] + \
               [("sections", C.c_int32 * 4), ("theta", C.c_float), ("eps", C.c_float)]


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    lib = emu.load(["norm_quant.cu", "rmsnorm.cu", "rope_kv.cu", "pointwise.cu", "swiglu.cu"],
                   tmp_path_factory.mktemp("emu"), "the fused decode kernels")
    lib.luce_add_rmsnorm.argtypes = [C.POINTER(NormParams), _P]
    lib.luce_gate_quant.argtypes = [C.POINTER(GateParams), _P]
    lib.luce_binary.argtypes = [C.POINTER(BinaryParams), _P]
    lib.luce_swiglu_quant.argtypes = [C.POINTER(SwigluQuantParams), _P]
    lib.luce_swiglu.argtypes = [C.POINTER(SwigluParams), _P]
    lib.luce_rope_kv.argtypes = [C.POINTER(RopeParams), _P]
    return lib


def ptr(a):
    return None if a is None else a.ctypes.data


def x_workspace_bytes(rows: int, k: int) -> int:
    """cuda/matmul_x.cuh x_bytes."""
    tp, groups, chunks = (rows + 7) // 8 * 8, k // 32, (k + 255) // 256
    return tp * (64 * groups + 4 * chunks + 8 * groups + 32 * chunks)


def dequantize_x(ws: np.ndarray, rows: int, k: int) -> np.ndarray:
    """The workspace's 16-bit x (cuda/matmul_x.cuh XLayout) times its chunk scales -> [tp, k]."""
    tp, groups, chunks = (rows + 7) // 8 * 8, k // 32, (k + 255) // 256
    words = ws[:tp * groups * 64].view(np.uint32).reshape(tp, groups, 4, 4)   # [t][g][quad]{hi0, hi1, lo0, lo1}
    scale = ws[tp * groups * 64:tp * groups * 64 + 4 * chunks * tp].view(np.float32).reshape(chunks, tp)
    out = np.zeros((tp, groups, 32))
    for quad in range(4):
        for half in range(2):
            hi = words[:, :, quad, half].copy().view(np.int8).reshape(tp, groups, 4).astype(np.int64)
            lo = words[:, :, quad, 2 + half].copy().view(np.uint8).reshape(tp, groups, 4).astype(np.int64)
            out[:, :, 16 * half + 4 * quad:16 * half + 4 * quad + 4] = hi * 256 + lo
    return out.reshape(tp, k) * np.repeat(scale.T, 256, axis=1)[:, :k]


def add_rmsnorm(lib, x, residual, weight, quantize: bool):
    rows, cols = x.shape
    s = np.full_like(x, np.nan) if residual is not None else None
    out = np.full_like(x, np.nan)
    ws = np.zeros(x_workspace_bytes(rows, cols), np.uint8) if quantize else None
    p = NormParams(ptr(x), ptr(residual), ptr(weight), ptr(s), ptr(out), ptr(ws), 0 if ws is None else ws.size,
                   rows, cols, EPS)
    assert lib.luce_add_rmsnorm(C.byref(p), None) == 0
    return s, out, ws


@pytest.mark.parametrize("cols", [896, 1536, 9216], ids=["warp_row", "block_row", "block_row_two_load_batches"])
@pytest.mark.parametrize("rows", [1, 3, 11])   # 11: warp rows over two blocks, the last one partial
@pytest.mark.parametrize("residual", [True, False])
def test_add_rmsnorm_quantizing_blocks_give_the_one_block_bits_emulated(lib, cols, rows, residual):
    rng = np.random.default_rng(cols + rows)
    x = (rng.standard_normal((rows, cols)) * 3).astype(np.float32)
    res = rng.standard_normal((rows, cols)).astype(np.float32) if residual else None
    weight = (1 + 0.1 * rng.standard_normal(cols)).astype(np.float32)
    s, out, ws = add_rmsnorm(lib, x, res, weight, quantize=True)
    s1, out1, _ = add_rmsnorm(lib, x, res, weight, quantize=False)
    assert np.array_equal(out, out1), "the quantizing blocks normed the row differently"
    if residual:
        assert np.array_equal(s, s1) and np.array_equal(s, x + res)
    want_s, want = ref_norm.add_rmsnorm(x, res, weight, EPS)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)
    xq = dequantize_x(ws, rows, cols)
    amax = np.abs(out).max(axis=1, keepdims=True)
    np.testing.assert_allclose(xq[:rows], out, rtol=0, atol=float(amax.max()) / 32767)   # half a step or less per chunk
    assert not xq[rows:].any(), "padding rows of the workspace hold zeros"


@pytest.mark.parametrize("rows,cols", [(1, 1024), (5, 352), (9, 256)])
def test_swiglu_quant_gives_the_swiglu_bits_and_quantizes_them_emulated(lib, rows, cols):
    """A fused gate|up [rows, 2F] read in place (strides 2F): out = luce_swiglu's bits, the
    workspace holds out quantized (352: a chunk of 3 groups), its padding rows zeros."""
    rng = np.random.default_rng(rows * 10 + cols)
    gate_up = (rng.standard_normal((rows, 2 * cols)) * 3).astype(np.float32)
    gate_up[0, :5] = 0.0
    out, ws = np.full((rows, cols), np.nan, np.float32), np.zeros(x_workspace_bytes(rows, cols), np.uint8)
    up = gate_up.ctypes.data + 4 * cols
    p = SwigluQuantParams(ptr(gate_up), up, ptr(out), ptr(ws), ws.size, rows, cols, 2 * cols, 2 * cols)
    assert lib.luce_swiglu_quant(C.byref(p), None) == 0
    want = np.full_like(out, np.nan)
    q = SwigluParams(ptr(gate_up), up, ptr(want), rows, cols, 2 * cols, 2 * cols, cols)
    assert lib.luce_swiglu(C.byref(q), None) == 0
    assert np.array_equal(out.view(np.uint32), want.view(np.uint32))
    xq = dequantize_x(ws, rows, cols)
    np.testing.assert_allclose(xq[:rows], out, rtol=0, atol=float(np.abs(out).max()) / 32767)
    assert not xq[rows:].any(), "padding rows of the workspace hold zeros"


@pytest.mark.parametrize("rows,heads,head_dim", [(1, 24, 256), (3, 4, 64), (9, 6, 32)])
def test_gate_quant_gives_the_binary_bits_and_quantizes_them_emulated(lib, rows, heads, head_dim):
    """out = o * sigmoid(gate) with each head's gate read in place from qg [rows, heads, 2 D] (rows
    past qg's own width apart): luce_binary MUL_SIGMOID's bits; the workspace holds out quantized,
    its padding rows zeros. A head_dim not a multiple of 4, or a qg row stride below 2 H D, is refused."""
    rng = np.random.default_rng(rows * 100 + head_dim)
    cols, stride = heads * head_dim, 2 * heads * head_dim + 8
    o = (rng.standard_normal((rows, cols)) * 3).astype(np.float32)
    o[0, :7] = 0.0
    qg = (rng.standard_normal((rows, stride)) * 4).astype(np.float32)
    out, ws = np.full_like(o, np.nan), np.zeros(x_workspace_bytes(rows, cols), np.uint8)
    p = GateParams(ptr(o), ptr(qg), ptr(out), ptr(ws), ws.size, rows, heads, head_dim, stride)
    assert lib.luce_gate_quant(C.byref(p), None) == 0
    want = np.full_like(o, np.nan)
    b = BinaryParams(ptr(o), qg.ctypes.data + 4 * head_dim, ptr(want), (1, rows, heads, head_dim),
                     (0, cols, head_dim, 1), (0, stride, 2 * head_dim, 1), 0.0, 2)   # LUCE_PW_MUL_SIGMOID
    assert lib.luce_binary(C.byref(b), None) == 0
    assert np.array_equal(out.view(np.uint32), want.view(np.uint32))
    gates = qg[:, :2 * cols].reshape(rows, heads, 2, head_dim)[:, :, 1].reshape(rows, cols)
    np.testing.assert_allclose(out, o / (1 + np.exp(-gates.astype(np.float64))), rtol=1e-6, atol=1e-7)
    xq = dequantize_x(ws, rows, cols)
    amax = np.abs(out).max(axis=1, keepdims=True)
    np.testing.assert_allclose(xq[:rows], out, rtol=0, atol=float(amax.max()) / 32767)
    assert not xq[rows:].any(), "padding rows of the workspace hold zeros"
    for bad in (dict(head_dim=head_dim + 2, heads=1), dict(qg_stride=2 * cols - 1)):
        q = GateParams(ptr(o), ptr(qg), ptr(out), ptr(ws), ws.size, rows, bad.get("heads", heads),
                       bad.get("head_dim", head_dim), bad.get("qg_stride", stride))
        assert lib.luce_gate_quant(C.byref(q), None) != 0, bad


def test_add_rmsnorm_of_many_rows_gives_the_few_rows_bits_and_may_write_over_x_emulated(lib):
    """Unquantized, past kRegisterBlockRowsMax (512) rows of more than 1,024 columns rmsnorm.cu's
    two-pass kernel runs (a prompt chunk): each row's bits are those of the in-register kernel
    that a few rows take, and the sum may be written over x (its second pass reads the sum)."""
    rng = np.random.default_rng(520)
    rows, cols = 520, 1536
    x = (rng.standard_normal((rows, cols)) * 3).astype(np.float32)
    res = rng.standard_normal((rows, cols)).astype(np.float32)
    weight = (1 + 0.1 * rng.standard_normal(cols)).astype(np.float32)
    s, out, _ = add_rmsnorm(lib, x, res, weight, quantize=False)
    few_s, few, _ = add_rmsnorm(lib, x[:3].copy(), res[:3].copy(), weight, quantize=False)
    assert np.array_equal(out[:3], few) and np.array_equal(s[:3], few_s)
    over, out2 = x.copy(), np.full_like(x, np.nan)
    p = NormParams(ptr(over), ptr(res), ptr(weight), ptr(over), ptr(out2), None, 0, rows, cols, EPS)   # sum over x
    assert lib.luce_add_rmsnorm(C.byref(p), None) == 0
    assert np.array_equal(over, s) and np.array_equal(out2, out)


@pytest.mark.parametrize("qk_norm", [False, True], ids=["qwen2", "qwen3"])
def test_rope_kv_blocks_per_row_match_the_reference_emulated(lib, qk_norm):
    rows, hq, hkv, d, rope_dim = 3, 6, 2, 64, 32
    rng = np.random.default_rng(9 + qk_norm)
    qkv = rng.standard_normal((rows, (hq + 2 * hkv) * d)).astype(np.float32)
    q, k, v = (np.ascontiguousarray(a) for a in np.split(qkv, [hq * d, (hq + hkv) * d], axis=1))
    norms = [(1 + 0.1 * rng.standard_normal(d)).astype(np.float32) for _ in range(2)] if qk_norm else [None, None]
    positions = np.array([7, 8, 9], np.int32)
    kv_dst = np.array([4, -1, 1], np.int64)           # row 1: padding, no KV written
    q_out = np.full((rows, hq, d), np.nan, np.float32)
    k_pages = np.full((6, hkv, d), 7.0, np.float32)
    v_pages = np.full((6, hkv, d), 7.0, np.float32)
    p = RopeParams(ptr(qkv), ptr(qkv[:, hq * d:]), ptr(qkv[:, (hq + hkv) * d:]), ptr(norms[0]), ptr(norms[1]),
                   ptr(q_out), ptr(k_pages), ptr(v_pages), ptr(kv_dst), ptr(positions), rows, qkv.shape[1],
                   qkv.shape[1], qkv.shape[1], 0, hq, hkv, d, rope_dim, 1, (C.c_int32 * 4)(0, 0, 0, 0), 1e6, EPS)
    p.k = qkv[:, hq * d:].ctypes.data
    p.v = qkv[:, (hq + hkv) * d:].ctypes.data
    assert lib.luce_rope_kv(C.byref(p), None) == 0
    rq, rk, rv = ref_rope.rope_kv_write(q.reshape(rows, hq, d), k.reshape(rows, hkv, d), v.reshape(rows, hkv, d),
                                        positions, rope_dim, 1e6, (), norms[0], norms[1], EPS)
    np.testing.assert_allclose(q_out, rq, rtol=1e-5, atol=1e-5)
    for r, dst in enumerate(kv_dst):
        if dst >= 0:
            np.testing.assert_allclose(k_pages[dst], rk[r], rtol=1e-5, atol=1e-5)
            assert np.array_equal(v_pages[dst], rv[r])
    untouched = [i for i in range(6) if i not in kv_dst]
    assert (k_pages[untouched] == 7.0).all() and (v_pages[untouched] == 7.0).all(), "a padding row wrote KV"


@pytest.mark.parametrize("qk_norm", [False, True], ids=["qwen2", "qwen3"])
def test_rope_kv_reads_a_gated_attentions_queries_in_place_emulated(lib, qk_norm):
    """q_head_stride 2 D: the queries of a [q|gate, k, v] projection (each q head its query, then
    its gate) read in place give the bits of the same launch on the queries gathered first; the
    gates are never read (NaN there)."""
    rows, hq, hkv, d, rope_dim = 3, 6, 2, 64, 32
    rng = np.random.default_rng(21 + qk_norm)
    width = (2 * hq + 2 * hkv) * d + 8                 # 8 more: a row stride wider than the columns
    proj = rng.standard_normal((rows, width)).astype(np.float32)
    proj[:, :2 * hq * d].reshape(rows, hq, 2, d)[:, :, 1] = np.nan   # the gates
    queries = np.ascontiguousarray(proj[:, :2 * hq * d].reshape(rows, hq, 2, d)[:, :, 0].reshape(rows, hq * d))
    norms = [(1 + 0.1 * rng.standard_normal(d)).astype(np.float32) for _ in range(2)] if qk_norm else [None, None]
    positions = np.array([3, 11, 12], np.int32)
    kv_dst = np.array([2, -1, 5], np.int64)

    def run(q, q_stride, q_head_stride):
        q_out = np.full((rows, hq, d), np.nan, np.float32)
        pages = [np.full((6, hkv, d), 7.0, np.float32) for _ in range(2)]
        k0, v0 = 2 * hq * d, (2 * hq + hkv) * d
        p = RopeParams(ptr(q), proj[:, k0:].ctypes.data, proj[:, v0:].ctypes.data, ptr(norms[0]), ptr(norms[1]),
                       ptr(q_out), ptr(pages[0]), ptr(pages[1]), ptr(kv_dst), ptr(positions), rows, q_stride, width,
                       width, q_head_stride, hq, hkv, d, rope_dim, 1, (C.c_int32 * 4)(0, 0, 0, 0), 1e6, EPS)
        assert lib.luce_rope_kv(C.byref(p), None) == 0
        return q_out, *pages

    in_place = run(proj, width, 2 * d)
    gathered = run(queries, hq * d, 0)
    for a, b in zip(in_place, gathered):
        assert np.array_equal(a.view(np.uint32), b.view(np.uint32))
    assert not np.isnan(in_place[0]).any(), "a gate was read as a query"
    rq, _, _ = ref_rope.rope_kv_write(queries.reshape(rows, hq, d), *(proj[:, a:a + hkv * d].reshape(rows, hkv, d)
                                      for a in (2 * hq * d, (2 * hq + hkv) * d)), positions, rope_dim, 1e6, (),
                                      norms[0], norms[1], EPS)
    np.testing.assert_allclose(in_place[0], rq, rtol=1e-5, atol=1e-5)


def test_rope_kv_refuses_a_negative_q_head_stride_emulated(lib):
    z = np.zeros((1, 64), np.float32)
    dst, pos = np.zeros(1, np.int64), np.zeros(1, np.int32)
    p = RopeParams(ptr(z), ptr(z), ptr(z), None, None, ptr(z), ptr(z), ptr(z), ptr(dst), ptr(pos), 1, 64, 64, 64, -64,
                   1, 1, 64, 64, 1, (C.c_int32 * 4)(0, 0, 0, 0), 1e6, EPS)
    assert lib.luce_rope_kv(C.byref(p), None) == 1   # cudaErrorInvalidValue
