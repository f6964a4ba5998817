"""The int8 prompt-row GEMM's own source on the CPU (cuda/matmul_prefill.cu through
luce_matmul_prefill, built by tests/kernels/emu) at 80 rows (two 64-token tiles, the second with
16 live tokens: the kernel works its live 8-token sub-tiles only) and at 83 (a partly live
sub-tile): with LUCE_PREFILL_GEMM=int8 the workspace holds luce/ref/matmul_prefill.py's 8-bit x
bit for bit, the product is within f32 rounding of its reference, REUSE_X of its x gives the
second weight's own call bitwise, and unset the call is the f16 GEMM's.
tests/kernels/test_matmul_prefill.py runs the full set on a GPU."""
from __future__ import annotations

import ctypes as C

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from luce.ref.matmul_prefill import matmul_prefill, quantize_x8
from tests.kernels.emu import build as emu
from tests.kernels.emu.matmul_params import MatmulParams as Params
from tests.kernels.test_matmul import activations, assert_rows_close, weights

pytestmark = pytest.mark.slow
REUSE_X = 1
N = 24   # one block of 2 warps (tune 2: 32 weight rows, the last 8 past n) per token tile


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    lib = emu.load(["matmul_prefill.cu", "matmul_prefill_f16.cu", "matmul.cu"], tmp_path_factory.mktemp("emu_p8"),
                   "the int8 prompt-row GEMM")
    lib.luce_matmul_prefill_workspace_bytes.restype = C.c_int64
    lib.luce_matmul_prefill_workspace_bytes.argtypes = [C.c_int64, C.c_int64]
    return lib


def run(lib, x, raw, qtype, flags, ws=None, tune=2):
    """(y [rows, N], workspace) of one luce_matmul_prefill call (tune 2 unless given); y starts NaN."""
    x, raw = np.ascontiguousarray(x, np.float32), np.ascontiguousarray(raw)
    rows, k = x.shape
    nbytes = lib.luce_matmul_prefill_workspace_bytes(rows, k)
    ws = np.zeros(nbytes // 4 + 4, np.float32) if ws is None else ws   # 16-byte aligned
    y = np.full((rows, N), np.nan, np.float32)
    p = Params(x.ctypes.data, raw.ctypes.data, None, y.ctypes.data, ws.ctypes.data, nbytes, rows, N, k, int(qtype),
               1, flags, tune)
    assert lib.luce_matmul_prefill(C.byref(p), None) == 0
    return y, ws


def test_the_f16_split_tune_is_the_int8_gemms_own_choice(lib, monkeypatch):
    """The DFlash draft passes tune 81 (the f16 GEMM's split k) for its own rows; under
    LUCE_PREFILL_GEMM=int8 that is tune 0 (the same bits), where other f16-only tunes stay refused."""
    monkeypatch.setenv("LUCE_PREFILL_GEMM", "int8")
    raw, _ = weights(Q.Q8_0, N, 256, seed=4)
    x = activations(20, 256, seed=5)
    want = run(lib, x, raw, Q.Q8_0, 0, tune=0)[0]
    assert np.isfinite(want).all()
    assert np.array_equal(run(lib, x, raw, Q.Q8_0, 0, tune=81)[0], want)
    with pytest.raises(AssertionError):
        run(lib, x, raw, Q.Q8_0, 0, tune=80)
    parts_of = lib.luce_matmul_prefill_split_k
    parts_of.restype, parts_of.argtypes = C.c_int, [C.c_int32, C.c_int64, C.c_int64]
    assert parts_of(int(Q.Q8_0), 5120, 68 * 256) == 1 and parts_of(int(Q.Q8_0), 5120, 100) == 0
    assert parts_of(int(Q.F32), 5120, 256) == 0


# 80 rows: the second tile's first 2 of 8 token sub-tiles live; 83: its third holds 3 live tokens
# and 5 padding rows (the kernel copies and multiplies live sub-tiles only).
@pytest.mark.parametrize("qtype, rows", [(Q.Q8_0, 80), (Q.Q4_K, 80), (Q.Q4_K, 83)])
def test_the_int8_gemm_works_live_sub_tiles_only(lib, monkeypatch, qtype, rows):
    monkeypatch.setenv("LUCE_PREFILL_GEMM", "int8")
    k = 256
    raw, wd = weights(qtype, N, k, seed=2)
    raw_b, wd_b = weights(qtype, N, k, seed=3)
    x = activations(rows, k, seed=8)
    got, ws = run(lib, x, raw, qtype, 0)
    q, _ = quantize_x8(x)
    tp = 128   # rows padded to whole 64-token tiles
    stored = ws.view(np.uint8)[:tp * k].view(np.int8).reshape(tp, k)
    assert np.array_equal(stored[:rows], _mma_order(q))
    assert not stored[rows:].any()
    want = matmul_prefill(x, wd)
    assert_rows_close(got, want, "matmul_prefill")
    reused = run(lib, x, raw_b, qtype, REUSE_X, ws)[0]
    assert np.array_equal(reused, run(lib, x, raw_b, qtype, 0)[0])
    assert_rows_close(reused, matmul_prefill(x, wd_b), "matmul_prefill")
    monkeypatch.delenv("LUCE_PREFILL_GEMM")   # the f16 GEMM's default
    f16 = run(lib, x, raw, qtype, 0)[0]
    assert np.isfinite(f16).all() and not np.array_equal(f16, got)


def _mma_order(q: np.ndarray) -> np.ndarray:
    """[T, K] int8 -> the workspace's order (matmul_prefill_x.cuh): in each 32-value group, quad
    q's 8 bytes {values 4q..4q+3, 16+4q..16+4q+3} at 8 q."""
    t, k = q.shape
    g = q.reshape(t, k // 32, 32)
    words = [np.concatenate([g[:, :, 4 * j:4 * j + 4], g[:, :, 16 + 4 * j:20 + 4 * j]], axis=2) for j in range(4)]
    return np.stack(words, axis=2).reshape(t, k)
