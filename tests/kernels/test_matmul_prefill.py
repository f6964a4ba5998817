"""The int8 prompt-row GEMM (cuda/matmul_prefill.cu, LUCE_PREFILL_GEMM=int8; the default is the
f16 one, tests/kernels/test_matmul_prefill_f16.py) against luce.ref.matmul_prefill: the 8-bit x
reference bit for bit in its quantization, the kernel within f32 rounding of the reference
product, and within the stated bound (luce.ref.matmul_prefill.error_bound) of the f32
product of x itself; a row's bits alone == among other rows == at other positions == on
either block shape; guard bands, NaN rows, REUSE_X.

Shapes: rows 1, 2, 63, 64, 65, 129, 512 (N = 97, k as test_matmul.K_OF), k at the 27B
(5120, 17408) and 1.5B (1536, 8960) widths, and 4096 rows (the 27B prefill chunk).
"""
from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from luce.ref.matmul import matmul as ref_matmul
from luce.ref.matmul_prefill import dequantize_x8, error_bound, matmul_prefill, quantize_x8
from tests.kernels.test_matmul import BLOCK_TYPES, K_OF, N_ODD, activations, assert_rows_close, weights
from tests.kernels.tolerances import tolerance

ROWS = [1, 2, 63, 64, 65, 129, 512]


@pytest.fixture(autouse=True)
def int8_gemm(monkeypatch):
    """Every launch of this file takes the int8 GEMM (read by luce_matmul_prefill per call)."""
    monkeypatch.setenv("LUCE_PREFILL_GEMM", "int8")


