"""luce.ops.api.FusedOps on the host backends: the fused ops are their composition, equal to
luce/ref/norm_quant.py, and host backends keep weights apart (merge_weights -> None)."""
from __future__ import annotations

import numpy as np

from luce.ops.numpy_backend import NumpyBackend
from luce.ref import norm_quant as ref_fused
from luce.ref.matmul import matmul as ref_matmul
from luce.ref.rmsnorm import rmsnorm
from luce.ref.swiglu import swiglu

NP = NumpyBackend()


def randn(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def test_add_rmsnorm_matmuls_composes_add_norm_and_matmuls():
    x, res, norm = randn(5, 64, seed=1), randn(5, 64, seed=2), randn(64, seed=3)
    w1, w2, b1 = randn(7, 64, seed=4), randn(3, 64, seed=5), randn(7, seed=6)
    s, (y1, y2) = NP.add_rmsnorm_matmuls(x, res, norm, 1e-6, [w1, w2], [b1, None])
    assert np.array_equal(s, x + res)
    normed = rmsnorm(x + res, norm, 1e-6)
    assert np.array_equal(y1, ref_matmul(normed, w1, b1)) and np.array_equal(y2, ref_matmul(normed, w2))
    s_ref, outs_ref = ref_fused.add_rmsnorm_matmuls(x, res, norm, 1e-6, [w1, w2], [b1, None])
    assert np.array_equal(s, s_ref) and all(np.array_equal(a, b) for a, b in zip((y1, y2), outs_ref))


def test_add_rmsnorm_matmuls_without_residual_keeps_x():
    x, norm, w = randn(3, 32, seed=1), randn(32, seed=2), randn(4, 32, seed=3)
    s, (y,) = NP.add_rmsnorm_matmuls(x, None, norm, 1e-5, [w])
    assert s is x
    assert np.array_equal(y, ref_matmul(rmsnorm(x, norm, 1e-5), w))


def test_swiglu_matmul_fused_layout_is_gate_then_up():
    gate, up, w = randn(4, 16, seed=1), randn(4, 16, seed=2), randn(5, 16, seed=3)
    want = ref_matmul(swiglu(gate, up), w)
    assert np.array_equal(NP.swiglu_matmul(gate, up, w), want)
    assert np.array_equal(NP.swiglu_matmul(np.concatenate([gate, up], axis=1), None, w), want)
    assert np.array_equal(ref_fused.swiglu_matmul(np.concatenate([gate, up], axis=1), None, w), want)


def test_gate_output_matmul_takes_qg_from_a_merged_projection():
    """o [T, H, D] with qg the first 2HD columns of a wider [q|gate | k] output: the bits of o
    [T, H*D] with qg [T, H, 2D] (luce.ops.gate_inputs), equal to luce/ref/norm_quant.py."""
    import pytest

    T, H, D = 3, 2, 8
    o, qg, w = randn(T, H * D, seed=1), randn(T, H, 2 * D, seed=2), randn(5, H * D, seed=3)
    merged = np.concatenate([qg.reshape(T, -1), randn(T, 4, seed=4)], axis=1)
    want = NP.gate_output_matmul(o, qg, w)
    assert np.array_equal(want, ref_fused.gate_output_matmul(o, qg, w))
    assert np.array_equal(NP.gate_output_matmul(o.reshape(T, H, D), merged, w), want)
    assert np.array_equal(NP.gate_output_matmul(o.reshape(T, H, D), merged[:, :2 * H * D], w), want)
    for bad_o, bad_qg in ((o, merged), (o.reshape(T, H, D), merged[:, :2 * H * D - 1]), (o[:, 1:], qg)):
        with pytest.raises(ValueError, match="gate"):
            NP.gate_output_matmul(bad_o, bad_qg, w)


def test_host_backends_keep_weights_apart():
    assert NP.merge_weights([randn(3, 8), randn(3, 8)]) is None


def test_conv_gdn_norm_composes_the_gdn_chain_per_slot():
    """AR rows on slots 2 and 0 (and a padding row): each row's output and both states are
    luce/ref/gdn_decode.py on its slot; the slot no row names keeps its states."""
    from luce.models import SegmentSpec, build_batch
    from luce.ref.gdn_decode import gdn_decode

    Hk, Hv, dk, dv, K = 2, 4, 8, 8, 4
    C = 2 * Hk * dk + Hv * dv
    batch = build_batch([SegmentSpec(2, [5], 9, [0]), SegmentSpec(-1, [0], 0, []), SegmentSpec(0, [6], 3, [1])])
    qkv, z = randn(3, C, seed=1), randn(3, Hv * dv, seed=2)
    b, a = randn(3, Hv, seed=3), randn(3, Hv, seed=4)
    conv, dt_bias, ssm_a, norm = randn(C, K, seed=5), randn(Hv, seed=6), -np.abs(randn(Hv, seed=7)), randn(dv, seed=8)
    conv_pool, gdn_pool = randn(3, K - 1, C, seed=9), randn(3, Hv, dk, dv, seed=10) * np.float32(0.1)
    conv_before, gdn_before = conv_pool.copy(), gdn_pool.copy()
    normed, tree_part = NP.conv_gdn_norm([qkv, z, b, a], conv, dt_bias, ssm_a, norm, conv_pool, gdn_pool, batch, Hk,
                                         1e-6, 1e-6)
    assert tree_part is None and normed.shape == (3, Hv, dv)
    for row, slot in ((0, 2), (2, 0)):
        r = slice(row, row + 1)
        want, want_conv, want_state = gdn_decode(qkv[r], z[r], b[r], a[r], conv, dt_bias, ssm_a, norm,
                                                 conv_before[slot], gdn_before[slot], Hk, 1e-6, 1e-6)
        assert np.array_equal(normed[row], want[0])
        assert np.array_equal(conv_pool[slot], want_conv)
        assert np.array_equal(gdn_pool[slot], want_state)
    assert np.array_equal(conv_pool[1], conv_before[1]) and np.array_equal(gdn_pool[1], gdn_before[1])
