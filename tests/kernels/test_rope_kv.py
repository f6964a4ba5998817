"""q/k norm + rotary + KV write in one launch (cuda/rope_kv.cu, through the CUDA backend's
rope_kv_write, luce/ops/cuda_fused_ops.py): bitwise the unfused ops (luce.ops.api.FusedOps on
the same device) for every projection layout, close to luce/ref/rope_kv.py, batch-invariant."""
from __future__ import annotations

import numpy as np
import pytest

from luce.ops.api import FusedOps
from luce.ref import rope_kv as ref_fused

ROWS = [1, 2, 63, 64, 65, 129]


@pytest.fixture(scope="module")
def cuda():
    from luce.ops import get_backend

    return get_backend("cuda")


HQ, HKV = 6, 2


def kv_batch(T: int, start: int = 5):
    """One segment of T rows at positions start.. on slot 0, then a padding segment."""
    from luce.models import SegmentSpec, build_batch

    pages = list(range((start + T + 15) // 16))
    return build_batch([SegmentSpec(0, list(range(T)), start, pages), SegmentSpec(-1, [0, 0], 0, [])])


def qkv_inputs(T, D, seed):
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal((T, h * D)).astype(np.float32) for h in (HQ, HKV, HKV))
    norms = [(1.0 + 0.1 * rng.standard_normal(D)).astype(np.float32) for _ in range(2)]
    return q, k, v, norms


def layouts(cuda, q, k, v, layout):
    """The projections as a model hands them over: three arrays, [qk, v] or one [qkv]."""
    if layout == "qkv":
        return [cuda.asarray(np.concatenate([q, k, v], axis=1))]
    if layout == "qk_v":
        return [cuda.asarray(np.concatenate([q, k], axis=1)), cuda.asarray(v)]
    return [cuda.asarray(q), cuda.asarray(k), cuda.asarray(v)]


def rope_kv_run(cuda, batch, q, k, v, D, rope_dim, norms, layout, fused=True):
    from luce.models.kv_cache import PagedKV

    kv = PagedKV(16, HKV, D, zeros=cuda.zeros)
    q, k, v = (np.pad(a, ((0, batch.n_rows - a.shape[0]), (0, 0))) for a in (q, k, v))   # padding rows
    q_norm, k_norm = (cuda.asarray(n) for n in norms) if norms else (None, None)
    args = (layouts(cuda, q, k, v, layout), kv, batch, HQ, rope_dim, 1e6, (), q_norm, k_norm, 1e-6)
    out = cuda.rope_kv_write(*args) if fused else FusedOps.rope_kv_write(cuda, *args)
    return cuda.to_numpy(out), cuda.to_numpy(kv.k), cuda.to_numpy(kv.v)


@pytest.mark.gpu
@pytest.mark.parametrize("T", ROWS)
@pytest.mark.parametrize("D,rope_dim", [(128, 128), (256, 64), (64, 64)])
@pytest.mark.parametrize("qk_norm", [False, True], ids=["qwen2", "qwen3"])
@pytest.mark.parametrize("layout", ["q_k_v", "qk_v", "qkv"])
def test_rope_kv_write_is_the_unfused_bits(cuda, T, D, rope_dim, qk_norm, layout):
    q, k, v, norms = qkv_inputs(T, D, seed=T + D)
    norms = norms if qk_norm else None
    batch = kv_batch(T)
    got = rope_kv_run(cuda, batch, q, k, v, D, rope_dim, norms, layout)
    want = rope_kv_run(cuda, batch, q, k, v, D, rope_dim, norms, "q_k_v", fused=False)
    for a, b in zip(got, want):
        assert np.array_equal(a, b)
    n = batch.n_rows
    rq, rk, rv = ref_fused.rope_kv_write(*(np.pad(a, ((0, n - T), (0, 0))).reshape(n, -1, D) for a in (q, k, v)),
                                         batch.positions, rope_dim, 1e6, (), *(norms or (None, None)), 1e-6)
    np.testing.assert_allclose(got[0][:T], rq[:T], rtol=1e-5, atol=1e-5)
    rows = np.arange(5, 5 + T)   # pages 0.. in order: flat KV row = position
    np.testing.assert_allclose(got[1].reshape(-1, HKV, D)[rows], rk[:T], rtol=1e-5, atol=1e-5)
    assert np.array_equal(got[2].reshape(-1, HKV, D)[rows], rv[:T])


@pytest.mark.gpu
@pytest.mark.parametrize("qk_norm", [False, True], ids=["qwen2", "qwen3"])
def test_rope_kv_write_batch_invariance(cuda, qk_norm):
    q, k, v, norms = qkv_inputs(65, 128, seed=4)
    norms = norms if qk_norm else None
    together = rope_kv_run(cuda, kv_batch(65), q, k, v, 128, 128, norms, "qkv")
    for r in (0, 31, 64):   # row r alone, at its own position 5 + r
        alone = rope_kv_run(cuda, kv_batch(1, 5 + r), q[r:r + 1], k[r:r + 1], v[r:r + 1], 128, 128, norms, "qkv")
        assert np.array_equal(alone[0][0], together[0][r])
        assert np.array_equal(alone[1].reshape(-1, HKV, 128)[5 + r], together[1].reshape(-1, HKV, 128)[5 + r])
        assert np.array_equal(alone[2].reshape(-1, HKV, 128)[5 + r], together[2].reshape(-1, HKV, 128)[5 + r])


@pytest.mark.gpu
@pytest.mark.parametrize("T", [1, 5, 65])
@pytest.mark.parametrize("D,rope_dim", [(256, 64), (128, 128)])
@pytest.mark.parametrize("layout", ["q_k_v", "qk_v"])
def test_gated_queries_read_in_place_are_the_unfused_bits(cuda, T, D, rope_dim, layout):
    """gated=True (the qwen35 attention's [query | gate] heads): the kernel reads the queries in
    place (q heads 2D apart) and gives the composition's bits (gated_query's gather, then the ops);
    the gates never reach q or the KV."""
    from luce.models.kv_cache import PagedKV

    rng = np.random.default_rng(T + D)
    q, k, v = (rng.standard_normal((T, h * D)).astype(np.float32) for h in (2 * HQ, HKV, HKV))
    norms = [cuda.asarray((1.0 + 0.1 * rng.standard_normal(D)).astype(np.float32)) for _ in range(2)]
    batch = kv_batch(T)
    q, k, v = (np.pad(a, ((0, batch.n_rows - T), (0, 0))) for a in (q, k, v))
    runs = []
    for fused in (True, False):
        kv = PagedKV(16, HKV, D, zeros=cuda.zeros)
        args = (layouts(cuda, q, k, v, layout), kv, batch, HQ, rope_dim, 1e6, (), *norms, 1e-6)
        op = cuda.rope_kv_write if fused else lambda *a, **kw: FusedOps.rope_kv_write(cuda, *a, **kw)
        runs.append([cuda.to_numpy(a) for a in (op(*args, gated=True), kv.k, kv.v)])
    for a, b in zip(*runs):
        assert np.array_equal(a.view(np.uint32), b.view(np.uint32))
    queries = q.reshape(-1, HQ, 2, D)[:, :, 0]
    rq, _, _ = ref_fused.rope_kv_write(queries, k.reshape(-1, HKV, D), v.reshape(-1, HKV, D), batch.positions,
                                       rope_dim, 1e6, (), *(cuda.to_numpy(n) for n in norms), 1e-6)
    np.testing.assert_allclose(runs[0][0][:T], rq[:T], rtol=1e-5, atol=1e-5)
