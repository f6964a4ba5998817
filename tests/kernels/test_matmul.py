"""Quantized matmul (cuda/matmul.cu) against luce.ref.matmul on weights decoded by
luce.gguf.quants: parity on awkward shapes for every GGUF type, guard bands, NaN handling,
and bitwise batch invariance (a row alone, in a batch of 64, at other positions, on both
paths and launch shapes).

Errors are measured per output row in units of that row's largest |y| (the kernel's 16-bit
activation quantization errs in proportion to the row's scale, not to each element).
"""
from __future__ import annotations

import functools

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from luce.gguf import quants
from luce.ref.matmul import matmul as ref_matmul
from tests.kernels.tolerances import tolerance

BLOCK_TYPES = [Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.IQ4_XS, Q.Q8_0, Q.Q5_0]
FLOAT_TYPES = [Q.F32, Q.F16, Q.BF16]
ROWS = [1, 2, 63, 64, 65, 129]
N_ODD = 97
# k per type: two and a half 256-value chunks for 32-value blocks (a ragged last chunk)
K_OF = {Q.Q4_K: 512, Q.Q5_K: 512, Q.Q6_K: 768, Q.IQ4_XS: 512, Q.Q8_0: 352, Q.Q5_0: 608,
        Q.F32: 100, Q.F16: 96, Q.BF16: 130}


@functools.lru_cache(maxsize=None)
def weights(qtype, n: int, k: int, seed: int = 0):
    """(raw GGUF bytes [n, row_nbytes] u8, decoded f32 [n, k]) of random N(0, 1/k) weights."""
    rng = np.random.default_rng(1000 + seed)
    w = (rng.standard_normal((n, k)) / np.sqrt(k)).astype(np.float32)
    raw = quants.quantize(w, qtype)
    return raw, quants.dequantize(raw, qtype, (n, k))


def activations(rows: int, k: int, seed: int) -> np.ndarray:
    """N(0, 1) rows with a few rows scaled far up and down (per-row scales must not leak)."""
    x = np.random.default_rng(seed).standard_normal((rows, k)).astype(np.float32)
    x[1::7] *= 1000.0
    x[3::11] *= 1e-3
    return x


def assert_rows_close(got: np.ndarray, want: np.ndarray, kernel: str):
    rtol, atol = tolerance(kernel)
    scale = np.maximum(np.abs(want).max(axis=1, keepdims=True), 1e-30)
    np.testing.assert_allclose(got / scale, want / scale, rtol=rtol, atol=atol)


def x16_model(x: np.ndarray, bits: int = 16) -> np.ndarray:
    """x as the kernel sees it: per row and 256 values, rint(x * qmax / max|x|) * max|x| / qmax."""
    qmax = np.float32(2 ** (bits - 1) - 1)
    out = np.empty_like(x)
    for c in range(0, x.shape[1], 256):
        blk = x[:, c:c + 256]
        amax = np.abs(blk).max(axis=1, keepdims=True)
        inv = np.where(amax > 0, qmax / np.maximum(amax, 1e-30), 0).astype(np.float32)
        out[:, c:c + 256] = np.rint(blk * inv) * (amax / qmax)
    return out


@pytest.mark.parametrize("qtype", BLOCK_TYPES)
def test_tolerance_admits_16bit_activations_and_rejects_8bit(qtype):
    """The block-type tolerance holds for the kernel's arithmetic model (x at 16 bits per 256
    values, exact products) and is tight enough that 8-bit activations would fail it."""
    k = K_OF[qtype]
    raw, wd = weights(qtype, N_ODD, k)
    x = activations(65, k, seed=5)
    want = ref_matmul(x, wd)
    model16 = x16_model(x).astype(np.float64) @ wd.astype(np.float64).T
    assert_rows_close(model16, want, "matmul_blocks")
    model8 = x16_model(x, bits=8).astype(np.float64) @ wd.astype(np.float64).T
    with pytest.raises(AssertionError):
        assert_rows_close(model8, want, "matmul_blocks")


# ---- GPU ---------------------------------------------------------------------------------

