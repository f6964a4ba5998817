"""The attention kernels' own source on the CPU (tests/kernels/emu): the tiled prompt-row
kernel (cuda/attention_prefill.cu) gives every row bitwise what the per-row partition kernel
(cuda/attention.cu) gives, in launches with decoders, a tree, padding and several prompt
segments per tile. The emulation runs each CUDA thread as a host thread, so the cases are
small; tests/kernels/test_attention_prefill.py runs the full set on a GPU.
"""
from __future__ import annotations

import ctypes as C

import numpy as np
import pytest

from luce.models.kv_cache import PAGE_SIZE, pages_needed
from tests.kernels.emu import build as emu
from tests.kernels.test_attention import Pool, pack_trees, tree_reference
from tests.kernels.test_gdn_tree import random_tree

pytestmark = pytest.mark.slow
_P = C.c_void_p


class Params(C.Structure):
    """luce_attention_params (cuda/luce_ops_sequence.h), field for field."""
    _fields_ = ([(n, _P) for n in "q k v out ws qo kv_indptr kv_indices last slots tree".split()]
                + [("workspace_bytes", C.c_int64)]
                + [(n, C.c_int32) for n in "n_rows n_seg hq hkv d page max_kv causal".split()]
                + [("scale", C.c_float), ("prompt_rows", C.c_int32)])


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    try:
        path = emu.build(["attention.cu", "attention_prefill.cu"], tmp_path_factory.mktemp("emu"))
    except Exception as exc:  # noqa: BLE001 - a host without C++20 <barrier> cannot emulate
        pytest.skip(f"no host build of the attention kernels: {exc}")
    if path is None:
        pytest.skip("no g++")
    lib = C.CDLL(str(path))
    lib.luce_attention.argtypes = [C.POINTER(Params), _P]
    lib.luce_attention_workspace_bytes.restype = C.c_int64
    lib.luce_attention_workspace_bytes.argtypes = [C.c_int32] * 4
    return lib


def launch(lib, q, pool, batch, tp, scale, prompt_rows, causal=True):
    T, hq, d = q.shape
    max_kv = max([batch.kv_len(s) for s in range(batch.n_segments) if batch.seq_slots[s] >= 0] + [1])
    ws_bytes = lib.luce_attention_workspace_bytes(T, hq, d, max_kv)
    ws = np.full(ws_bytes // 4, np.nan, np.float32)
    out = np.full((T, hq, d), np.float32(1234.5))
    meta = [np.ascontiguousarray(a, np.int32) for a in (batch.qo_indptr, batch.kv_indptr, batch.kv_indices,
                                                        batch.kv_last_page_len, batch.seq_slots, tp)]
    p = Params(q.ctypes.data, pool.k.ctypes.data, pool.v.ctypes.data, out.ctypes.data, ws.ctypes.data,
               *(a.ctypes.data for a in meta), ws_bytes, T, batch.n_segments, hq, pool.k.shape[2], d, PAGE_SIZE,
               max_kv, int(causal), scale, prompt_rows)
    assert lib.luce_attention(C.byref(p), None) == 0
    return out


CASES = {  # (Hq, Hkv, D), [(slot, kv_len, rows)], trees, prompt_rows
    "g6_d128_tree_and_decoder_after": ((6, 1, 128), [(0, 270, 40), (1, 300, 1), (3, 258, 8)], 2, 40),
    "g8_two_prompts_and_padding_in_tiles": ((8, 1, 128), [(0, 265, 65), (-1, 0, 3), (1, 47, 17), (2, 257, 1)],
                                            None, 85),
    "g3_d256_prompt_rows_end_mid_segment": ((3, 1, 256), [(0, 267, 17), (1, 600, 1)], None, 9),
    "g2_d64_three_partitions": ((4, 2, 64), [(0, 575, 64), (1, 5, 1)], None, 64),
}


@pytest.mark.parametrize("name", CASES)
def test_tiled_rows_bitwise_equal_per_row_kernel_emulated(lib, name):
    (hq, hkv, d), specs, tree_seg, prompt_rows = CASES[name]
    rng = np.random.default_rng(len(name))
    pool = Pool(rng, sum(pages_needed(max(n, 1)) for _, n, _ in specs) + 2, hkv, d)
    seqs = [pool.seq(*s) for s in specs]
    trees = [random_tree(rng, specs[i][2]) if i == tree_seg else None for i in range(len(specs))]
    batch, tp = pack_trees(seqs, trees)
    q = rng.standard_normal((batch.n_rows, hq, d)).astype(np.float32)
    scale = 1.0 / np.sqrt(d)
    per_row = launch(lib, q, pool, batch, tp, scale, 0)
    tiled = launch(lib, q, pool, batch, tp, scale, prompt_rows)
    for r in range(batch.n_rows):
        assert np.array_equal(tiled[r], per_row[r]), f"row {r} differs between the kernels"
    live = per_row[:, 0, 0] != np.float32(1234.5)
    np.testing.assert_allclose(per_row[live], tree_reference(q, pool, batch, tp, scale)[live], rtol=1e-5, atol=1e-5)


def test_non_causal_rows_bitwise_emulated(lib):
    rng = np.random.default_rng(1)
    pool = Pool(rng, pages_needed(300) + 1, 1, 64)
    batch, tp = pack_trees([pool.seq(0, 300, 20)], [None])
    q = rng.standard_normal((20, 2, 64)).astype(np.float32)
    per_row = launch(lib, q, pool, batch, tp, 0.125, 0, causal=False)
    assert np.array_equal(launch(lib, q, pool, batch, tp, 0.125, 20, causal=False), per_row)
