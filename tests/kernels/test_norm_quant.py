"""The fused producers of a quantized matmul's input (cuda/norm_quant.cu, through the CUDA
backend's add_rmsnorm_matmuls / swiglu_matmul, luce/ops/cuda_fused_ops.py) and merged weights:
bitwise the unfused ops (the composition in luce.ops.api.FusedOps on the same device), close
to luce/ref/norm_quant.py, and batch-invariant (a row alone == the same row among others)."""
from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from luce.ops.api import FusedOps
from luce.ref import norm_quant as ref_fused
from tests.kernels.test_matmul import assert_rows_close, weights

ROWS = [1, 2, 63, 64, 65, 129]
# (hidden width, weight type): the 0.5B width (warp-row norm, 32-value types), the 1.5B one
# (block-row norm), the warp/block boundary and a 27B-like width (two-pass-free block path)
NORM_SHAPES = [(896, Q.Q8_0), (1536, Q.Q4_K), (1024, Q.Q6_K), (5120, Q.IQ4_XS), (352, Q.Q5_0)]
EPS = 1e-6


@pytest.fixture(scope="module")
def cuda():
    from luce.ops import get_backend

    return get_backend("cuda")


def upload(cuda, qtype, n, k, seed=0):
    raw, dense = weights(qtype, n, k, seed)
    return cuda._upload_weight(raw, int(qtype), (n, k), f"w{seed}"), dense


