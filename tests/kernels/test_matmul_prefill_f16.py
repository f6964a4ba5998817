"""The f16 tensor-core prompt-row GEMM (cuda/matmul_prefill_f16.cu, LUCE_PREFILL_GEMM=f16) against
luce.ref.matmul_prefill_f16: its weight decode within f16 roundings of gguf's, its x scaling
(range, non-finite rows) on the CPU; on a GPU every type within the f32 accumulation bound of
the reference, more accurate than the int8 GEMM, a row's bits independent of the chunk and the
launch shape, REUSE_X and NaN rows. The int8 GEMM's tests: tests/kernels/test_matmul_prefill.py.
"""
from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from luce.ref.matmul_prefill_f16 import decode_f16, decode_parts, f32_sum_bound, matmul_prefill_f16, scale_x_f16
from tests.kernels.test_matmul import BLOCK_TYPES, K_OF, N_ODD, activations, weights
from tests.kernels.test_matmul_prefill import MODEL_K, ROWS, prefill, run_prefill, tiled_weights


@pytest.mark.parametrize("qtype", BLOCK_TYPES)
def test_decode_f16_is_gguf_within_f16_roundings(qtype):
    """The f16 GEMM's weights (decode_f16) against gguf's f32 decode: within the f16 roundings
    of scale, offset and value, 2^-10 (|q s| + |o|); exactly f16(gguf) where the value has
    no offset and its scale is exact in f16 (Q8_0, Q5_0 offsets aside); not all equal."""
    k = K_OF[qtype]
    raw, wd = weights(qtype, N_ODD, k)
    q, s, o = decode_parts(raw, qtype, N_ODD, k)
    wh = decode_f16(raw, qtype, N_ODD, k).astype(np.float64)
    mag = np.abs(q * s.astype(np.float64)) + np.abs(o.astype(np.float64))
    err = np.abs(wh - wd)
    assert (err <= 2.0 ** -10 * mag).all()
    assert err.max() > 0
    if qtype == Q.Q8_0:
        assert np.array_equal(wh, wd.astype(np.float16).astype(np.float64))


def test_scale_x_f16_range_and_nonfinite_rows():
    """Each row's largest |xh| in [2^14, 2^15] (power-of-two scales: xh * out_scale is x to
    f16's 11 bits); an all-zero row stays 0 with scale 1; a row with inf or NaN: xh 0, NaN."""
    x = activations(40, 256, seed=9)
    x[4] = 0.0
    x[7, 3], x[8, 200] = np.inf, np.nan
    xh, out_scale = scale_x_f16(x)
    live = np.setdiff1d(np.arange(40), [4, 7, 8])
    amax = np.abs(xh[live].astype(np.float64)).max(axis=1)
    assert ((amax >= 2 ** 14) & (amax <= 2 ** 15)).all()
    assert (np.log2(out_scale[live]) % 1 == 0).all()
    rel = np.abs(xh[live] * out_scale[live, None].astype(np.float64) - x[live]) / np.abs(x[live]).max(axis=1)[:, None]
    assert rel.max() <= 2.0 ** -11
    assert not xh[4].any() and out_scale[4] == 1
    assert np.isnan(out_scale[[7, 8]]).all() and not xh[[7, 8]].any()



def hopper() -> bool:
    """The GPU is an H100/H200 (sm_90): the build holds the sm_90a warpgroup-MMA tunes 32 and 64."""
    from luce.ops.nvidia_probe import probe

    return any(g.arch == "90" for g in probe().gpus)


@pytest.fixture
def f16_gemm(monkeypatch):
    monkeypatch.setenv("LUCE_PREFILL_GEMM", "f16")


def assert_f16_close(got, x, raw, qtype, n, bias=None):
    """|got - matmul_prefill_f16| <= f32_sum_bound + the output's f32 rounding (and bias add)."""
    want = matmul_prefill_f16(x, raw, qtype, n, bias).astype(np.float64)
    bound = f32_sum_bound(x, raw, qtype, n) + 2.0 ** -22 * np.abs(want)
    excess = np.abs(got - want) - bound
    assert (excess <= 0).all(), f"over the f32 accumulation bound by up to {excess.max():.3g}"


