"""The CUDA backend (luce/ops/cuda_backend.py) against the numpy backend.

CPU: backend selection and its errors, allocator size classes, broadcast strides, the KV
row moves of tree commit. GPU (`gpu` marker): every op against numpy (bitwise where the
arithmetic is the same: copies, add/mul, embedding), tiny qwen35 / qwen3 models (prefill of
1, 63, 64, 65, 129 tokens then decode) within a tolerance of numpy, batch invariance of a
decode row (bitwise), tree rows through the model (both GDN tree modes on the device) and
the engine end to end.
Measured differences are printed as 'MEASURE ...' lines (run with -s to see them).
"""
from __future__ import annotations

import numpy as np
import pytest

from luce.models import SegmentSpec, build_batch, load_model, pages_needed
from luce.models.commit import commit_trees, plan_tree_commit, tree_kv_moves
from luce.models.kv_cache import PAGE_SIZE, PagedKV
from luce.ops import cuda_unavailable_reason, get_backend
from luce.ops.cuda_array import bucket_bytes
from luce.ops.numpy_backend import NumpyBackend

# logits tolerance, in units of max(1, max |numpy logits|): f32 weights only reorder f32
# sums (and attention / GDN run in f32 against float64 references); block-quantized weights
# also quantize x to 16 bits per 256 values in every matmul.
# q4_k_m: prompt rows take the f16 GEMM (cuda/matmul_prefill_f16.cu; the int8 one with
# LUCE_PREFILL_GEMM=int8: numpy with luce.ref.matmul_prefill on its prompt rows measured 2.1e-2 of
# scale on these models, T = 129).
MODEL_TOL = {"f32": 2e-3, "q4_k_m": 4e-2}


# ---- CPU ------------------------------------------------------------------------------------
def test_auto_is_cpu_without_a_gpu_and_cuda_names_the_fix():
    if cuda_unavailable_reason() is None:
        pytest.skip("a GPU and the kernel library are present")
    assert get_backend("auto").name == "cpu"
    with pytest.raises(RuntimeError, match="build_ext|GPU"):
        get_backend("cuda")
    with pytest.raises(ValueError, match="available"):
        get_backend("tpu")


def test_bucket_sizes_cover_the_request_and_repeat():
    for n in (0, 1, 255, 256, 257, 4096, 5000, (64 << 20) - 1, 64 << 20, (64 << 20) + 1, 300 << 20):
        b = bucket_bytes(n)
        assert b >= max(n, 256) and bucket_bytes(b) == b
    assert bucket_bytes(5000) == 8192 and bucket_bytes((64 << 20) + 1) == (64 << 20) + (2 << 20)


@pytest.mark.parametrize("shape,full", [((48,), (129, 48)), ((1,), (63, 4, 16)), ((2, 1, 1), (2, 3, 5)),
                                        ((4, 1, 1), (4, 3, 5)), ((7, 1), (3, 7, 9)), ((3, 5), (3, 5))])