def run_kernel(x, raw, qtype, n, bias=None, path=0, tune=0, raw_out=False, workspace=None, flags=0):
    """y [rows, n] from luce_matmul on device copies (output between guard bands)."""
    from luce import _cuda_matmul as km
    from luce.ops.cuda_memory import DeviceBuffer
    from luce.ops.native import load_kernels
    from tests.kernels.harness import GUARD_BYTES, GuardedOutput

    lib = load_kernels()
    rows, k = x.shape
    dx, dw = DeviceBuffer.from_numpy(x), DeviceBuffer.from_numpy(raw)
    db = DeviceBuffer.from_numpy(bias.astype(np.float32)) if bias is not None else None
    ws_bytes = km.workspace_bytes(rows, k)
    ws = workspace if workspace is not None else DeviceBuffer(max(ws_bytes, 16))
    out = GuardedOutput((rows, n))
    km.matmul(dx.ptr, dw.ptr, db.ptr if db else 0, out.ptr, ws.ptr, ws_bytes, rows, n, k,
              int(qtype), path, flags, tune)
    lib.synchronize()
    return out.buf.download(out.shape, np.float32, GUARD_BYTES) if raw_out else out.result()


def bits_differ(got: np.ndarray, want: np.ndarray, again=None) -> str:
    """Where two [rows, n] outputs differ bitwise (empty where they do not): how many elements, which
    tokens and rows (mod 64: the wide-token kernel's row blocks), NaN, the largest relative difference,
    and whether `again` (a second run of got's call) repeats got's bits."""
    bad = got.view(np.uint32) != want.view(np.uint32)
    if not bad.any():
        return ""
    tok, row = np.nonzero(bad)
    rel = np.abs(got[bad].astype(np.float64) - want[bad]) / (np.abs(want[bad]).astype(np.float64) + 1e-30)
    repeat = ""
    if again is not None:
        same = np.array_equal(again.view(np.uint32), got.view(np.uint32))
        repeat = f"; a second run {'repeats' if same else 'differs from'} it"
    return (f"{bad.sum()} of {bad.size} differ: tokens {np.unique(tok)[:12].tolist()}, {len(np.unique(row))} rows "
            f"(mod 64: {np.unique(row % 64)[:12].tolist()}), NaN {int(np.isnan(got[bad]).sum())}, "
            f"max rel {np.nanmax(rel):.3g}{repeat}")


def family(qtype) -> str:
    return "matmul_float" if qtype in FLOAT_TYPES else "matmul_blocks"


@pytest.mark.gpu
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("qtype", BLOCK_TYPES + FLOAT_TYPES)
def test_parity(qtype, rows):
    k = K_OF[qtype]
    raw, wd = weights(qtype, N_ODD, k)
    x = activations(rows, k, seed=rows)
    bias = np.random.default_rng(rows).standard_normal(N_ODD).astype(np.float32) if rows % 2 else None
    got = run_kernel(x, raw, qtype, N_ODD, bias=bias)
    assert_rows_close(got, ref_matmul(x, wd, bias), family(qtype))


@pytest.mark.gpu
@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q6_K, Q.IQ4_XS, Q.Q8_0])
@pytest.mark.parametrize("rows", [1, 33])
def test_parity_at_27b_width(qtype, rows):
    """k = 5120 (the 27B hidden size): 20 chunks, 5 per warp, prefetched."""
    raw, wd = weights(qtype, 48, 5120)
    x = activations(rows, 5120, seed=9)
    assert_rows_close(run_kernel(x, raw, qtype, 48), ref_matmul(x, wd), "matmul_blocks")


WIDE_K = 12288  # a down-projection-like k: 48 chunks, 12 per warp (cuda/matmul.cu)