@pytest.mark.gpu
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("qtype", BLOCK_TYPES)
def test_f16_parity(f16_gemm, qtype, rows):
    k = K_OF[qtype]
    raw, _ = weights(qtype, N_ODD, k)
    x = activations(rows, k, seed=rows)
    bias = np.random.default_rng(rows).standard_normal(N_ODD).astype(np.float32) if rows % 2 else None
    assert_f16_close(prefill(x, raw, qtype, N_ODD, bias), x, raw, qtype, N_ODD, bias)


@pytest.mark.gpu
@pytest.mark.parametrize("k", MODEL_K)
@pytest.mark.parametrize("qtype", BLOCK_TYPES)
def test_f16_parity_at_model_widths(f16_gemm, qtype, k):
    """n = 1000 at 65 rows (4 blocks of 256 rows, the last partial); n = 2048 at 129 rows."""
    for n, rows in ((1000, 65), (2048, 129)):
        raw, _ = tiled_weights(qtype, n, k)
        x = activations(rows, k, seed=k + rows)
        assert_f16_close(prefill(x, raw, qtype, n), x, raw, qtype, n)


@pytest.mark.gpu
@pytest.mark.parametrize("qtype", [Q.IQ4_XS, Q.Q4_K, Q.Q6_K, Q.Q8_0])
def test_f16_more_accurate_than_int8(monkeypatch, qtype):
    """Against the f32 product of x itself (gguf's weights), 512 rows at k = 5120: the f16
    GEMM's worst row-relative error is under a quarter of the int8 GEMM's."""
    n, k = 160, 5120
    raw, wd = tiled_weights(qtype, n, k)
    x = activations(512, k, seed=41)
    exact = x.astype(np.float64) @ wd.astype(np.float64).T
    scale = np.abs(exact).max(axis=1, keepdims=True)
    monkeypatch.setenv("LUCE_PREFILL_GEMM", "int8")
    err8 = (np.abs(prefill(x, raw, qtype, n) - exact) / scale).max()
    monkeypatch.setenv("LUCE_PREFILL_GEMM", "f16")
    got = prefill(x, raw, qtype, n)
    assert_f16_close(got, x, raw, qtype, n)
    err16 = (np.abs(got - exact) / scale).max()
    assert err16 < 0.25 * err8, f"f16 {err16:.3g} vs int8 {err8:.3g}"


@pytest.mark.gpu
@pytest.mark.parametrize("qtype", BLOCK_TYPES)
def test_f16_row_bits_do_not_depend_on_the_chunk(f16_gemm, qtype):
    """A row's bits in 512 rows (n = 1000) == alone == in 7, 64, 65 rows == moved among
    other rows == with tune 2, 4, 8 and 16 (64 x 32, 128 x 32, 256 x 64, 128 x 128 tiles)."""
    k = K_OF[qtype]
    n = 1000
    raw, _ = tiled_weights(qtype, n, k)
    x = activations(512, k, seed=88)
    bias = np.random.default_rng(5).standard_normal(n).astype(np.float32)
    full = prefill(x, raw, qtype, n, bias)
    assert_f16_close(full, x, raw, qtype, n, bias)
    for r in (0, 63, 64, 511):
        assert np.array_equal(prefill(x[r:r + 1], raw, qtype, n, bias)[0], full[r]), f"row {r} alone"
    for rows in (7, 64, 65):
        assert np.array_equal(prefill(x[:rows], raw, qtype, n, bias), full[:rows]), f"first {rows} rows"
    part = np.concatenate([x[100:165][::-1], activations(7, k, seed=89)])
    moved = prefill(part, raw, qtype, n, bias)
    assert np.array_equal(moved[:65][::-1], full[100:165]), "rows moved within a chunk changed bits"
    for tune in (2, 4, 8, 16):
        assert np.array_equal(prefill(x[:129], raw, qtype, n, bias, tune=tune), full[:129]), f"tune {tune}"