def test_broadcast_strides_match_numpy(shape, full):
    from luce.ops.cuda_pointwise_ops import _strides

    view = np.broadcast_to(np.empty(shape, np.float32), full)
    assert _strides(shape, full) == [s // 4 for s in view.strides]


def test_tree_stage_scratch_is_one_buffer_per_layer_and_name_that_grows_by_doubling():
    """CUDA tree verify writes what the commit reads (per-node GDN states, factors, conv
    inputs) into one scratch per layer and name (shared by every captured graph and eager
    step, so the commit's graph key repeats), first made for `capacity` rows when given: a
    smaller tree block reuses its address, a larger one doubles it and keeps the outgrown buffer (a graph may still write it), and
    inside a capture the allocation never gives cached blocks back (no cudaFree may run there)."""
    from luce.ops.cuda_step_ops import StepOps

    class Allocator:
        def __init__(self):
            self.calls, self.next = [], 1 << 20

        def alloc(self, nbytes, trim=True):
            self.calls.append((nbytes, trim))
            self.next += nbytes
            return self.next - nbytes, nbytes

        def release(self, ptr, size):
            pass

    class Ops(StepOps):
        capturing = False
        allocator = Allocator()

    ops, pool_a, pool_b = Ops(), type("P", (), {"ptr": 10})(), type("P", (), {"ptr": 20})()
    ops._init_step_ops()
    row = 4 * 2 * 8 * 8
    first = ops._stage(pool_a, "node_states", (32, 2, 8, 8))
    assert first.shape == (32, 2, 8, 8) and ops.allocator.calls == [(32 * row, True)]
    assert ops._stage(pool_a, "node_states", (16, 2, 8, 8)).ptr == first.ptr and len(ops.allocator.calls) == 1
    other = ops._stage(pool_b, "node_states", (8, 2, 8, 8))
    assert other.ptr != first.ptr and ops.allocator.calls[-1] == (8 * row, True)
    u = ops._stage(pool_a, "u", (32, 2, 8))
    assert u.ptr not in (first.ptr, other.ptr) and ops.allocator.calls[-1] == (32 * 4 * 2 * 8, True)
    assert ops._stage(pool_a, "u", (8, 2, 8)).ptr == u.ptr and len(ops.allocator.calls) == 3
    k = ops._stage(pool_b, "k", (8, 2, 8), capacity=24)     # made for the capacity: 24 rows
    assert ops.allocator.calls[-1] == (24 * 4 * 2 * 8, True) and ops._stage(pool_b, "k", (24, 2, 8)).ptr == k.ptr
    ops.capturing = True
    grown = ops._stage(pool_a, "node_states", (40, 2, 8, 8))
    assert ops.allocator.calls[-1] == (64 * row, False) and grown.ptr != first.ptr
    assert ops._stage_outgrown[0].ptr == first.ptr
    assert ops._stage(pool_a, "node_states", (64, 2, 8, 8)).ptr == grown.ptr and len(ops.allocator.calls) == 5


def test_kv_move_rows_reads_every_source_first_and_skips_padding():
    rng = np.random.default_rng(0)
    pages = [3, 0, 2]
    kv = PagedKV(4, 2, 8)
    kv.k[:] = rng.standard_normal(kv.k.shape)
    kv.v[:] = rng.standard_normal(kv.v.shape)
    want_k = kv.k.copy().reshape(-1, 2, 8)
    path = [0, 2, 3, 5]        # row 2 is a source (move 2) and a destination (move 3)
    src, dst = tree_kv_moves(pages, 14, path)
    before = want_k.copy()
    for a, b in zip(src, dst):  # in order: each move reads a row no earlier move wrote
        want_k[b] = before[a]
    NumpyBackend().kv_move_rows(kv, src + [-1], dst + [-1])       # a padding pair is skipped
    assert np.array_equal(kv.k.reshape(-1, 2, 8), want_k)
    flat = lambda i: pages[i // PAGE_SIZE] * PAGE_SIZE + i % PAGE_SIZE  # noqa: E731
    assert (src, dst) == ([flat(16), flat(17), flat(19)], [flat(15), flat(16), flat(17)])


# ---- GPU: ops ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cuda():
    return get_backend("cuda")


NP = NumpyBackend()


def randn(*shape, seed=0, scale=1.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


@pytest.mark.gpu
def test_memory_views_and_copies(cuda):
    x = randn(6, 4, 8)
    d = cuda.asarray(x)
    assert d.shape == (6, 4, 8) and d.ndim == 3 and d.size == 192
    assert np.array_equal(cuda.to_numpy(d.reshape(24, -1)), x.reshape(24, 8))
    assert np.array_equal(d.to_numpy(), x)
    ids = cuda.asarray(np.arange(5, dtype=np.int32))
    assert ids.dtype == np.int32 and np.array_equal(cuda.to_numpy(ids), np.arange(5))
    assert not cuda.to_numpy(cuda.zeros((3, 5))).any()
    with pytest.raises(TypeError, match="to_numpy"):
        np.asarray(d)
    step = lambda: cuda.to_numpy(cuda.add(cuda.asarray(x), d))  # noqa: E731
    step()
    allocs = cuda.allocator.driver_allocs
    for _ in range(5):   # steady state: freed blocks are reused, the driver is not asked again
        step()
    assert cuda.allocator.driver_allocs == allocs


@pytest.mark.gpu
@pytest.mark.parametrize("a_shape,b_shape", [((65, 4), (4,)), ((63, 2, 64), (1,)), ((9, 192), (9, 192)),
                                             ((3, 8), ()), ((6, 16), (5, 6, 1)), ((5, 6, 16), (5, 1, 1))])
def test_add_mul_bitwise(cuda, a_shape, b_shape):
    a = randn(*a_shape, seed=1)
    b = np.float32(0.37) if b_shape == () else randn(*b_shape, seed=2)
    db = b if b_shape == () else cuda.asarray(b)
    for name in ("add", "mul"):
        got = cuda.to_numpy(getattr(cuda, name)(cuda.asarray(a), db))
        assert np.array_equal(got, getattr(NP, name)(a, b)), name


@pytest.mark.gpu
@pytest.mark.parametrize("T,H,D", [(1, 24, 256), (23, 4, 64), (0, 2, 8)])
def test_gated_query_and_output_gate(cuda, T, H, D):
    """The gated attention's q | gate interleave: one gather and one mul_sigmoid launch, the
    bits of the CUDA composition (split, sigmoid, mul) and of the numpy backend's queries."""
    from luce.ops.api import FusedOps

    qg, o = randn(T, H, 2 * D, seed=5, scale=6), randn(T, H * D, seed=6)
    dqg, do = cuda.asarray(qg), cuda.asarray(o)
    assert np.array_equal(cuda.to_numpy(cuda.gated_query(dqg)), NP.gated_query(qg))
    got = cuda.to_numpy(cuda.gate_output(do, dqg))
    assert got.shape == (T, H * D)
    assert np.array_equal(got, cuda.to_numpy(FusedOps.gate_output(cuda, do, dqg)))
    np.testing.assert_allclose(got, NP.gate_output(o, qg), rtol=2e-6, atol=1e-7)
    merged = np.concatenate([qg.reshape(T, 2 * H * D), randn(T, 3 * D, seed=7)], axis=1)   # a merged [q|gate | k]
    in_place = cuda.to_numpy(cuda.gate_output(do.reshape(T, H, D), cuda.asarray(merged)))
    assert np.array_equal(in_place, got)
    assert np.array_equal(NP.gate_output(o.reshape(T, H, D), merged), NP.gate_output(o, qg))


@pytest.mark.gpu
def test_copies_and_rowwise_ops(cuda):
    x = randn(65, 3, 64, seed=3, scale=3)
    dx = cuda.asarray(x)
    for got, want in zip(cuda.split(dx, [16, 40, 8]), NP.split(x, [16, 40, 8])):
        assert np.array_equal(cuda.to_numpy(got), want)
    assert np.array_equal(cuda.to_numpy(cuda.concat_rows([dx, dx.reshape(65, 3, 64)])),
                          np.concatenate([x, x]))
    for rows in (np.arange(10, 30), np.array([64, 0, 5, 5, 17])):
        assert np.array_equal(cuda.to_numpy(cuda.take_rows(dx, rows)), x[rows])
    dst, rows = cuda.asarray(x), np.array([64, 0, 17])
    cuda.put_rows(dst, rows, cuda.take_rows(dx, np.array([1, 2, 3])))
    want = x.copy()
    want[rows] = x[[1, 2, 3]]
    assert np.array_equal(cuda.to_numpy(dst), want)
    w = randn(64, seed=4) + 1
    close = lambda got, want: np.testing.assert_allclose(cuda.to_numpy(got), want, rtol=2e-5, atol=1e-5)  # noqa: E731
    close(cuda.rmsnorm(dx, cuda.asarray(w), 1e-6), NP.rmsnorm(x, w, 1e-6))
    close(cuda.gated_rmsnorm(dx, cuda.asarray(x[::-1].copy()), cuda.asarray(w), 1e-6),
          NP.gated_rmsnorm(x, x[::-1].copy(), w, 1e-6))
    for op in ("silu", "sigmoid", "softplus", "exp"):
        close(getattr(cuda, op)(dx), getattr(NP, op)(x))
    close(cuda.l2norm(dx, 1e-6), NP.l2norm(x, 1e-6))
    close(cuda.swiglu(dx.reshape(65, -1), cuda.asarray(x[::-1].reshape(65, -1))),
          NP.swiglu(x.reshape(65, -1), x[::-1].reshape(65, -1)))
    pos = np.arange(100, 165)
    close(cuda.rope(dx, pos, 64, 1e6), NP.rope(x, pos, 64, 1e6))
    close(cuda.rope(dx, pos, 8, 1e7, (2, 1, 1, 0)), NP.rope(x, pos, 8, 1e7, (2, 1, 1, 0)))


@pytest.mark.gpu
def test_weights_embedding_matmul_sampling(cuda):
    from gguf import GGMLQuantizationType as Q

    from luce.gguf import quants

    w = randn(300, 512, seed=5)
    x = randn(65, 512, seed=6)
    bias = randn(300, seed=7)
    wf = cuda.weight_from_array(w)
    np.testing.assert_allclose(cuda.to_numpy(cuda.matmul(cuda.asarray(x), wf, cuda.asarray(bias))),
                               NP.matmul(x, w, bias), rtol=1e-5, atol=1e-4)
    ids = np.array([299, 0, 7, 7])
    assert np.array_equal(cuda.to_numpy(cuda.embedding(wf, ids)), w[ids])
    raw = quants.quantize(w, Q.Q4_K)
    wq = cuda._upload_weight(raw, int(Q.Q4_K), (300, 512), "test")
    deq = quants.dequantize(raw, Q.Q4_K, (300, 512))
    assert np.array_equal(cuda.to_numpy(cuda.embedding(wq, ids)), deq[ids])
    ref = NP.matmul(x, deq)
    got = cuda.to_numpy(cuda.matmul(cuda.asarray(x), wq))
    assert np.abs(got - ref).max() <= 1.5e-4 * np.abs(ref).max(axis=1).max()
    cut = cuda.weight_rows(wq, 123)   # the first rows, a view: the first output columns, bitwise
    assert np.array_equal(cuda.to_numpy(cuda.matmul(cuda.asarray(x), cut)), got[:, :123])
    with pytest.raises(ValueError, match="supported"):
        cuda._upload_weight(raw, 2, (300, 512), "q4_0 tensor")   # Q4_0: not a matmul type
    logits = randn(5, 420, seed=8, scale=4)
    logits[2, [10, 11]] = 50.0                                    # a tie goes to the lowest id
    dl = cuda.asarray(logits)
    assert np.array_equal(cuda.argmax(dl), NP.argmax(logits))
    ids_c, lp_c = cuda.top_k_logprobs(dl, 8)
    ids_n, lp_n = NP.top_k_logprobs(logits, 8)
    assert np.array_equal(ids_c, ids_n)
    np.testing.assert_allclose(lp_c, lp_n, rtol=1e-5, atol=1e-5)


def _attention_batch(tree_seed=None):
    """Two ordinary segments (a prefill of 40 rows over 30 committed, an AR row) and padding,
    or with tree_seed a tree segment after them."""
    segs = [SegmentSpec(0, list(range(40)), 30, list(range(0, 5))), SegmentSpec(1, [3], 17, [5, 6]),
            SegmentSpec(-1, [0, 0], 0, [])]
    if tree_seed is None:
        return build_batch(segs)
    from tests.spec.test_tree_verify import random_tree

    tree = random_tree(5, 11, 4, seed=tree_seed)
    return build_batch(segs[:2] + [SegmentSpec(2, tree.tokens.tolist(), 20, [7, 8, 9], parents=tree.parents.tolist())])


@pytest.mark.gpu
@pytest.mark.parametrize("tree", [None, 1], ids=["ordinary", "tree"])
def test_kv_write_and_attention(cuda, tree):
    from luce.ops.cuda_sequence_ops import prompt_rows
    from tests.kernels.tolerances import tolerance

    batch = _attention_batch(tree)
    T, Hq, Hkv, D = batch.n_rows, 6, 2, 64
    kv_np, kv_cu = PagedKV(10, Hkv, D), PagedKV(10, Hkv, D, zeros=cuda.zeros)
    kv_np.k[:] = randn(*kv_np.k.shape, seed=9)
    kv_np.v[:] = randn(*kv_np.v.shape, seed=10)
    kv_cu.k, kv_cu.v = cuda.asarray(kv_np.k), cuda.asarray(kv_np.v)
    k, v, q = randn(T, Hkv, D, seed=11), randn(T, Hkv, D, seed=12), randn(T, Hq, D, seed=13)
    NP.kv_write(kv_np, batch, k, v)
    cuda.kv_write(kv_cu, batch, cuda.asarray(k), cuda.asarray(v))
    assert np.array_equal(cuda.to_numpy(kv_cu.k), kv_np.k) and np.array_equal(cuda.to_numpy(kv_cu.v), kv_np.v)
    got = cuda.to_numpy(cuda.attention(cuda.asarray(q), kv_cu, batch, 0.125))
    want = NP.attention(q, kv_np, batch, 0.125)
    live = batch.seq_slots[np.searchsorted(batch.qo_indptr, np.arange(T), side="right") - 1] >= 0
    prompt = np.arange(T) < prompt_rows(batch)   # f16 tensor cores (cuda/attention_prefill.cu)
    assert prompt.sum() == 40
    np.testing.assert_allclose(got[live & ~prompt], want[live & ~prompt], rtol=1e-4, atol=2e-6)
    np.testing.assert_allclose(got[live & prompt], want[live & prompt], *tolerance("attention_prompt_exact"))
    src, dst = np.array([35, 36, 50]), np.array([31, 32, 33])
    NP.kv_move_rows(kv_np, src, dst)
    cuda.kv_move_rows(kv_cu, src, dst)
    assert np.array_equal(cuda.to_numpy(kv_cu.k), kv_np.k) and np.array_equal(cuda.to_numpy(kv_cu.v), kv_np.v)


@pytest.mark.gpu
@pytest.mark.parametrize("T", [1, 2, 63, 64, 65])
def test_conv1d_and_delta_rule(cuda, T):
    H, dk, dv, C = 3, 64, 64, 96
    x, wc, st = randn(T, C, seed=14), randn(C, 4, seed=15, scale=0.5), randn(3, C, seed=16)
    got = cuda.causal_conv1d(cuda.asarray(x), cuda.asarray(wc), cuda.asarray(st))
    for g_, w_ in zip(got, NP.causal_conv1d(x, wc, st)):
        np.testing.assert_allclose(cuda.to_numpy(g_), w_, rtol=1e-5, atol=1e-6)
    q = NP.l2norm(randn(T, H, dk, seed=17), 1e-6) / 8
    k = NP.l2norm(randn(T, H, dk, seed=18), 1e-6)
    v, g = randn(T, H, dv, seed=19), -np.abs(randn(T, H, seed=20))
    beta, h0 = NP.sigmoid(randn(T, H, seed=21)), randn(H, dk, dv, seed=22, scale=0.1)
    dev = [cuda.asarray(a) for a in (q, k, v, g, beta, h0)]
    for op in (["gdn_recurrent"] if T <= 2 else []) + ["gdn_chunked"]:
        o, h = getattr(cuda, op)(*dev)
        o_ref, h_ref = getattr(NP, op)(q, k, v, g, beta, h0)
        np.testing.assert_allclose(cuda.to_numpy(o), o_ref, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(cuda.to_numpy(h), h_ref, rtol=1e-4, atol=1e-5)
    assert np.array_equal(cuda.to_numpy(dev[5]), h0), "the input state must stay as it was"


# ---- GPU: models ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_paths(tmp_path_factory):
    """Tiny models the kernels take: attention head_dim 64, GDN state 64."""
    from luce.testing.tiny_models import make_dense, make_qwen35

    root = tmp_path_factory.mktemp("cuda_tiny")
    paths = {}
    for mix in MODEL_TOL:
        paths[("qwen35", mix)] = root / f"qwen35_{mix}.gguf"
        make_qwen35(paths[("qwen35", mix)], seed=5, quant_mix=mix, head_dim=64, ssm_state_size=64)
        paths[("qwen3", mix)] = root / f"qwen3_{mix}.gguf"
        make_dense(paths[("qwen3", mix)], arch="qwen3", seed=5, quant_mix=mix, head_dim=64)
    return paths


@pytest.fixture(scope="module")
def models(tiny_paths, cuda):
    return {key: (load_model(p, NP), load_model(p, cuda)) for key, p in tiny_paths.items()}


def prefill_and_decode(model, tokens, T, n_decode):
    """Logits [1 + n_decode, V] (host): prefill tokens[:T] (last row), then AR rows."""
    pages = list(range(pages_needed(len(tokens))))
    state = model.new_state(max_pages=len(pages), max_slots=1)
    rows = []
    for start, n in [(0, T)] + [(T + i, 1) for i in range(n_decode)]:
        out = model.forward(build_batch([SegmentSpec(0, tokens[start:start + n], start, pages)]), state)
        rows.append(model.backend.to_numpy(out.logits))
    return np.concatenate(rows)


@pytest.mark.gpu
@pytest.mark.parametrize("arch", ["qwen35", "qwen3"])
@pytest.mark.parametrize("mix", list(MODEL_TOL))
def test_model_logits_match_numpy(models, arch, mix):
    ref_model, cuda_model = models[(arch, mix)]
    tokens = np.random.default_rng(3).integers(0, 400, 140).tolist()
    worst = 0.0
    for T in (1, 63, 64, 65, 129):
        want = prefill_and_decode(ref_model, tokens, T, 3)
        got = prefill_and_decode(cuda_model, tokens, T, 3)
        err = np.abs(got - want).max() / max(1.0, np.abs(want).max())
        worst = max(worst, err)
        assert err <= MODEL_TOL[mix], f"{arch} {mix} T={T}: error {err:.3g} of scale"
    print(f"MEASURE logits {arch} {mix}: max |cuda - numpy| / max(1, max |numpy|) = {worst:.3g}")


@pytest.mark.gpu
@pytest.mark.parametrize("arch", ["qwen35", "qwen3"])
def test_decode_row_is_batch_invariant(models, arch):
    model = models[(arch, "q4_k_m")][1]
    prompts = [np.random.default_rng(s).integers(0, 400, 20 + 9 * s).tolist() for s in range(6)]
    per = pages_needed(90)
    pages = lambda s: list(range(s * per, (s + 1) * per))  # noqa: E731

    def decode_row(companions):
        state = model.new_state(max_pages=6 * per, max_slots=6)
        for s in range(5):
            model.forward(build_batch([SegmentSpec(s, prompts[s], 0, pages(s))]), state)
        segs = [SegmentSpec(0, [7], len(prompts[0]), pages(0))]
        if companions == "prefill":
            segs = [SegmentSpec(5, prompts[5], 0, pages(5))] + segs
        elif companions == "ar":
            segs = [SegmentSpec(s, [11 * s], len(prompts[s]), pages(s)) for s in (1, 2)] + segs + \
                   [SegmentSpec(s, [11 * s], len(prompts[s]), pages(s)) for s in (3, 4)]
        logits = model.backend.to_numpy(model.forward(build_batch(segs), state).logits)
        return logits[{"alone": 0, "prefill": 1, "ar": 2}[companions]]

    alone = decode_row("alone")
    assert np.array_equal(decode_row("prefill"), alone)
    assert np.array_equal(decode_row("ar"), alone)


def _tree_batch(tree, slot, start, pages):
    return build_batch([SegmentSpec(slot, tree.tokens.tolist(), start, pages, parents=tree.parents.tolist())])


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["factor", "baseline"])
def test_tree_rows_through_the_model(models, mode):
    from tests.spec.test_tree_verify import random_tree

    prompt = np.random.default_rng(4).integers(0, 400, 30).tolist()
    tree = random_tree(9, 12, 5, seed=6)
    path = tree.path(tree.n_nodes - 1)
    results = []
    for model in models[("qwen35", "f32")]:
        model.gdn_tree_mode = mode
        pages = list(range(4))
        state = model.new_state(max_pages=4, max_slots=1)
        model.forward(build_batch([SegmentSpec(0, prompt, 0, pages)]), state)
        batch = _tree_batch(tree, 0, len(prompt), pages)
        out = model.forward(batch, state)
        tree_logits = model.backend.to_numpy(out.logits)
        commit_trees(state, out.staged, plan_tree_commit(batch, {0: path}))
        nxt = build_batch([SegmentSpec(0, [int(tree.tokens[0])], len(prompt) + len(path), pages)])
        results.append((tree_logits, model.backend.to_numpy(model.forward(nxt, state).logits)))
        model.gdn_tree_mode = "factor"
    (t_np, a_np), (t_cu, a_cu) = results
    scale = max(1.0, np.abs(t_np).max())
    err = max(np.abs(t_cu - t_np).max(), np.abs(a_cu - a_np).max()) / scale
    print(f"MEASURE tree rows qwen35 f32 ({mode}): max error after verify + commit = {err:.3g} of scale")
    assert err <= MODEL_TOL["f32"]
    assert cuda_backend_of(models).host_fallbacks == {}


def cuda_backend_of(models):
    return models[("qwen35", "f32")][1].backend


@pytest.mark.gpu
@pytest.mark.parametrize("arch,mode", [("qwen35", "factor"), ("qwen35", "baseline"), ("qwen3", "factor")])
def test_tree_kernel_nodes_and_commit_equal_ar_decoding_bitwise(models, cuda, arch, mode):
    """Every tree node's logits are bitwise those of AR decoding of its path, and the
    committed state decodes on bitwise like the AR-decoded one, in both GDN tree modes
    (factor capture; per-node stored states, the `--spec ddtree` baseline) on the device."""
    from tests.spec.test_tree_verify import random_tree

    model, be = models[(arch, "q4_k_m")][1], cuda
    if hasattr(model, "gdn_tree_mode"):
        model.gdn_tree_mode = mode
    prompt = np.random.default_rng(7).integers(0, 400, 37).tolist()
    pages = lambda s: list(range(4 * s, 4 * s + 4))  # noqa: E731
    state = model.new_state(max_pages=8, max_slots=2)
    for s in (0, 1):
        model.forward(build_batch([SegmentSpec(s, prompt, 0, pages(s))]), state)
    tree = random_tree(11, 13, 5, seed=8)
    P = len(prompt)
    batch = _tree_batch(tree, 0, P, pages(0))
    out = model.forward(batch, state)
    logits = be.to_numpy(out.logits)
    snap = state.recurrent.snapshot(1) if state.recurrent is not None else None
    leaves = [i for i in range(tree.n_nodes) if not tree.children(i)]
    for leaf in leaves:
        if snap is not None:
            state.recurrent.restore(1, snap)
        path = tree.path(leaf)
        for d, node in enumerate(path):
            ar = model.forward(build_batch([SegmentSpec(1, [int(tree.tokens[node])], P + d, pages(1))]), state)
            assert np.array_equal(be.to_numpy(ar.logits)[0], logits[node]), f"{arch}: node {node} of leaf {leaf}"
    path = tree.path(leaves[-1])   # slot 1 has just AR-decoded this path
    commit_trees(state, out.staged, plan_tree_commit(batch, {0: path}))
    nxt = [model.backend.to_numpy(model.forward(build_batch([SegmentSpec(s, [5], P + len(path), pages(s))]),
                                                state).logits) for s in (0, 1)]
    assert np.array_equal(nxt[0], nxt[1])
    if hasattr(model, "gdn_tree_mode"):
        model.gdn_tree_mode = "factor"
    assert be.host_fallbacks == {}


@pytest.mark.gpu
@pytest.mark.parametrize("arch", ["qwen35", "qwen3"])
def test_engine_greedy_tokens_equal_numpy(models, tiny_paths, arch):
    from luce.engine import Engine, EngineConfig, SamplingParams
    from luce.tokenizer import Tokenizer

    tokenizer = Tokenizer.from_gguf(tiny_paths[(arch, "f32")])
    prompts = [np.random.default_rng(s).integers(0, 400, n).tolist() for s, n in enumerate((5, 70, 130))]
    outputs = []
    for model in models[(arch, "f32")]:
        engine = Engine(model, tokenizer, EngineConfig(max_slots=3, ctx=256, token_budget=128))
        ids = [engine.add_request(p, SamplingParams(max_tokens=8, ignore_eos=True)) for p in prompts]
        while engine.has_unfinished():
            engine.step()
        outputs.append([engine.take_output(i).token_ids for i in ids])
    assert outputs[1] == outputs[0]


def measure_decode_step(path, n_steps: int = 50) -> float:
    """Median seconds of one eager decode step (forward of one AR row + argmax) on CUDA."""
    import time

    model = load_model(path, get_backend("cuda"))
    tokens = list(range(1, 65))
    pages = list(range(pages_needed(64 + n_steps + 1)))
    state = model.new_state(max_pages=len(pages), max_slots=1)
    out = model.forward(build_batch([SegmentSpec(0, tokens, 0, pages)]), state)
    nxt, times = int(model.backend.argmax(out.logits)[0]), []
    for i in range(n_steps):
        t0 = time.perf_counter()
        out = model.forward(build_batch([SegmentSpec(0, [nxt], 64 + i, pages)]), state)
        nxt = int(model.backend.argmax(out.logits)[0])
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


@pytest.mark.gpu
def test_recurrent_checkpoint_copies_the_given_slots_on_the_device(cuda, monkeypatch):
    """RecurrentState.checkpoint(slots) / rollback on CUDA: device copies of those slots'
    rows only (no download, no upload of state), every slot bitwise as before."""
    from luce.models.recurrent_state import RecurrentState

    rs = RecurrentState(cuda, (0, 2, 5), 4, (3, 64), (2, 32, 32))
    for il in rs.gdn_layers:
        for slot in range(4):
            rs.store(il, slot, randn(3, 64, seed=il * 8 + slot), randn(2, 32, 32, seed=il * 8 + slot + 100))
    digest = lambda: [cuda.to_numpy(a).tobytes() for a in rs._all]  # noqa: E731
    before = digest()
    per_slot = 4 * 3 * (3 * 64 + 2 * 32 * 32)
    with monkeypatch.context() as m:
        m.setattr(cuda, "to_numpy", lambda *a: pytest.fail("checkpoint downloaded state"))
        rs.checkpoint([3, 1])
        assert rs.saved_slots == (1, 3) and rs.copied_bytes == 2 * per_slot
        for il in rs.gdn_layers:
            for slot in (1, 3):
                cuda.copy_into(rs.gdn(il, slot), cuda.zeros((2, 32, 32)))
                cuda.copy_into(rs.conv(il, slot), cuda.zeros((3, 64)))
        rs.rollback()
        assert rs.copied_bytes == 4 * per_slot
    assert digest() == before
