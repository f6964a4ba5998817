"""The attention output quantized for the next matmul (cuda/attention_quant.cuh) on the CPU
(tests/kernels/emu): luce_attention with x_workspace, then luce_matmul with REUSE_X on it,
against the unfused composition (luce_attention, then luce_matmul quantizing out itself):
the same f32 output, the same workspace bytes (quantized values, scales, sums) and the same
matmul bits, at the Qwen2.5-Coder-1.5B (12 / 2 heads, D 128) and 0.5B (14 / 2, D 64) shapes,
decode rows whose key counts cross chunk boundaries, a row without keys, a padding row and tree
rows; in-kernel merge (the last head group of a row quantizes it) and a combine launch
(quantize_x_kernel after it). tests/kernels/test_attention.py runs the same check on a GPU.
"""
from __future__ import annotations

import ctypes as C

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from luce.models.kv_cache import PAGE_SIZE, pages_needed
from tests.kernels.emu import build as emu
from tests.kernels.emu.matmul_params import MatmulParams
from tests.kernels.test_attention import Pool, pack_trees
from tests.kernels.test_attention_emulated import Params
from tests.kernels.test_gdn_tree import random_tree
from tests.kernels.test_matmul import weights

pytestmark = pytest.mark.slow
_P = C.c_void_p
REUSE_X = 1
SHAPES = {"1.5b": (12, 2, 128), "0.5b": (14, 2, 64)}
# (slot, kv_len, rows): AR rows over 1..300 keys (one chunk, several, a partial last one), a row
# of no keys, a padding segment (slot -1), a tree of 4 rows
SPECS = [(0, 1, 1), (1, 31, 1), (2, 33, 1), (3, 100, 1), (4, 0, 1), (-1, 0, 1), (5, 257, 1), (6, 300, 4)]


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    lib = emu.load(["attention.cu", "attention_prefill.cu", "matmul.cu"], tmp_path_factory.mktemp("emu_aq"),
                   "the attention and matmul kernels")
    lib.luce_attention.argtypes = [C.POINTER(Params), _P]
    lib.luce_attention_workspace_bytes.restype = C.c_int64
    lib.luce_attention_workspace_bytes.argtypes = [C.c_int32] * 7 + [C.c_int64]
    lib.luce_matmul_workspace_bytes.restype = C.c_int64
    lib.luce_matmul_workspace_bytes.argtypes = [C.c_int64, C.c_int64]
    lib.luce_matmul.argtypes = [C.POINTER(MatmulParams), _P]
    lib.emu_last_launch_smem.restype = C.c_size_t
    return lib