# model widths, and for the 32-value types a ragged last chunk (the 0.5B's 896: 3.5 chunks)
WGMMA_CASES = [(q, k) for q in BLOCK_TYPES for k in MODEL_K] + [(Q.Q8_0, 896), (Q.Q5_0, 896), (Q.Q5_0, 608)]


@pytest.mark.gpu
@pytest.mark.parametrize("qtype, k", WGMMA_CASES)
def test_f16_wgmma_bits_are_the_mma_bits(f16_gemm, qtype, k):
    """H100/H200: the warpgroup-MMA launches (tune 32: 128 x 128 tiles, 64: 256 x 128, 80 / 48:
    80- / 48-token tiles of 256 rows where they fit, else 128) give
    tune 16's bits (mma.sync) for every row, at model widths and ragged k, n = 1000 (partial
    tiles) and 2,048, 1 to 300 rows; elsewhere tune 32 is refused, not run."""
    n = 1000 if k % 1024 else 2048
    raw, _ = tiled_weights(qtype, n, k)
    x = activations(300, k, seed=k)
    bias = np.random.default_rng(k).standard_normal(n).astype(np.float32)
    if not hopper():
        from luce._cuda import KernelError

        with pytest.raises(KernelError):
            prefill(x[:5], raw, qtype, n, bias, tune=32)
        return
    for rows in (1, 129, 300):
        want = prefill(x[:rows], raw, qtype, n, bias, tune=16)
        for tune in (32, 64, 80, 48):
            got = prefill(x[:rows], raw, qtype, n, bias, tune=tune)
            assert np.array_equal(got, want), f"tune {tune}, {rows} rows: {np.sum(got != want)} outputs differ"


@pytest.mark.gpu
@pytest.mark.parametrize("qtype", [Q.Q8_0, Q.Q6_K])
def test_f16_split_k_is_its_parts_in_rank_order(f16_gemm, qtype):
    """H100/H200, tune 81 (k split over a cluster of Z blocks, Z by the matrix: the 27B draft's k
    and v shape, 1,024 x 5,120, has 6 row blocks and takes Z > 1): its output is, bit for bit, the
    rank-order f32 sum of tune 80 on the k slices of exactly one Z in 2..8, the one
    luce_matmul_prefill_split_k reports (x with each row's max at the start of every chunk, so every
    slice has the row's scale); a row's bits are the same alone; within the f32 accumulation bound.
    Elsewhere tune 81 is tune 0's choice (tune 16's bits)."""
    n, k = 1024, 5120
    chunks = k // 256
    raw, _ = tiled_weights(qtype, n, k)
    x = activations(80, k, seed=81)
    x[:, ::256] = 1.5 * np.abs(x).max(axis=1, keepdims=True)
    got = prefill(x, raw, qtype, n, tune=81)
    if not hopper():
        assert np.array_equal(got, prefill(x, raw, qtype, n, tune=16))
        return
    cb = raw.shape[1] // chunks
    matches = []
    for z in range(2, 9):
        want = None
        for first, end in [(chunks * r // z, chunks * (r + 1) // z) for r in range(z)]:
            p = prefill(np.ascontiguousarray(x[:, first * 256:end * 256]), raw[:, first * cb:end * cb], qtype, n, tune=80)
            want = p if want is None else (want + p).astype(np.float32)
        if np.array_equal(got, want):
            matches.append(z)
    from luce import _cuda_matmul as km

    assert matches == [km.prefill_split_k(int(qtype), n, k)], f"tune 81 is the rank-order sum for Z in {matches}"
    assert np.array_equal(prefill(x[37:38], raw, qtype, n, tune=81)[0], got[37])
    assert_f16_close(got, x, raw, qtype, n)


@pytest.mark.gpu
@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q5_0, Q.IQ4_XS])
def test_f16_reuse_x_and_nan_rows(f16_gemm, qtype):
    """REUSE_X gives a second weight's own result bitwise; a row holding inf gives NaN
    outputs and leaves the other rows' bits alone."""
    from luce import _cuda_matmul as km

    k = K_OF[qtype]
    raw_a, _ = weights(qtype, N_ODD, k, seed=0)
    raw_b, _ = weights(qtype, N_ODD, k, seed=1)
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