def tiled_weights(qtype, n: int, k: int):
    """(raw, decoded) [n, k]: the 97-row random matrix repeated (quantizing a full 27B matrix
    in numpy would take minutes; the kernel's speed and bits do not care)."""
    raw, wd = weights(qtype, N_ODD, k)
    reps = -(-n // N_ODD)
    return np.tile(raw, (reps, 1))[:n], np.tile(wd, (reps, 1))[:n]


def assert_within_bound(got: np.ndarray, x: np.ndarray, wd: np.ndarray, bias=None):
    """|got - x @ wd^T| <= error_bound (+ the f32 rounding the matmul_prefill tolerance
    admits, in units of the row's largest |y|)."""
    want = ref_matmul(x, wd, bias).astype(np.float64)
    _, atol = tolerance("matmul_prefill")
    slack = atol * np.abs(want).max(axis=1, keepdims=True)
    excess = np.abs(got - want) - (error_bound(x, wd) + slack)
    assert (excess <= 0).all(), f"error over the bound by up to {excess.max():.3g}"


# ---- reference (CPU) ----------------------------------------------------------------------

def test_quantize_x8_steps_and_bound():
    """q within [-127, 127], the block's largest |x| maps to +-127, every value within half
    a step of x; the product's error stays within error_bound and uses a fair part of it."""
    x = activations(65, 512, seed=3)
    x[5, :32] = 0.0                                   # an all-zero block: q = d = 0
    q, d = quantize_x8(x)
    assert q.dtype == np.int8 and np.abs(q.astype(np.int32)).max() <= 127
    assert (d[5, 0] == 0) and not q[5, :32].any()
    blocks = np.abs(q.reshape(65, 16, 32).astype(np.int32)).max(axis=2)
    assert (blocks[d > 0] == 127).all()
    err = np.abs(dequantize_x8(q, d) - x).reshape(65, 16, 32).max(axis=2)
    assert (err <= d * (0.5 + 1e-6)).all()
    _, wd = weights(Q.Q4_K, N_ODD, 512)
    actual = np.abs(matmul_prefill(x, wd).astype(np.float64) - x.astype(np.float64) @ wd.astype(np.float64).T)
    bound = error_bound(x, wd)
    assert (actual <= bound * (1 + 1e-4) + 1e-6 * np.abs(x @ wd.T)).all()
    assert actual.max() / bound.max() > 0.01  # not a bound no error comes near


def test_quantize_x8_nonfinite_block():
    x = activations(3, 64, seed=4)
    x[1, 40] = np.inf
    _, d = quantize_x8(x)
    assert np.isnan(d[1, 1]) and np.isfinite(np.delete(d.ravel(), 3)).all()


# ---- GPU ---------------------------------------------------------------------------------

def run_prefill(x, raw, qtype, n, bias=None, flags=0, workspace=None, tune=0):
    """y [rows, n] from luce_matmul_prefill on device copies (output between guard bands)."""
    from luce import _cuda_matmul as km
    from luce.ops.cuda_memory import DeviceBuffer
    from luce.ops.native import load_kernels
    from tests.kernels.harness import GuardedOutput

    lib = load_kernels()
    rows, k = x.shape
    dx, dw = DeviceBuffer.from_numpy(np.ascontiguousarray(x)), DeviceBuffer.from_numpy(np.ascontiguousarray(raw))
    db = DeviceBuffer.from_numpy(bias.astype(np.float32)) if bias is not None else None
    ws_bytes = km.prefill_workspace_bytes(rows, k)
    ws = workspace if workspace is not None else DeviceBuffer(max(ws_bytes, 16))
    out = GuardedOutput((rows, n))
    km.matmul_prefill(dx.ptr, dw.ptr, db.ptr if db else 0, out.ptr, ws.ptr, ws_bytes, rows, n, k, int(qtype), flags,
                      tune=tune)
    lib.synchronize()
    return out, ws


def prefill(x, raw, qtype, n, bias=None, tune=0):
    return run_prefill(x, raw, qtype, n, bias, tune=tune)[0].result()


@pytest.mark.gpu
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("qtype", BLOCK_TYPES)
def test_parity(qtype, rows):
    k = K_OF[qtype]
    raw, wd = weights(qtype, N_ODD, k)
    x = activations(rows, k, seed=rows)
    bias = np.random.default_rng(rows).standard_normal(N_ODD).astype(np.float32) if rows % 2 else None
    got = prefill(x, raw, qtype, N_ODD, bias)
    assert_rows_close(got, matmul_prefill(x, wd, bias), "matmul_prefill")
    assert_within_bound(got, x, wd, bias)


MODEL_K = [5120, 17408, 1536, 8960]   # 27B hidden / FFN, 1.5B hidden / FFN


@pytest.mark.gpu
@pytest.mark.parametrize("k", MODEL_K)
@pytest.mark.parametrize("qtype", BLOCK_TYPES)
def test_parity_at_model_widths(qtype, k):
    """n = 1000 (8 blocks of 128 rows, the last partial) at 65 rows; n = 2048 (the 1.5B qkv)
    at 129 rows."""
    for n, rows in ((1000, 65), (2048, 129)):
        raw, wd = tiled_weights(qtype, n, k)
        x = activations(rows, k, seed=k + rows)
        got = prefill(x, raw, qtype, n)
        assert_rows_close(got, matmul_prefill(x, wd), "matmul_prefill")
        assert_within_bound(got, x, wd)


@pytest.mark.gpu
@pytest.mark.parametrize("qtype", [Q.IQ4_XS, Q.Q4_K, Q.Q6_K, Q.Q8_0])
def test_prefill_chunk_4096_rows(qtype):
    """The time-critical shape: 4096 prompt rows (64 token tiles) at the 27B width k = 5120
    (n = 160: ten 16-row tiles, the second block of 128 rows partial)."""
    n, k = 160, 5120
    raw, wd = tiled_weights(qtype, n, k)
    x = activations(4096, k, seed=40)
    got = prefill(x, raw, qtype, n)
    assert_rows_close(got, matmul_prefill(x, wd), "matmul_prefill")
    assert_within_bound(got, x, wd)


@pytest.mark.gpu
@pytest.mark.parametrize("qtype", BLOCK_TYPES)
def test_row_bits_do_not_depend_on_the_chunk(qtype):
    """A row's bits: in 4096 rows (8-warp blocks, n = 1000) == alone == in the first 64 ==
    moved to other positions among other rows (4-warp blocks: few blocks) == with 2, 4 or 8
    warps per block set."""
    k = K_OF[qtype]
    n = 1000
    raw, _ = tiled_weights(qtype, n, k)
    x = activations(4096, k, seed=88)
    bias = np.random.default_rng(5).standard_normal(n).astype(np.float32)
    full = prefill(x, raw, qtype, n, bias)
    for r in (0, 63, 64, 4095):
        alone = prefill(x[r:r + 1], raw, qtype, n, bias)
        assert np.array_equal(alone[0], full[r]), f"row {r} alone differs from row {r} of 4096"
    assert np.array_equal(prefill(x[:64], raw, qtype, n, bias), full[:64]), "first 64 rows differ"
    part = np.concatenate([x[100:165][::-1], activations(7, k, seed=89)])  # rows 164..100 at 0..64
    moved = prefill(part, raw, qtype, n, bias)
    assert np.array_equal(moved[:65][::-1], full[100:165]), "rows moved within a chunk changed bits"
    for tune in (2, 4, 8):
        assert np.array_equal(prefill(x[:129], raw, qtype, n, bias, tune=tune), full[:129]), f"{tune} warps per block"


@pytest.mark.gpu
@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q5_0])
def test_reuse_x_and_nan_rows(qtype):
    """REUSE_X: a second weight over the quantized x of the first == its own call, bitwise.
    A row holding inf gives NaN outputs; the other rows are bitwise what they are without it."""
    from luce import _cuda_matmul as km

    k = K_OF[qtype]
    raw_a, _ = weights(qtype, N_ODD, k, seed=0)
    raw_b, wd_b = weights(qtype, N_ODD, k, seed=1)
    x = activations(70, k, seed=6)
    _, ws = run_prefill(x, raw_a, qtype, N_ODD)
    reused = run_prefill(x, raw_b, qtype, N_ODD, flags=km.REUSE_X, workspace=ws)[0].result()
    assert np.array_equal(reused, prefill(x, raw_b, qtype, N_ODD))
    bad = x.copy()
    bad[9, 37] = np.inf
    got = run_prefill(bad, raw_b, qtype, N_ODD)[0].raw()
    assert np.isnan(got[9]).all()
    keep = np.arange(70) != 9
    assert np.array_equal(got[keep], reused[keep])


@pytest.mark.gpu
def test_float_types_refused():
    from luce import _cuda_matmul as km
    from luce.ops.native import load_kernels

    load_kernels()
    with pytest.raises(ValueError, match="float type"):
        km.matmul_prefill(0, 0, 0, 0, 0, 0, 1, 1, 32, km.QTYPES["F16"])