def inputs(T, D, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((T, D)).astype(np.float32)
    x[1::7] *= 300.0
    res = rng.standard_normal((T, D)).astype(np.float32)
    norm = (1.0 + 0.1 * rng.standard_normal(D)).astype(np.float32)
    return x, res, norm


def fused_and_unfused(cuda, x, res, norm, ws, biases=None):
    args = (cuda.asarray(x), None if res is None else cuda.asarray(res), cuda.asarray(norm), EPS, ws, biases)
    s, outs = cuda.add_rmsnorm_matmuls(*args)
    s0, outs0 = FusedOps.add_rmsnorm_matmuls(cuda, *args)
    return (cuda.to_numpy(s), [cuda.to_numpy(o) for o in outs]), (cuda.to_numpy(s0), [cuda.to_numpy(o) for o in outs0])


@pytest.mark.gpu
@pytest.mark.parametrize("T", ROWS)
@pytest.mark.parametrize("D,qtype", NORM_SHAPES)
@pytest.mark.parametrize("residual", [True, False])
def test_add_rmsnorm_matmuls_is_the_unfused_bits(cuda, T, D, qtype, residual):
    x, res, norm = inputs(T, D, seed=T + D)
    (w1, d1), (w2, d2) = upload(cuda, qtype, 97, D, 1), upload(cuda, qtype, 40, D, 2)
    bias = np.random.default_rng(5).standard_normal(97).astype(np.float32)
    (s, outs), (s0, outs0) = fused_and_unfused(cuda, x, res if residual else None, norm, [w1, w2],
                                               [cuda.asarray(bias), None])
    assert np.array_equal(s, s0)
    for got, want in zip(outs, outs0):
        assert np.array_equal(got, want)
    s_ref, outs_ref = ref_fused.add_rmsnorm_matmuls(x, res if residual else None, norm, EPS, [d1, d2], [bias, None])
    assert np.array_equal(s, s_ref)      # one f32 add, as numpy's
    for got, want in zip(outs, outs_ref):
        assert_rows_close(got, want, "matmul_blocks_normed")


@pytest.mark.gpu
def test_add_rmsnorm_with_float_weights_falls_back_to_f32(cuda):
    x, res, norm = inputs(5, 96, seed=1)
    w = cuda.weight_from_array(np.random.default_rng(2).standard_normal((33, 96)).astype(np.float32))
    (s, outs), (s0, outs0) = fused_and_unfused(cuda, x, res, norm, [w])
    assert np.array_equal(s, s0) and np.array_equal(outs[0], outs0[0])


@pytest.mark.gpu
@pytest.mark.parametrize("D,qtype", [(896, Q.Q8_0), (1536, Q.Q4_K), (5120, Q.Q6_K)])
def test_add_rmsnorm_matmuls_batch_invariance(cuda, D, qtype):
    x, res, norm = inputs(64, D, seed=D)
    w, _ = upload(cuda, qtype, 97, D)
    (s, outs), _ = fused_and_unfused(cuda, x, res, norm, [w])
    for r in (0, 1, 17, 63):
        (s1, outs1), _ = fused_and_unfused(cuda, x[r:r + 1], res[r:r + 1], norm, [w])
        assert np.array_equal(s1[0], s[r]) and np.array_equal(outs1[0][0], outs[0][r])


def swiglu_both(cuda, gate, up, w, fused_layout: bool):
    if fused_layout:
        gu = cuda.asarray(np.concatenate([gate, up], axis=1))
        args = (gu, None, w)
    else:
        args = (cuda.asarray(gate), cuda.asarray(up), w)
    return cuda.to_numpy(cuda.swiglu_matmul(*args)), cuda.to_numpy(FusedOps.swiglu_matmul(cuda, *args))


@pytest.mark.gpu
@pytest.mark.parametrize("T", ROWS)
@pytest.mark.parametrize("F,qtype", [(4864, Q.Q4_K), (8960, Q.Q6_K), (352, Q.Q8_0)])
@pytest.mark.parametrize("fused_layout", [True, False])
def test_swiglu_matmul_is_the_unfused_bits(cuda, T, F, qtype, fused_layout):
    rng = np.random.default_rng(T * 7 + F)
    gate, up = (rng.standard_normal((2, T, F)) * 3).astype(np.float32)
    w, dense = upload(cuda, qtype, 97, F)
    got, want = swiglu_both(cuda, gate, up, w, fused_layout)
    assert np.array_equal(got, want)
    assert_rows_close(got, ref_fused.swiglu_matmul(gate, up, dense), "matmul_blocks")


@pytest.mark.gpu
def test_swiglu_matmul_batch_invariance(cuda):
    rng = np.random.default_rng(9)
    gate, up = (rng.standard_normal((2, 65, 4864)) * 3).astype(np.float32)
    w, _ = upload(cuda, Q.Q4_K, 97, 4864)
    together, _ = swiglu_both(cuda, gate, up, w, True)
    for r in (0, 31, 64):
        alone, _ = swiglu_both(cuda, gate[r:r + 1], up[r:r + 1], w, True)
        assert np.array_equal(alone[0], together[r])


@pytest.mark.gpu
@pytest.mark.parametrize("T", [1, 65])
def test_merged_weights_give_each_weights_bits(cuda, T):
    x = np.random.default_rng(T).standard_normal((T, 1536)).astype(np.float32)
    (wg, _), (wu, _) = upload(cuda, Q.Q4_K, 97, 1536, 1), upload(cuda, Q.Q4_K, 130, 1536, 2)
    merged = cuda.merge_weights([wg, wu])
    assert merged.shape == (227, 1536)
    both = cuda.to_numpy(cuda.matmul(cuda.asarray(x), merged))
    apart = [cuda.to_numpy(y) for y in cuda.matmuls(cuda.asarray(x), [wg, wu])]
    assert np.array_equal(both[:, :97], apart[0]) and np.array_equal(both[:, 97:], apart[1])
    w6, _ = upload(cuda, Q.Q6_K, 40, 1536, 3)
    assert cuda.merge_weights([wg, w6]) is None   # types differ: kept apart



@pytest.mark.gpu
@pytest.mark.parametrize("T", [1, 3, 65])
def test_q5_0_beside_q8_0_merges_as_q8_0(cuda, T):
    """The Coder-0.5B's q|k (Q5_0) and v (Q8_0) as one Q8_0 weight: its Q5_0 columns are the
    matmul of the same values as Q8_0 (quants_legacy.q5_0_as_q8_0), its Q8_0 columns the v's."""
    from luce import _cuda_matmul as km
    from luce.gguf.quants_legacy import q5_0_as_q8_0

    x = np.random.default_rng(T).standard_normal((T, 896)).astype(np.float32)
    raw5, _ = weights(Q.Q5_0, 1024, 896, 4)
    w5 = cuda._upload_weight(raw5, int(Q.Q5_0), (1024, 896), "qk")
    w8, _ = upload(cuda, Q.Q8_0, 128, 896, 5)
    merged = cuda.merge_weights([w5, w8])
    assert merged.qtype == km.QTYPES["Q8_0"] and merged.shape == (1152, 896)
    as8 = cuda._upload_weight(q5_0_as_q8_0(np.asarray(raw5).reshape(-1, 22)), int(Q.Q8_0), (1024, 896), "qk8")
    both = cuda.to_numpy(cuda.matmul(cuda.asarray(x), merged))
    apart = [cuda.to_numpy(y) for y in cuda.matmuls(cuda.asarray(x), [as8, w8])]
    assert np.array_equal(both[:, :1024], apart[0]) and np.array_equal(both[:, 1024:], apart[1])
    q5 = cuda.to_numpy(cuda.matmul(cuda.asarray(x), w5))
    np.testing.assert_allclose(both[:, :1024], q5, rtol=1e-4, atol=1e-3)   # the same values, other rounding


def gate_both(cuda, o, qg, w):
    args = (cuda.asarray(o), cuda.asarray(qg), w)
    return cuda.to_numpy(cuda.gate_output_matmul(*args)), cuda.to_numpy(FusedOps.gate_output_matmul(cuda, *args))


@pytest.mark.gpu
@pytest.mark.parametrize("T", [1, 2, 23, 65])
@pytest.mark.parametrize("H,D,qtype", [(24, 256, Q.IQ4_XS), (24, 256, Q.Q5_K), (4, 64, Q.Q8_0)])
def test_gate_output_matmul_is_the_unfused_bits(cuda, monkeypatch, T, H, D, qtype):
    """luce_gate_quant + the matmul on its workspace against gate_output (luce_binary) + matmul:
    the 27B's 24 heads of 256 (k = 6,144, past X_ONCE_MAX_K: the fused path by default) and a
    small Q8_0 shape with X_ONCE_MAX_K lowered so it takes the fused path too."""
    from luce import _cuda_fused
    from luce.ops import cuda_backend

    monkeypatch.setattr(cuda_backend, "X_ONCE_MAX_K", min(cuda_backend.X_ONCE_MAX_K, H * D - 1))
    launched = []
    real = _cuda_fused.gate_quant
    monkeypatch.setattr(_cuda_fused, "gate_quant", lambda *a, **k: (launched.append(1), real(*a, **k)))
    rng = np.random.default_rng(T * 13 + D)
    o = (rng.standard_normal((T, H * D)) * 2).astype(np.float32)
    qg = (rng.standard_normal((T, H, 2 * D)) * 3).astype(np.float32)
    o[:, 5] = 0.0
    w, dense = upload(cuda, qtype, 97, H * D)
    got, want = gate_both(cuda, o, qg, w)
    assert launched, "the fused path did not run"
    assert np.array_equal(got, want)
    assert_rows_close(got, ref_fused.gate_output_matmul(o, qg, dense), "matmul_blocks")
    together = got
    for r in sorted({0, T // 2, T - 1}):
        alone, _ = gate_both(cuda, o[r:r + 1], qg[r:r + 1], w)
        assert np.array_equal(alone[0], together[r])
    # qg as the first 2HD columns of a merged [q|gate | k] output (o [T, H, D]): read in place at its
    # row stride, the same bits (the 27B's attn_q and attn_k merge into one IQ4_XS weight)
    merged = np.concatenate([qg.reshape(T, 2 * H * D), rng.standard_normal((T, 4 * D)).astype(np.float32)], axis=1)
    launched.clear()
    in_place, composed = gate_both(cuda, o.reshape(T, H, D), merged, w)
    assert launched and np.array_equal(in_place, got) and np.array_equal(composed, got)
