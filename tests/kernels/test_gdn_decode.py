"""The GDN decode chain of AR rows in two launches (cuda/gdn_decode.cu, through the CUDA
backend's conv_gdn_norm, luce/ops/cuda_fused_ops.py): bitwise the unfused ops
(luce.ops.api.FusedOps on the same device) in the output, the conv state and the recurrent
state, step after step, for AR rows on scattered slots beside padding; close to
luce/ref/gdn_decode.py; a row's bits do not depend on the rows beside it."""
from __future__ import annotations

import inspect

import numpy as np
import pytest

from luce.ops.api import FusedOps
from luce.ref.gdn_decode import gdn_decode as ref_gdn_decode

# (Hk, Hv, Dk, Dv, K): a small shape, the Qwen3.6-27B GDN shape, Dk 256 and Dv 96 (3 column blocks a head)
SHAPES = [(2, 6, 64, 64, 4), (16, 48, 128, 128, 4), (2, 4, 256, 96, 3)]
SLOTS = {1: [3], 3: [5, 0, 2], 5: [1, 6, 4, 0, 7]}
N_SLOTS = 8
L2_EPS, RMS_EPS = 1e-6, 1e-6


@pytest.fixture(scope="module")
def cuda():
    from luce.ops import get_backend

    return get_backend("cuda")


def ar_batch(slots, step: int):
    """One AR row per slot (positions 10 + step), a padding row between the first two."""
    from luce.models import SegmentSpec, build_batch

    specs = [SegmentSpec(s, [7], 10 + step, [i]) for i, s in enumerate(slots)]
    return build_batch(specs[:1] + [SegmentSpec(-1, [0], 0, [])] + specs[1:])


def layer_weights(rng, shape):
    Hk, Hv, dk, dv, K = shape
    C = 2 * Hk * dk + Hv * dv
    return dict(conv=(rng.standard_normal((C, K)) * 0.5).astype(np.float32),
                dt_bias=rng.standard_normal(Hv).astype(np.float32),
                ssm_a=(-np.exp(rng.standard_normal(Hv) * 0.5)).astype(np.float32),
                norm=(1.0 + 0.1 * rng.standard_normal(dv)).astype(np.float32))


def step_inputs(rng, T, shape):
    Hk, Hv, dk, dv, _ = shape
    C = 2 * Hk * dk + Hv * dv
    return dict(qkv=rng.standard_normal((T, C)).astype(np.float32),
                z=rng.standard_normal((T, Hv * dv)).astype(np.float32),
                b=rng.standard_normal((T, Hv)).astype(np.float32),
                a=rng.standard_normal((T, Hv)).astype(np.float32))


def initial_pools(rng, shape):
    Hk, Hv, dk, dv, K = shape
    C = 2 * Hk * dk + Hv * dv
    return (rng.standard_normal((N_SLOTS, K - 1, C)).astype(np.float32),
            (rng.standard_normal((N_SLOTS, Hv, dk, dv)) * 0.1).astype(np.float32))


def run(cuda, fused: bool, x, w, pools, batch, Hk):
    """conv_gdn_norm on device copies -> (normed [T, Hv, Dv], conv pool, gdn pool) host arrays."""
    conv_pool, gdn_pool = (cuda.asarray(p) for p in pools)
    dev = {k: cuda.asarray(v) for k, v in {**x, **w}.items()}
    args = ([dev["qkv"], dev["z"], dev["b"], dev["a"]], dev["conv"], dev["dt_bias"], dev["ssm_a"], dev["norm"],
            conv_pool, gdn_pool, batch, Hk, L2_EPS, RMS_EPS)
    normed, tree_part = cuda.conv_gdn_norm(*args) if fused else FusedOps.conv_gdn_norm(cuda, *args)
    assert tree_part is None
    return cuda.to_numpy(normed), cuda.to_numpy(conv_pool), cuda.to_numpy(gdn_pool)


def live_rows(batch):
    """(rows [n], slots [n]) of the batch's AR rows."""
    live = [s for s in range(batch.n_segments) if batch.seq_slots[s] >= 0]
    return np.array([batch.qo_indptr[s] for s in live]), np.array([batch.seq_slots[s] for s in live])