@pytest.mark.gpu
@pytest.mark.parametrize("qtype", BLOCK_TYPES)
def test_wide_k_parity_and_invariance(qtype):
    """k = 12288: parity at 1 and 33 rows (integer scale sums over many chunks); a row's bits
    alone (the one-row kernel; for Q8_0 and Q5_0 the tile kernel, as the one-row kernel's
    shared memory would pass 48 KiB at this k) == in 33 rows == on the prefill path == two row
    tiles per block == in the first 9 rows. N = 40: the last row tile is partial (bounds-checked
    copies), the others are not."""
    raw, wd = weights(qtype, 40, WIDE_K)
    x = activations(33, WIDE_K, seed=12)
    batch = run_kernel(x, raw, qtype, 40)
    assert_rows_close(batch, ref_matmul(x, wd), "matmul_blocks")
    for r in (0, 1, 32):
        for tune in (0, 4, 5, 6, 7, 8):  # 5-8: the one-row kernel (matmul_gemv.cuh, IQ4_XS staged: matmul_gemv_staged.cuh), 4: the tile kernel
            alone = run_kernel(x[r:r + 1], raw, qtype, 40, tune=tune)
            assert np.array_equal(alone[0], batch[r]), f"row {r} alone (tune {tune}) differs from row {r} of 33"
    for path, tune in ((1, 0), (0, 1), (0, 2), (0, 3)):
        assert np.array_equal(run_kernel(x, raw, qtype, 40, path=path, tune=tune), batch), \
            f"path {path}, tune {tune} changed bits"
    assert np.array_equal(run_kernel(x[:9], raw, qtype, 40), batch[:9]), "first 9 rows differ"


@pytest.mark.gpu
@pytest.mark.parametrize("qtype", BLOCK_TYPES + FLOAT_TYPES)
def test_batch_invariance(qtype):
    """A row's bits: alone == in a batch of 64 == at another position in 129 rows ==
    prefill path == two row tiles per block."""
    k = K_OF[qtype]
    raw, _ = weights(qtype, N_ODD, k)
    x = activations(64, k, seed=77)
    bias = np.random.default_rng(3).standard_normal(N_ODD).astype(np.float32)
    batch = run_kernel(x, raw, qtype, N_ODD, bias=bias)
    for r in (0, 17, 63):
        for tune in (0, 4, 5, 6, 7, 8):  # 5-8: the one-row kernel (matmul_gemv.cuh, IQ4_XS staged: matmul_gemv_staged.cuh), 4: the tile kernel
            alone = run_kernel(x[r:r + 1], raw, qtype, N_ODD, bias=bias, tune=tune)
            assert np.array_equal(alone[0], batch[r]), f"row {r} alone (tune {tune}) differs from row {r} of 64"
    big = np.concatenate([x[::-1], activations(65, k, seed=78)])  # row r of x at 63 - r
    moved = run_kernel(big, raw, qtype, N_ODD, bias=bias)
    assert np.array_equal(moved[:64][::-1], batch), "rows moved in a batch of 129 changed bits"
    for path, tune in ((1, 0), (0, 1), (0, 2), (1, 2), (0, 3)):
        other = run_kernel(x, raw, qtype, N_ODD, bias=bias, path=path, tune=tune)
        assert np.array_equal(other, batch), f"path {path}, tune {tune} changed bits"
    for rows in (2, 9, 17, 33):
        part = run_kernel(x[:rows], raw, qtype, N_ODD, bias=bias)
        assert np.array_equal(part, batch[:rows]), f"first {rows} rows differ from the batch of 64"


# Qwen2.5-0.5B-Instruct Q4_K_M decode (hidden 896, not whole 256-value chunks): q / out
# 896 x 896 and k 128 x 896 (Q5_0), v 128 x 896 (Q8_0), gate / up 4864 x 896 and merged 9728 x 896
# (Q5_0); the down projection 896 x 4864 (Q6_K) and Q8_0 at the gate shape beside them.
QWEN05B = [(Q.Q5_0, 896, 896), (Q.Q5_0, 128, 896), (Q.Q8_0, 128, 896), (Q.Q5_0, 4864, 896),
           (Q.Q5_0, 9728, 896), (Q.Q8_0, 4864, 896), (Q.Q6_K, 896, 4864)]


