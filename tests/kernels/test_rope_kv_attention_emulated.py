"""The attention input fused into a decode launch (luce_rope_kv_attention: cuda/attention.cu with
cuda/attention_rope_input.cuh) on the CPU from its own source (tests/kernels/emu) against the
two launches it replaces, luce_rope_kv then luce_attention: every output bit and every KV byte
the same, with and without the q/k norms, at D 64 and 128, GQA groups 1..7, rows whose keys sit
inside one chunk, across chunk boundaries and exactly on a page and a chunk boundary, padding
segments, one query head or all a block (several blocks writing one KV head's new row), merged
in the kernel or by the combine launch; close to luce/ref/rope_kv_attention.py. Launches it
does not fuse are refused. tests/kernels/test_rope_kv_attention.py runs the same on a GPU."""
from __future__ import annotations

import ctypes as C

import numpy as np
import pytest

from luce.models.kv_cache import PAGE_SIZE, pages_needed
from luce.ref.rope_kv_attention import rope_kv_attention
from tests.kernels.emu import build as emu
from tests.kernels.test_attention import Pool, pack
from tests.kernels.test_attention_emulated import FILL, Params
from tests.kernels.test_fused_decode_emulated import RopeParams, ptr
from tests.kernels.tolerances import tolerance

pytestmark = pytest.mark.slow
_P = C.c_void_p
EPS = 1e-6
THETA = 1e6


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    lib = emu.load(["attention.cu", "attention_prefill.cu", "rope_kv.cu"], tmp_path_factory.mktemp("emu"),
                   "the attention and rope_kv kernels")
    lib.luce_attention.argtypes = [C.POINTER(Params), _P]
    lib.luce_rope_kv.argtypes = [C.POINTER(RopeParams), _P]
    lib.luce_rope_kv_attention.argtypes = [C.POINTER(RopeParams), C.POINTER(Params), _P]
    lib.luce_attention_workspace_bytes.restype = C.c_int64
    lib.luce_attention_workspace_bytes.argtypes = [C.c_int32] * 7 + [C.c_int64]
    return lib