@pytest.mark.gpu
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("n_rows", sorted(SLOTS))
def test_conv_gdn_norm_is_the_unfused_bits(cuda, shape, n_rows):
    rng = np.random.default_rng(n_rows * 100 + shape[2])
    w = layer_weights(rng, shape)
    fused_pools = unfused_pools = initial_pools(rng, shape)
    for step in range(3):
        batch = ar_batch(SLOTS[n_rows], step)
        x = step_inputs(rng, batch.n_rows, shape)
        got = run(cuda, True, x, w, fused_pools, batch, shape[0])
        want = run(cuda, False, x, w, unfused_pools, batch, shape[0])
        rows, _ = live_rows(batch)
        assert np.array_equal(got[0][rows], want[0][rows]), f"normed output differs at step {step}"
        assert np.array_equal(got[1], want[1]), f"conv state differs at step {step}"
        assert np.array_equal(got[2], want[2]), f"recurrent state differs at step {step}"
        fused_pools, unfused_pools = got[1:], want[1:]


@pytest.mark.gpu
@pytest.mark.parametrize("shape", SHAPES[:1] + SHAPES[2:], ids=lambda s: "x".join(map(str, s)))
def test_conv_gdn_norm_matches_the_reference(cuda, shape):
    rng = np.random.default_rng(7)
    w = layer_weights(rng, shape)
    pools = initial_pools(rng, shape)
    batch = ar_batch(SLOTS[3], 0)
    x = step_inputs(rng, batch.n_rows, shape)
    normed, conv_pool, gdn_pool = run(cuda, True, x, w, pools, batch, shape[0])
    for row, slot in zip(*live_rows(batch)):
        r = slice(row, row + 1)
        want, want_conv, want_state = ref_gdn_decode(x["qkv"][r], x["z"][r], x["b"][r], x["a"][r], w["conv"],
                                                     w["dt_bias"], w["ssm_a"], w["norm"], pools[0][slot],
                                                     pools[1][slot], shape[0], L2_EPS, RMS_EPS)
        np.testing.assert_allclose(normed[row], want[0], rtol=1e-3, atol=1e-4)
        assert np.array_equal(conv_pool[slot], want_conv)
        np.testing.assert_allclose(gdn_pool[slot], want_state, rtol=1e-3, atol=1e-4)
    untouched = sorted(set(range(N_SLOTS)) - set(SLOTS[3]))
    assert np.array_equal(conv_pool[untouched], pools[0][untouched])
    assert np.array_equal(gdn_pool[untouched], pools[1][untouched])


@pytest.mark.gpu
def test_conv_gdn_norm_row_alone_is_the_row_beside_others(cuda):
    shape = SHAPES[1]
    rng = np.random.default_rng(11)
    w = layer_weights(rng, shape)
    pools = initial_pools(rng, shape)
    together_batch = ar_batch(SLOTS[5], 0)
    x = step_inputs(rng, together_batch.n_rows, shape)
    together = run(cuda, True, x, w, pools, together_batch, shape[0])
    row = live_rows(together_batch)[0][2]         # slot 4, the third AR row
    alone_batch = ar_batch([4], 0)              # the row, then a padding row
    alone_x = {k: np.concatenate([v[row:row + 1], np.zeros_like(v[:1])]) for k, v in x.items()}
    alone = run(cuda, True, alone_x, w, pools, alone_batch, shape[0])
    assert np.array_equal(alone[0][0], together[0][row])
    assert np.array_equal(alone[1][4], together[1][4]) and np.array_equal(alone[2][4], together[2][4])


@pytest.mark.gpu
def test_conv_gdn_norm_step_with_prompt_rows_takes_the_composition(cuda):
    """A prompt segment beside an AR row: the chunked form, not the AR kernels."""
    from luce.models import SegmentSpec, build_batch

    shape = SHAPES[0]
    rng = np.random.default_rng(3)
    w = layer_weights(rng, shape)
    pools = initial_pools(rng, shape)
    batch = build_batch([SegmentSpec(1, [1, 2, 3], 0, [0]), SegmentSpec(2, [4], 5, [1])])
    x = step_inputs(rng, batch.n_rows, shape)
    got = run(cuda, True, x, w, pools, batch, shape[0])
    want = run(cuda, False, x, w, pools, batch, shape[0])
    for a, b in zip(got, want):
        assert np.array_equal(a, b)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["qkv_apart", "one_part"])