@pytest.mark.gpu
@pytest.mark.parametrize("qtype,n,k", QWEN05B, ids=lambda v: getattr(v, "name", str(v)))
def test_one_row_kernel_at_qwen05b_shapes(qtype, n, k):
    """Each row of a 3-row call (the tile kernel) alone at tune 0, 4 (the tile kernel), 5 and 6
    (the one-row kernel, matmul_gemv.cuh) gives its bits, with bias; parity with the reference."""
    raw, wd = weights(qtype, n, k)
    x = activations(3, k, seed=n + k)
    bias = np.random.default_rng(n).standard_normal(n).astype(np.float32)
    batch = run_kernel(x, raw, qtype, n, bias=bias)
    assert_rows_close(batch, ref_matmul(x, wd, bias), "matmul_blocks")
    for r in range(3):
        for tune in (0, 4, 5, 6):
            alone = run_kernel(x[r:r + 1], raw, qtype, n, bias=bias, tune=tune)
            assert np.array_equal(alone[0].view(np.uint32), batch[r].view(np.uint32)), \
                f"row {r} alone (tune {tune}) differs from row {r} of 3"


MANY_TILES_N = 16 * 1500 + 5  # more row tiles than an H200 holds blocks: blocks take several


@pytest.mark.gpu
@pytest.mark.parametrize("qtype", BLOCK_TYPES)
def test_blocks_of_several_tiles(qtype):
    """n = 24005 rows (1501 row tiles, the last partial): the one-wave grid gives each block
    several tiles and streams them through one ring (cuda/matmul.cu). Parity at 1, 2, 17 and
    33 rows; bitwise equal to the other launch shapes (tune 1, and tune 3: one block per tile)
    and to the first rows of the batch of 33."""
    k = K_OF[qtype]
    raw97, wd97 = weights(qtype, N_ODD, k)
    reps = -(-MANY_TILES_N // N_ODD)
    raw = np.tile(raw97, (reps, 1))[:MANY_TILES_N]
    wd = np.tile(wd97, (reps, 1))[:MANY_TILES_N]
    x = activations(33, k, seed=21)
    batch = None
    for rows in (1, 2, 17, 33):
        got = run_kernel(x[:rows], raw, qtype, MANY_TILES_N)
        assert_rows_close(got, ref_matmul(x[:rows], wd), "matmul_blocks")
        for tune in (1, 3, 5, 6, 7, 8):
            other = run_kernel(x[:rows], raw, qtype, MANY_TILES_N, tune=tune)
            assert np.array_equal(got.view(np.uint32), other.view(np.uint32)), f"{rows} rows: tune {tune} changed bits"
        if batch is None:
            batch = run_kernel(x, raw, qtype, MANY_TILES_N)
        assert np.array_equal(got, batch[:rows]), f"first {rows} rows differ from the batch of 33"


@pytest.mark.gpu
@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q6_K, Q.Q8_0, Q.F16])
def test_nan_stays_in_its_row(qtype):
    k = K_OF[qtype]
    raw, _ = weights(qtype, N_ODD, k)
    x = activations(5, k, seed=4)
    clean = run_kernel(x, raw, qtype, N_ODD)
    x[2, 7] = np.nan
    dirty = run_kernel(x, raw, qtype, N_ODD, raw_out=True)
    assert np.isnan(dirty[2]).all()
    assert np.array_equal(np.delete(dirty, 2, axis=0), np.delete(clean, 2, axis=0))


# The 27B's IQ4_XS one-row shapes at their k (gate/up 5120 -> n, down 17408 -> 5120, out 6144 ->
# 5120): 20, 68 and 24 chunks, 5, 17 and 6 warps a block of the staged form (matmul_gemv_staged.cuh).
IQ4_27B = [(4101, 5120), (4099, 17408), (5123, 6144)]


