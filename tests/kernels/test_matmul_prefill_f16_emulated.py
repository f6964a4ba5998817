"""The f16 prompt-row GEMM's own source on the CPU (cuda/matmul_prefill_f16.cu through
luce_matmul_prefill_f16, built by tests/kernels/emu with the shuffle forms of mma.sync and
ldmatrix, cuda/mma_f16.cuh) against luce/ref/matmul_prefill.py: the f16 x bit for bit
(scale_x_f16, in the kernel's k order), the product within f32_sum_bound, NaN rows, and a
row's bits equal whatever the row count, its place and the launch shape (tune 2, 4, 8).
Each CUDA thread is a host thread and each shuffle two barriers, so the shapes are small; tests/kernels/test_matmul_prefill.py runs the full set on a GPU.
"""
from __future__ import annotations

import ctypes as C

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from luce.ref.matmul_prefill_f16 import f32_sum_bound, matmul_prefill_f16, scale_x_f16
from tests.kernels.emu import build as emu
from tests.kernels.emu.matmul_params import MatmulParams as Params
from tests.kernels.test_matmul import activations, weights

pytestmark = pytest.mark.slow
_P = C.c_void_p
N = 40  # one 64-row block at tune 2 (the last 24 rows past n), one 128-row block at tune 4


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    lib = emu.load(["matmul_prefill_f16.cu"], tmp_path_factory.mktemp("emu_pgemm"), "the f16 prompt-row GEMM")
    lib.luce_matmul_prefill_f16_workspace_bytes.restype = C.c_int64
    lib.luce_matmul_prefill_f16_workspace_bytes.argtypes = [C.c_int64, C.c_int64]
    return lib


def run(lib, x, raw, qtype, n, bias=None, tune=2):
    """(y [rows, n], workspace bytes) of one call; y starts NaN."""
    x = np.ascontiguousarray(x, np.float32)
    raw = np.ascontiguousarray(raw)
    rows, k = x.shape
    nbytes = lib.luce_matmul_prefill_f16_workspace_bytes(rows, k)
    ws = np.zeros(nbytes // 4 + 4, np.float32)  # 16-byte aligned (numpy allocations are)
    y = np.full((rows, n), np.nan, np.float32)
    b = None if bias is None else np.ascontiguousarray(bias, np.float32)
    p = Params(x.ctypes.data, raw.ctypes.data, None if b is None else b.ctypes.data, y.ctypes.data, ws.ctypes.data,
               nbytes, rows, n, k, int(qtype), 1, 0, tune)
    assert lib.luce_matmul_prefill_f16(C.byref(p), None) == 0
    return y, ws.view(np.uint8)[:nbytes]


def unpermute(xh_stored: np.ndarray) -> np.ndarray:
    """[T, K] f16 in the kernel's k order (matmul_prefill_xh.cuh) -> natural order."""
    t, k = xh_stored.shape
    v = np.empty(16, np.int64)
    for q in range(4):
        v[2 * q], v[2 * q + 1], v[2 * q + 8], v[2 * q + 9] = 4 * q, 4 * q + 2, 4 * q + 1, 4 * q + 3
    out = np.empty_like(xh_stored)
    halves = xh_stored.reshape(t, k // 16, 16)
    out.reshape(t, k // 16, 16)[:, :, v] = halves
    return out


@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.IQ4_XS])
def test_matches_reference_and_scales_x_bitwise(lib, qtype):
    """65 rows (scaled far up and down, one holding inf), k = 512 (two chunks), bias: the
    stored f16 x equals scale_x_f16 bit for bit; outputs within f32_sum_bound of the
    reference; the inf row's outputs are NaN and the others finite."""
    k = 512
    raw, _ = weights(qtype, N, k)
    x = activations(65, k, seed=7)
    x[9, 100] = np.inf
    bias = np.random.default_rng(2).standard_normal(N).astype(np.float32)
    got, ws = run(lib, x, raw, qtype, N, bias, tune=2)
    tp = 128
    xh_want, scale_want = scale_x_f16(x)
    xh_got = unpermute(ws[:tp * k * 2].view(np.float16).reshape(tp, k))
    assert np.array_equal(xh_got[:65].view(np.uint16), xh_want.view(np.uint16))
    assert not xh_got[65:].any()
    scale_got = ws[tp * k * 2:tp * k * 2 + 4 * tp].view(np.float32)[:65]
    assert np.array_equal(scale_got, scale_want, equal_nan=True)
    assert np.isnan(got[9]).all()
    keep = np.arange(65) != 9
    assert np.isfinite(got[keep]).all()
    want = matmul_prefill_f16(x, raw, qtype, N, bias)
    err = np.abs(got[keep].astype(np.float64) - want[keep])
    bound = f32_sum_bound(x, raw, qtype, N)[keep] + 2.0 ** -23 * np.abs(want[keep])
    assert (err <= bound).all(), f"over the bound by {(err - bound).max():.3g}"


@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.IQ4_XS])
def test_row_bits_do_not_depend_on_rows_place_or_shape(lib, qtype):
    """k = 256: rows of a 40-row call (tune 2: two 32-token tiles) == a row alone == the
    rows reversed (tune 4: 4 warps, other tile positions) == 10 of them with 8 warps per block
    (64-token tiles)."""
    k = 256
    raw, _ = weights(qtype, N, k)
    x = activations(40, k, seed=11)
    full, _ = run(lib, x, raw, qtype, N, tune=2)
    assert np.array_equal(run(lib, x[33:34], raw, qtype, N, tune=2)[0][0], full[33])
    moved, _ = run(lib, x[::-1], raw, qtype, N, tune=4)
    assert np.array_equal(moved[::-1], full)
    assert np.array_equal(run(lib, x[30:40], raw, qtype, N, tune=8)[0], full[30:40])