class Step:
    """A decode step: the q | k | v projection of its rows (row stride wider than its columns),
    the norms, positions, KV rows and the pool its keys live in."""

    def __init__(self, rng, hq, hkv, d, specs, qk_norm, rope_dim=None):
        self.hq, self.hkv, self.d = hq, hkv, d
        self.rope_dim = d if rope_dim is None else rope_dim
        self.pool = Pool(rng, sum(pages_needed(max(n, 1)) for _, n, _ in specs) + 2, hkv, d)
        seqs = [self.pool.seq(*s) for s in specs]
        self.batch = pack(seqs)
        T = self.batch.n_rows
        self.width = (hq + 2 * hkv) * d
        self.qkv = (rng.standard_normal((T, self.width + 8)) * 2).astype(np.float32)   # 8 more: a row stride
        self.norms = [(1 + 0.1 * rng.standard_normal(d)).astype(np.float32) for _ in range(2)] if qk_norm \
            else [None, None]
        pages, offsets, _ = self.batch.row_kv_locations()
        self.kv_dst = np.where(pages >= 0, pages * PAGE_SIZE + offsets, -1).astype(np.int64)
        self.positions = np.asarray(self.batch.positions, np.int32)
        self.max_kv = max([n for _, n, _ in specs] + [1])

    def rope_params(self, k_pages, v_pages, q_out=None):
        T, hq, hkv, d, stride = self.batch.n_rows, self.hq, self.hkv, self.d, self.qkv.shape[1]
        base = self.qkv.ctypes.data
        return RopeParams(base, base + 4 * hq * d, base + 4 * (hq + hkv) * d, ptr(self.norms[0]), ptr(self.norms[1]),
                          ptr(q_out), ptr(k_pages), ptr(v_pages), ptr(self.kv_dst), ptr(self.positions), T, stride,
                          stride, stride, 0, hq, hkv, d, self.rope_dim, 1, (C.c_int32 * 4)(0, 0, 0, 0), THETA, EPS)

    def attention_params(self, lib, q, k_pages, v_pages, out, counters, keep):
        b, T = self.batch, self.batch.n_rows
        ws_bytes = lib.luce_attention_workspace_bytes(T, 0, self.hq, self.d, self.max_kv, self.hkv, PAGE_SIZE, 0)
        ws = np.full(-(-ws_bytes // 4), np.nan, np.float32)
        meta = [np.ascontiguousarray(a, np.int32) for a in (b.qo_indptr, b.kv_indptr, b.kv_indices,
                                                            b.kv_last_page_len, b.seq_slots)]
        keep += [ws, *meta]
        p = Params(ptr(q), ptr(k_pages), ptr(v_pages), ptr(out), ptr(ws), *(ptr(a) for a in meta), None, ws_bytes,
                   T, b.n_segments, self.hq, self.hkv, self.d, PAGE_SIZE, self.max_kv, 1, 1.0 / np.sqrt(self.d), 0)
        if counters is not None:
            p.counters, p.n_counters = counters.ctypes.data, counters.size
        return p

    def unfused(self, lib, counters=None):
        """luce_rope_kv then luce_attention -> (out, k pages, v pages)."""
        k, v = self.pool.k.copy(), self.pool.v.copy()
        q_out = np.full((self.batch.n_rows, self.hq, self.d), np.nan, np.float32)
        out = np.full_like(q_out, FILL)
        keep = []
        assert lib.luce_rope_kv(C.byref(self.rope_params(k, v, q_out)), None) == 0
        assert lib.luce_attention(C.byref(self.attention_params(lib, q_out, k, v, out, counters, keep)), None) == 0
        return out, k, v

    def fused(self, lib, counters=None, status=0, **change):
        k, v = self.pool.k.copy(), self.pool.v.copy()
        out = np.full((self.batch.n_rows, self.hq, self.d), FILL, np.float32)
        keep = []
        r = self.rope_params(k, v)
        p = self.attention_params(lib, None, k, v, out, counters, keep)   # q: never read
        for name, value in change.items():
            setattr(r if hasattr(r, name) and name not in ("causal",) else p, name, value)
        assert lib.luce_rope_kv_attention(C.byref(r), C.byref(p), None) == status
        return out, k, v

    def reference(self):
        T, hq, hkv, d = self.batch.n_rows, self.hq, self.hkv, self.d
        q, k, v = (self.qkv[:, a:b].reshape(T, -1, d) for a, b in
                   ((0, hq * d), (hq * d, (hq + hkv) * d), ((hq + hkv) * d, self.width)))
        kp, vp = self.pool.k.copy(), self.pool.v.copy()
        b = self.batch
        csr = (b.qo_indptr, b.kv_indptr, b.kv_indices, b.kv_last_page_len, b.seq_slots)
        return rope_kv_attention(q, k, v, self.positions, self.kv_dst, kp, vp, csr, 1.0 / np.sqrt(d),
                                 self.rope_dim, THETA, *self.norms, EPS), kp, vp


def same_bits(a, b):
    return np.array_equal(np.ascontiguousarray(a).view(np.uint32), np.ascontiguousarray(b).view(np.uint32))


# (slot, kv_len, rows): decode rows inside one chunk (1, 17), exactly on a page and a chunk boundary
# (32: the new key the last of chunk 0; 33: alone in chunk 1; 48: a page), several chunks (160), a
# longer chunk (513 keys: chunks of 64, the new key alone in the last), padding segments (3 rows, 0 rows)
SPECS = [(0, 1, 1), (1, 17, 1), (-1, 0, 3), (2, 32, 1), (3, 33, 1), (4, 48, 1), (5, 160, 1), (6, 513, 1),
         (-1, 0, 0)]


@pytest.mark.parametrize("qk_norm", [False, True], ids=["qwen2", "qwen3"])
@pytest.mark.parametrize("d", [64, 128])
def test_fused_decode_input_gives_the_two_launches_bits_emulated(lib, monkeypatch, qk_norm, d):
    rng = np.random.default_rng(d + qk_norm)
    step = Step(rng, 12, 2, d, SPECS, qk_norm)
    base, k0, v0 = step.unfused(lib)
    live = np.repeat(step.batch.seq_slots >= 0, np.diff(step.batch.qo_indptr))
    want, kr, vr = step.reference()
    np.testing.assert_allclose(base[live], want[live], *tolerance("attention"))
    np.testing.assert_allclose(k0, kr, rtol=1e-5, atol=1e-5)
    assert same_bits(v0, vr), "the value rows"
    for heads in ("1", "2", "6"):   # 6: all G a block; 1 and 2: several blocks write one KV head's row
        monkeypatch.setenv("LUCE_ATTN_GROUP_HEADS", heads)
        for counters in (None, np.zeros(1 << 12, np.int32)):   # the combine launch, merged in the kernel
            out, k, v = step.fused(lib, counters)
            assert same_bits(out, base), f"{heads} heads a block, merged in kernel: {counters is not None}"
            assert same_bits(k, k0) and same_bits(v, v0), "the KV pages"
            assert counters is None or not counters.any(), "a merge counter left set"
    assert (out[~live] == FILL).all(), "a padding row was written"


@pytest.mark.parametrize("hq,hkv", [(1, 1), (2, 1), (3, 1), (8, 2), (10, 2), (12, 2), (14, 2)])
def test_fused_decode_input_every_group_size_emulated(lib, hq, hkv):
    """GQA groups 1..7 (the 0.5B: 14 / 2, the 1.5B: 12 / 2), at the default head groups."""
    rng = np.random.default_rng(hq * 10 + hkv)
    step = Step(rng, hq, hkv, 64, [(0, 40, 1), (-1, 0, 1), (1, 96, 1), (2, 15, 1)], qk_norm=hq % 2 == 0,
                rope_dim=32 if hq == 3 else None)   # a partial rotary too
    counters = np.zeros(1 << 10, np.int32)
    base, k0, v0 = step.unfused(lib, counters)
    out, k, v = step.fused(lib, counters)
    assert same_bits(out, base) and same_bits(k, k0) and same_bits(v, v0)


def test_a_row_is_the_same_in_any_batch_emulated(lib):
    """A decode row's output and KV bytes alone and among other rows (DESIGN 5)."""
    rng = np.random.default_rng(5)
    step = Step(rng, 6, 1, 128, [(0, 70, 1), (1, 300, 1), (-1, 0, 2), (2, 9, 1)], qk_norm=True)
    out, _, _ = step.fused(lib, np.zeros(256, np.int32))
    alone = Step(np.random.default_rng(0), 6, 1, 128, [(0, 70, 1)], qk_norm=True)
    alone.pool, alone.norms = step.pool, step.norms   # the same keys, pages and norms
    row = step.batch.qo_indptr[0]
    alone.batch = pack([type("S", (), {"slot": 0, "kv_len": 70, "n_rows": 1,
                                       "pages": list(step.batch.segment_pages(0))})()])
    alone.qkv = step.qkv[row:row + 1].copy()
    alone.kv_dst, alone.positions, alone.max_kv = step.kv_dst[:1].copy(), step.positions[:1].copy(), 70
    one, _, _ = alone.fused(lib, np.zeros(256, np.int32))
    assert same_bits(one[0], out[row])


@pytest.mark.parametrize("change", [{"prompt_rows": 1}, {"head_dim": 256}, {"n_pos": 4}, {"rows": 3},
                                    {"causal": 0}, {"heads_q": 2}, {"q_head_stride": 128}])
def test_launches_it_does_not_fuse_are_refused_emulated(lib, change):
    step = Step(np.random.default_rng(1), 4, 1, 64, [(0, 20, 1), (1, 7, 1)], qk_norm=False)
    out, k, v = step.fused(lib, status=1, **change)   # cudaErrorInvalidValue
    assert (out == FILL).all() and same_bits(k, step.pool.k), "a refused launch wrote"