@pytest.mark.gpu
@pytest.mark.parametrize("n,k", IQ4_27B)
def test_iq4_xs_one_row_forms_at_27b_shapes(n, k):
    """n rows (37 quantized rows tiled; more batches than the grid has blocks, a last batch of 1 to
    3 rows; at k = 6144 two batches a block, 3 stages): every one-row form (tune 0 and 5: staged, 4 rows a batch; 6: 8 rows; 7: the register
    form; 8: the three-prmt lookup) == the tile kernel (tune 4), bitwise, with and without bias;
    and with the weights 8 bytes past a 16-byte boundary, where the staged form does not run."""
    from luce import _cuda_matmul as km
    from luce.ops.cuda_memory import DeviceBuffer
    from luce.ops.native import load_kernels

    raw37, wd37 = weights(Q.IQ4_XS, 37, k)
    raw = np.ascontiguousarray(np.tile(raw37, (-(-n // 37), 1))[:n])
    x = activations(1, k, seed=n)
    want = run_kernel(x, raw, Q.IQ4_XS, n, tune=4)
    assert_rows_close(want[:, :37], ref_matmul(x, wd37), "matmul_blocks")
    for tune in (0, 5, 6, 7, 8):
        got = run_kernel(x, raw, Q.IQ4_XS, n, tune=tune)
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), f"tune {tune} differs from the tile kernel"
    bias = np.random.default_rng(k).standard_normal(n).astype(np.float32)
    with_bias = run_kernel(x, raw, Q.IQ4_XS, n, bias=bias, tune=4)
    assert np.array_equal(run_kernel(x, raw, Q.IQ4_XS, n, bias=bias).view(np.uint32), with_bias.view(np.uint32))
    lib = load_kernels()
    shifted = DeviceBuffer.from_numpy(np.concatenate([np.zeros(8, np.uint8), raw.reshape(-1)]))
    dx, y = DeviceBuffer.from_numpy(x), DeviceBuffer(n * 4)
    ws_bytes = km.workspace_bytes(1, k)
    ws = DeviceBuffer(ws_bytes)
    km.matmul(dx.ptr, shifted.ptr + 8, 0, y.ptr, ws.ptr, ws_bytes, 1, n, k, int(Q.IQ4_XS))
    lib.synchronize()
    got = y.download((1, n), np.float32)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), "weights at 8 mod 16 changed bits"


# The staged form of Q4_K, Q5_K and Q6_K (StagedK45 / StagedKQuant in matmul_gemv_staged_readers.cuh;
# tune 8, and tune 0 where the register form does not run: the Q4_K / Q5_K down at 68 chunks, Q6_K
# from 16 MiB) at the 27B's shapes: q|k|v 10240 x 5120, gate 17408 x 5120 (n cut), the down 5120 x
# 17408; tunes 5 and 6 their register form. Q6_K with n even (row n - 4 of 4,200-byte rows 16-byte aligned).
K_27B = [(Q.Q5_K, 4101, 5120), (Q.Q5_K, 4099, 17408), (Q.Q4_K, 4101, 5120), (Q.Q4_K, 5123, 6144),
         (Q.Q4_K, 4099, 17408), (Q.Q6_K, 4102, 5120), (Q.Q6_K, 4100, 17408)]


@pytest.mark.gpu
@pytest.mark.parametrize("qtype,n,k", K_27B, ids=lambda v: getattr(v, "name", str(v)))
def test_k_quant_staged_form_at_27b_shapes(qtype, n, k):
    """The staged form (tune 8; x from the workspace and quantized in lane, X_ONCE) == tune 0
    == the register form (tunes 5, 6) == the tile kernel (tune 4), bitwise, with bias; close to
    the reference."""
    from luce import _cuda_matmul as km

    raw37, wd37 = weights(qtype, 37, k)
    raw = np.ascontiguousarray(np.tile(raw37, (-(-n // 37), 1))[:n])
    x = activations(1, k, seed=n)
    bias = np.random.default_rng(k).standard_normal(n).astype(np.float32)
    want = run_kernel(x, raw, qtype, n, bias=bias, tune=4)
    assert_rows_close(want[:, :37], ref_matmul(x, wd37) + bias[:37], "matmul_blocks")
    for tune, flags in ((8, 0), (8, km.X_ONCE), (0, 0), (0, km.X_ONCE), (5, 0), (6, 0)):
        got = run_kernel(x, raw, qtype, n, bias=bias, tune=tune, flags=flags)
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), f"tune {tune} flags {flags} differ"


@pytest.mark.gpu
def test_reused_quantized_x_gives_the_same_bits():
    from luce import _cuda_matmul as km
    from luce.ops.cuda_memory import DeviceBuffer
    from luce.ops.native import load_kernels

    load_kernels()
    x = activations(7, 512, seed=11)
    ws = DeviceBuffer(km.workspace_bytes(7, 512))
    raw_a, _ = weights(Q.Q4_K, N_ODD, 512)
    raw_b, _ = weights(Q.IQ4_XS, 40, 512)
    run_kernel(x, raw_a, Q.Q4_K, N_ODD, workspace=ws)
    reused = run_kernel(x, raw_b, Q.IQ4_XS, 40, workspace=ws, flags=km.REUSE_X)
    assert np.array_equal(reused, run_kernel(x, raw_b, Q.IQ4_XS, 40))


@pytest.mark.gpu
def test_bad_arguments_raise():
    from luce import _cuda_matmul as km
    from luce._cuda import KernelError
    from luce.ops.native import load_kernels

    load_kernels()
    with pytest.raises(ValueError, match="not supported"):
        km.row_bytes(int(Q.Q4_K), 300)
    with pytest.raises(ValueError, match="not supported"):
        km.row_bytes(2, 256)  # Q4_0
    raw, _ = weights(Q.Q4_K, 16, 256)
    x = activations(2, 256, seed=1)
    with pytest.raises(KernelError, match="luce_matmul"):
        run_kernel(x, raw, 2, 16)  # unsupported type id
    with pytest.raises(KernelError, match="luce_matmul"):
        run_kernel(x, raw, Q.Q4_K, 16, tune=16)  # past kMaxTune (cuda/matmul.cu)
    with pytest.raises(KernelError, match="luce_matmul"):
        run_kernel(x, raw, Q.Q4_K, 16, tune=11)  # removed (the wide-token form's 2-warp shape)
    from luce.ops.cuda_memory import DeviceBuffer
    small = DeviceBuffer(64)
    with pytest.raises(KernelError, match="luce_matmul"):
        km.matmul(small.ptr, small.ptr, 0, small.ptr, small.ptr, 16, 2, 16, 256, int(Q.Q4_K))


# The few-row kernel (matmul_gemv_rows.cuh: IQ4_XS, Q5_K, Q4_K, Q6_K, Q8_0, Q5_0; 2..8 rows, k <= 6144) at the
# 27B's gate/up and qkv k (5120: 20 warps) and out k (6144: 24 warps), and at k = 512 (Q6_K: 2048);
# n not a multiple of 16 (a last batch overlapping the one before), more batches than the grid has
# blocks at the 27B shapes. Q6_K at k = 5120 (4,200-byte rows, staged back to back) and IQ4_XS at
# k = 1280 (680 B) need n row_bytes a multiple of 16: n even.
# Its large-k form (matmul_gemv_rows_k.cuh: k > 6144) at the 27B's down projection (5120 x 17408: 320
# batches over the one-wave grid, 2-3 a block; n + 3 for a last batch partly past n) and at k = 6400
# (25 chunks: 13 warps, one of them a chunk short), every type. Q8_0 at k = 6144 takes the large-k form
# (the few-row kernel's two stages do not fit 227 KiB); at k = 896 (a last chunk of 4 groups) the few-row
# kernel. Q5_0 (tune 9 only, its offset terms through the chain) at the 27B's k and the Coder-0.5B's.
FEW_ROWS = [(4101, 5120), (5123, 6144), (37, 512)]
FEW_ROWS_CASES = ([(q, n, k) for q in (Q.IQ4_XS, Q.Q5_K, Q.Q4_K) for n, k in FEW_ROWS] +
                  [(Q.Q6_K, 4102, 5120), (Q.Q6_K, 5123, 6144), (Q.Q6_K, 37, 2048), (Q.IQ4_XS, 38, 1280)] +
                  [(q, n, k) for q in (Q.IQ4_XS, Q.Q4_K, Q.Q5_K, Q.Q6_K) for n, k in ((5123, 17408), (4101, 6400))] +
                  [(Q.Q8_0, n, k) for n, k in ((4101, 5120), (5123, 6144), (38, 896), (5123, 17408))] +
                  [(Q.Q5_0, n, k) for n, k in ((4101, 5120), (38, 896), (4101, 4864))])


@pytest.mark.gpu
@pytest.mark.parametrize("qtype,n,k", FEW_ROWS_CASES, ids=lambda v: getattr(v, "name", str(v)))
def test_few_rows_kernel(qtype, n, k):
    """2..8 rows: tune 0 and 9 (the few-row kernel) == tune 4 and 10 (the tile kernel), bitwise, with and
    without bias; each row == the row alone (tune 0: the one-row kernel where it runs); parity; a NaN in
    one row's x stays in that row."""
    raw37, wd37 = weights(qtype, 37, k)
    raw = np.ascontiguousarray(np.tile(raw37, (-(-n // 37), 1))[:n])
    x = activations(8, k, seed=n)
    bias = np.random.default_rng(k).standard_normal(n).astype(np.float32)
    for b in (None, bias):
        alone = np.concatenate([run_kernel(x[r:r + 1], raw, qtype, n, bias=b) for r in range(8)])
        for rows in range(2, 9):
            tile = run_kernel(x[:rows], raw, qtype, n, bias=b, tune=4)
            assert np.array_equal(tile.view(np.uint32), alone[:rows].view(np.uint32)), f"{rows} rows: tile != alone"
            for tune in (0, 9, 10):  # 10: the tile kernel again
                got = run_kernel(x[:rows], raw, qtype, n, bias=b, tune=tune)
                assert np.array_equal(got.view(np.uint32), tile.view(np.uint32)), \
                    f"{rows} rows, tune {tune}: differs from the tile kernel"
    assert_rows_close(run_kernel(x, raw, qtype, n, tune=9)[:, :37], ref_matmul(x, wd37), "matmul_blocks")
    clean = run_kernel(x[:5], raw, qtype, n, tune=9)
    x[2, 7] = np.nan
    dirty = run_kernel(x[:5], raw, qtype, n, tune=9, raw_out=True)
    assert np.isnan(dirty[2]).all()
    assert np.array_equal(np.delete(dirty, 2, axis=0), np.delete(clean, 2, axis=0))


# The wide-token tile kernel (cuda/matmul_rows.cuh; tune 12) at verify and draft-block row
# counts: n = 4101 (row blocks of 64: the last partly past n), k of every type (Q8_0 / Q5_0: a
# ragged last chunk) and the 27B's k = 5120.
@pytest.mark.gpu
@pytest.mark.parametrize("qtype", BLOCK_TYPES)
@pytest.mark.parametrize("k", [None, 5120])
def test_wide_token_tile_kernel(qtype, k):
    """16, 17, 23, 33, 64 and 80 rows: tune 12 and its cluster forms 13 / 14 / 15 (the k parts shared
    by 2 / 4 / a counted number of blocks) == tune 3 and 2 (today's tile kernel), bitwise, with bias
    at odd row counts; each row == the row alone (tune 4: the tile kernel at one row); parity."""
    k = k or K_OF[qtype]
    n = 4101
    raw37, wd37 = weights(qtype, 37, k)
    raw = np.ascontiguousarray(np.tile(raw37, (-(-n // 37), 1))[:n])
    x = activations(80, k, seed=k + 5)
    bias = np.random.default_rng(k).standard_normal(n).astype(np.float32)
    alone = {r: run_kernel(x[r:r + 1], raw, qtype, n, bias=bias, tune=4)[0] for r in (0, 22, 79)}
    for rows in (16, 17, 23, 33, 64, 80):
        b = bias if rows % 2 else None
        want = run_kernel(x[:rows], raw, qtype, n, bias=b, tune=3)
        for tune in (2, 12, 13, 14, 15):
            got = run_kernel(x[:rows], raw, qtype, n, bias=b, tune=tune)
            diff = bits_differ(got, want)
            if diff:
                diff = bits_differ(got, want, run_kernel(x[:rows], raw, qtype, n, bias=b, tune=tune))
            assert not diff, f"{rows} rows, tune {tune}: {diff}"
        if b is not None:
            for r, row in alone.items():
                if r < rows:
                    assert np.array_equal(want[r].view(np.uint32), row.view(np.uint32)), f"{rows} rows: row {r}"
    for tune in (12, 13, 14, 15):
        assert_rows_close(run_kernel(x, raw, qtype, n, tune=tune)[:, :37], ref_matmul(x, wd37), "matmul_blocks")