@pytest.mark.parametrize("qtype", [Q.IQ4_XS, Q.Q6_K, Q.Q8_0])
def test_warpgroup_token_tiles_give_the_mma_sync_bits(lib, qtype):
    """The warpgroup-MMA launches (cuda/matmul_prefill_wgmma.cuh, each wgmma emulated as its
    m16n8k16 products) on 128-, 80- and 48-token tiles (tunes 32, 64, 80, 48; 256 weight rows a
    block where it fits: IQ4_XS and Q6_K at 80 tokens, not Q8_0) give tune 2's bits for 37 and
    100 rows, k = 512 (two chunks; 100 rows in 48- or 80-token tiles: a last tile past the 128
    padded rows of x, which it takes as zeros)."""
    k = 512
    raw, _ = weights(qtype, N, k)
    x = activations(100, k, seed=int(qtype))
    bias = np.random.default_rng(4).standard_normal(N).astype(np.float32)
    for rows in (37, 100):
        want, _ = run(lib, x[:rows], raw, qtype, N, bias, tune=2)
        assert np.isfinite(want).all()
        for tune in (80, 48, 32, 64):
            got, _ = run(lib, x[:rows], raw, qtype, N, bias, tune=tune)
            assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), \
                f"tune {tune}, {rows} rows: {np.sum(got != want)} outputs differ"


@pytest.mark.parametrize("qtype", [Q.Q6_K, Q.Q8_0])
def test_three_warpgroups_a_block_give_the_mma_sync_bits(tmp_path, monkeypatch, qtype):
    """LUCE_PREFILL_WG_GROUPS=3 (read once by a library: a fresh one here): the 80- and 48-token
    tiles with three warpgroups a block (192 weight rows; n = 200: a second, partial block) give
    tune 2's bits for 37 and 100 rows, k = 512."""
    monkeypatch.setenv("LUCE_PREFILL_WG_GROUPS", "3")
    lib3 = emu.load(["matmul_prefill_f16.cu"], tmp_path, "the f16 prompt-row GEMM")
    n, k = 200, 512
    raw, _ = weights(qtype, n, k)
    x = activations(100, k, seed=3)
    for rows in (37, 100):
        want, _ = run(lib3, x[:rows], raw, qtype, n, tune=2)
        for tune in (80, 48):
            got, _ = run(lib3, x[:rows], raw, qtype, n, tune=tune)
            assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), \
                f"tune {tune}, {rows} rows: {np.sum(got != want)} outputs differ"