def test_conv_gdn_norm_reads_merged_parts_in_place(cuda, layout):
    """The projections as column blocks of merged parts ([qkv, z|b|a] or [qkv|z|b|a], row
    strides): the bits of the four dense parts."""
    shape = SHAPES[1]
    rng = np.random.default_rng(13)
    w = layer_weights(rng, shape)
    pools = initial_pools(rng, shape)
    batch = ar_batch(SLOTS[3], 0)
    x = step_inputs(rng, batch.n_rows, shape)
    want = run(cuda, True, x, w, pools, batch, shape[0])
    zba = np.concatenate([x["z"], x["b"], x["a"]], axis=1)
    parts = [x["qkv"], zba] if layout == "qkv_apart" else [np.concatenate([x["qkv"], zba], axis=1)]
    conv_pool, gdn_pool = (cuda.asarray(p) for p in pools)
    dev = {k: cuda.asarray(v) for k, v in w.items()}
    normed, _ = cuda.conv_gdn_norm([cuda.asarray(p) for p in parts], dev["conv"], dev["dt_bias"], dev["ssm_a"],
                                   dev["norm"], conv_pool, gdn_pool, batch, shape[0], L2_EPS, RMS_EPS)
    rows, _ = live_rows(batch)
    assert np.array_equal(cuda.to_numpy(normed)[rows], want[0][rows])
    assert np.array_equal(cuda.to_numpy(conv_pool), want[1]) and np.array_equal(cuda.to_numpy(gdn_pool), want[2])


@pytest.mark.gpu
@pytest.mark.parametrize("shape,qtype", [(SHAPES[1], "IQ4_XS"), (SHAPES[2], "Q8_0")],
                         ids=lambda v: v if isinstance(v, str) else "x".join(map(str, v)))
@pytest.mark.parametrize("n_rows", sorted(SLOTS))
def test_conv_gdn_norm_out_proj_is_the_unfused_bits(cuda, monkeypatch, shape, qtype, n_rows):
    """out_proj given: the chain quantizes normed for it in its norm epilogue (X_ONCE_MAX_K below
    Hv*Dv, as the 27B's 6,144; Dv 96 heads straddle 256-value chunks) and the matmul reuses that
    workspace: bitwise the composition's matmul on normed, step after step, and a row's bits do
    not depend on the rows beside it."""
    from gguf import GGMLQuantizationType as Q

    from luce import _cuda_gdn
    from luce.ops import cuda_backend
    from tests.kernels.test_matmul import weights

    Hk, Hv, dk, dv, _ = shape
    monkeypatch.setattr(cuda_backend, "X_ONCE_MAX_K", min(cuda_backend.X_ONCE_MAX_K, Hv * dv - 1))
    quantized, real = [], _cuda_gdn.gdn_decode
    signature = inspect.signature(real)

    def spy(*a, **k):
        quantized.append(signature.bind(*a, **k).arguments.get("workspace", 0))
        return real(*a, **k)

    monkeypatch.setattr(_cuda_gdn, "gdn_decode", spy)
    rng = np.random.default_rng(n_rows + dv)
    w = layer_weights(rng, shape)
    raw, _ = weights(getattr(Q, qtype), 160, Hv * dv, seed=3)
    out_proj = cuda._upload_weight(raw, int(getattr(Q, qtype)), (160, Hv * dv), "out")
    pools = {True: initial_pools(rng, shape), False: None}
    pools[False] = pools[True]

    def step(fused, x, batch, pool):
        conv_pool, gdn_pool = (cuda.asarray(p) for p in pool)
        dev = {k: cuda.asarray(v) for k, v in {**x, **w}.items()}
        args = ([dev["qkv"], dev["z"], dev["b"], dev["a"]], dev["conv"], dev["dt_bias"], dev["ssm_a"], dev["norm"],
                conv_pool, gdn_pool, batch, Hk, L2_EPS, RMS_EPS, "factor", out_proj)
        y, _ = cuda.conv_gdn_norm(*args) if fused else FusedOps.conv_gdn_norm(cuda, *args)
        return cuda.to_numpy(y), (cuda.to_numpy(conv_pool), cuda.to_numpy(gdn_pool))

    for t in range(2):
        batch = ar_batch(SLOTS[n_rows], t)
        x = step_inputs(rng, batch.n_rows, shape)
        (got, pools[True]), (want, pools[False]) = step(True, x, batch, pools[True]), step(False, x, batch, pools[False])
        rows, _ = live_rows(batch)
        assert got.shape == (batch.n_rows, 160) and np.isfinite(got[rows]).all()
        assert np.array_equal(got[rows], want[rows]), f"out projection differs at step {t}"
    assert quantized and all(quantized), "the chain did not quantize for the out projection"