def attend(lib, q, pool, batch, tp, x_ws=None, counters=None):
    """out [T, Hq, D] (padding rows zero, as the backend allocates them) of one launch; x_ws:
    the matmul workspace it also quantizes out into."""
    T, hq, d = q.shape
    max_kv = max([batch.kv_len(s) for s in range(batch.n_segments) if batch.seq_slots[s] >= 0] + [1])
    ws_bytes = lib.luce_attention_workspace_bytes(T, 0, hq, d, max_kv, pool.k.shape[2], PAGE_SIZE, 0)
    ws = np.full(-(-ws_bytes // 4), np.nan, np.float32)
    out = np.zeros((T, hq, d), np.float32)
    meta = [np.ascontiguousarray(a, np.int32) for a in (batch.qo_indptr, batch.kv_indptr, batch.kv_indices,
                                                        batch.kv_last_page_len, batch.seq_slots, tp)]
    p = Params(q.ctypes.data, pool.k.ctypes.data, pool.v.ctypes.data, out.ctypes.data, ws.ctypes.data,
               *(a.ctypes.data for a in meta), ws_bytes, T, batch.n_segments, hq, pool.k.shape[2], d, PAGE_SIZE,
               max_kv, 1, 1.0 / np.sqrt(d), 0)
    if counters is not None:
        p.counters, p.n_counters = counters.ctypes.data, counters.size
    if x_ws is not None:
        p.x_workspace, p.x_workspace_bytes = x_ws.ctypes.data, x_ws.size
    assert lib.luce_attention(C.byref(p), None) == 0
    if counters is not None:
        assert not counters.any(), "the launch left a counter non-zero"
    return out


def matmul(lib, x, raw, n, ws, flags):
    rows, k = x.shape
    y = np.full((rows, n), np.nan, np.float32)
    p = MatmulParams(x.ctypes.data, raw.ctypes.data, None, y.ctypes.data, ws.ctypes.data, ws.size, rows, n, k,
                     int(Q.Q8_0), 0, flags, 0)
    assert lib.luce_matmul(C.byref(p), None) == 0
    return y


def case(shape, seed=0):
    hq, hkv, d = SHAPES[shape]
    rng = np.random.default_rng(seed)
    pool = Pool(rng, sum(pages_needed(max(n + r, 1)) for _, n, r in SPECS) + 2, hkv, d)
    seqs = [pool.seq(*s) for s in SPECS]
    trees = [random_tree(rng, r) if r > 1 else None for _, _, r in SPECS]
    batch, tp = pack_trees(seqs, trees)
    q = rng.standard_normal((batch.n_rows, hq, d)).astype(np.float32)
    q[1] *= 100.0   # per-row, per-chunk scales must not leak between rows
    return q, pool, batch, tp


@pytest.mark.parametrize("merge", ["in_kernel", "combine_launch"])
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_fused_quantization_is_the_unfused_matmuls_bits_emulated(lib, shape, merge):
    q, pool, batch, tp = case(shape)
    T, hq, d = q.shape
    k, n = hq * d, 40
    raw, _ = weights(Q.Q8_0, n, k, seed=3)
    raw = np.ascontiguousarray(raw)
    G = hq // pool.k.shape[2]
    groups = T * pool.k.shape[2] * G   # the most head-group counters a launch uses (one head a block)
    n_counters = {"in_kernel": groups + T, "combine_launch": 0}[merge]
    counters = np.zeros(n_counters, np.int32) if n_counters else None
    x_bytes = lib.luce_matmul_workspace_bytes(T, k)
    # unfused: attention, then the matmul quantizes out into its workspace
    out = attend(lib, q, pool, batch, tp, counters=counters)
    ws = np.full(x_bytes, 0xA5, np.uint8)
    want = matmul(lib, out.reshape(T, k), raw, n, ws, 0)
    # fused: attention quantizes into the workspace, the matmul reuses it
    fused_ws = np.full(x_bytes, 0x5A, np.uint8)
    fused_out = attend(lib, q, pool, batch, tp, x_ws=fused_ws, counters=counters)
    # the last launch: the partition kernel (dynamic shared memory) quantized in-kernel, or quantize_x_kernel
    assert (lib.emu_last_launch_smem() > 0) == (merge == "in_kernel")
    assert np.array_equal(fused_out.view(np.uint32), out.view(np.uint32)), "the attention output moved"
    assert np.array_equal(fused_ws, ws), "the quantized x differs from quantize_x_kernel's"
    got = matmul(lib, fused_out.reshape(T, k), raw, n, fused_ws, REUSE_X)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    assert np.isfinite(want).all()


@pytest.mark.parametrize("group_heads", ["1", "2", "3"])
def test_fused_quantization_bits_whatever_heads_a_block_takes_emulated(lib, monkeypatch, group_heads):
    """Head groups of 1, 2, 3 heads (a 256-value chunk spans several blocks' heads, at D 64 two
    KV heads' blocks): the same bytes."""
    monkeypatch.setenv("LUCE_ATTN_GROUP_HEADS", group_heads)
    q, pool, batch, tp = case("0.5b", seed=1)
    T, hq, d = q.shape
    k = hq * d
    counters = np.zeros(T * hq + T, np.int32)
    x_bytes = lib.luce_matmul_workspace_bytes(T, k)
    ws = np.zeros(x_bytes, np.uint8)
    raw, _ = weights(Q.Q8_0, 8, k, seed=4)
    out = attend(lib, q, pool, batch, tp, counters=counters)
    matmul(lib, out.reshape(T, k), np.ascontiguousarray(raw), 8, ws, 0)
    fused_ws = np.full(x_bytes, 0x5A, np.uint8)
    fused_out = attend(lib, q, pool, batch, tp, x_ws=fused_ws, counters=counters)
    assert lib.emu_last_launch_smem() > 0, "not quantized in the partition kernel"
    assert np.array_equal(fused_out.view(np.uint32), out.view(np.uint32))
    assert np.array_equal(fused_ws, ws)


def test_too_small_quant_workspace_is_refused_emulated(lib):
    q, pool, batch, tp = case("0.5b")
    T, hq, d = q.shape
    x_ws = np.zeros(lib.luce_matmul_workspace_bytes(T, hq * d) - 16, np.uint8)
    max_kv = 304
    ws_bytes = lib.luce_attention_workspace_bytes(T, 0, hq, d, max_kv, pool.k.shape[2], PAGE_SIZE, 0)
    ws = np.zeros(-(-ws_bytes // 4), np.float32)
    out = np.zeros((T, hq, d), np.float32)
    meta = [np.ascontiguousarray(a, np.int32) for a in (batch.qo_indptr, batch.kv_indptr, batch.kv_indices,
                                                        batch.kv_last_page_len, batch.seq_slots, tp)]
    p = Params(q.ctypes.data, pool.k.ctypes.data, pool.v.ctypes.data, out.ctypes.data, ws.ctypes.data,
               *(a.ctypes.data for a in meta), ws_bytes, T, batch.n_segments, hq, pool.k.shape[2], d, PAGE_SIZE,
               max_kv, 1, 1.0 / np.sqrt(d), 0)
    p.x_workspace, p.x_workspace_bytes = x_ws.ctypes.data, x_ws.size
    assert lib.luce_attention(C.byref(p), None) != 0
