"""The few-row decode kernel (cuda/matmul_gemv_rows.cuh) for the K-quants Q5_K, Q4_K (integer scales
and mins: the min term MS from x's byte planes), Q6_K (signed scales by 16-value halves), Q8_0 (an
f16 scale a 32-value group: the tile kernel's float steps; k = 896, a last chunk of 4 groups) and Q5_0
(the same with each group's offset term meeting the chain before its chunk; tune 9 only) on the
CPU through the decode matmul's own source (tests/kernels/emu): 2..8 rows (tune 0 and 9) bitwise the
tile kernel (tune 4 and 10) with and without bias, with bulk and with per-thread copies, every row
bitwise the row alone (tune 0 at one row: the one-row kernel where it runs); n = 37 (a last batch
overlapping the one before), the 27B's k (5120: gate/up and qkv, 6144: out), k = 1280 (an odd chunk
count: Q5_K / Q4_K rows stay 16-byte multiples); rows not of a multiple of 16 bytes, staged back to
back (Q6_K at k = 5120: 4,200 B, IQ4_XS at k = 1280: 680 B) at n = 38; many batches a block; where it
does not run (those rows at n = 37: the last batch not 16-byte aligned; 25 chunks; n < 16; 9 rows; a
99 KB device at k = 5120) the tile kernel does, the same bits. IQ4_XS's other cases are in
test_matmul_emulated.py; tests/kernels/test_matmul.py runs the same
checks natively on a GPU. The large-k form (cuda/matmul_gemv_rows_k.cuh: k > 6144) likewise for every
type at the 27B's down k = 17408 and at k = 6400 / 8960 (fewer chunks a warp than the down's 6, one warp
short), over several batches a block, under LUCE_MATMUL_ROWS_TYPES, with a NaN row, and on a 99 KB device
(the tile kernel).
"""
from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from tests.kernels.test_matmul import activations, assert_rows_close, weights
from tests.kernels.test_matmul_emulated import rows_smem, run, same_bits
from tests.kernels.test_matmul_rows_emulated import CHUNK_BYTES, _load

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def libs(tmp_path_factory):
    """The bulk-copy build (sm_90) and the per-thread cp.async one (sm_80-89, HIP)."""
    return (_load(tmp_path_factory.mktemp("emu_rows_kq")),
            _load(tmp_path_factory.mktemp("emu_rows_kq_coop"), ("LUCE_GEMV_COOPERATIVE=1",)))


CASES = [(Q.Q5_K, 5120, 37), (Q.Q5_K, 6144, 37), (Q.Q5_K, 1280, 37), (Q.Q4_K, 5120, 37), (Q.Q4_K, 6144, 37),
         (Q.Q4_K, 512, 37), (Q.Q6_K, 6144, 37), (Q.Q6_K, 5120, 38), (Q.Q6_K, 2048, 37), (Q.IQ4_XS, 1280, 38),
         (Q.Q8_0, 5120, 37), (Q.Q8_0, 896, 38), (Q.Q5_0, 5120, 37), (Q.Q5_0, 896, 38), (Q.Q5_0, 4864, 37)]
BY_DEFAULT_OFF = {Q.Q5_0}  # matmul_gemv_rows_launch.cuh kGemvRowsQ50: tune 9 only


@pytest.mark.parametrize("qtype,k,n", CASES, ids=lambda v: getattr(v, "name", str(v)))
def test_few_rows_kernel_gives_the_tile_kernels_bits(libs, qtype, k, n):
    """2..8 rows: tune 0 and 9 (the few-row kernel; 9 alone for Q5_0) == tune 4 and 10 (the tile kernel) on
    the same rows, bitwise, with and without bias, both builds; each row == the row alone; close to the
    reference."""
    ran = (lambda tune: tune == 9) if qtype in BY_DEFAULT_OFF else (lambda tune: tune != 10)
    assert_rows_give_the_tile_kernels_bits(libs, qtype, k, n, k + 3, rows_smem(k, qtype), ran,
                                           every_build=lambda rows: True)


def assert_rows_give_the_tile_kernels_bits(libs, qtype, k, n, seed, smem, runs, every_build):
    """2..8 rows of an n x k matrix, with and without bias: tunes 0, 9 and 10 (10: the tile kernel) on
    every build (only libs[0] where every_build(rows) is false) give tune 4's bits, the kernel of dynamic
    shared memory `smem` running exactly where runs(tune); each row == the row alone (tune 0 at one row);
    all 8 rows close to the float64 product."""
    lib = libs[0]
    raw, wd = weights(qtype, n, k)
    x = activations(8, k, seed=seed)
    bias = np.random.default_rng(k).standard_normal(n).astype(np.float32)
    alone = {b is None: [run(lib, x[r:r + 1], raw, qtype, n, b)[0] for r in range(8)] for b in (None, bias)}
    for rows in range(2, 9):
        for b in (None, bias) if rows in (2, 5, 8) else ((bias if rows % 2 else None),):
            tile = run(lib, x[:rows], raw, qtype, n, b, tune=4)
            for build in libs if every_build(rows) else libs[:1]:
                for tune in (0, 9, 10):
                    got = run(build, x[:rows], raw, qtype, n, b, tune=tune)
                    assert (build.emu_last_launch_smem() == smem) == runs(tune), \
                        f"{rows} rows, tune {tune}: the kernel ran: {not runs(tune)}"
                    assert same_bits(got, tile), f"{rows} rows, tune {tune}: differs from the tile kernel"
            for r in range(rows):
                assert same_bits(tile[r], alone[b is None][r]), f"{rows} rows: row {r} differs from the row alone"
    want = x.astype(np.float64) @ wd.T.astype(np.float64) + bias
    assert_rows_close(run(lib, x, raw, qtype, n, bias, tune=9), want, "matmul_blocks")


@pytest.mark.parametrize("qtype,n", [(Q.Q5_K, 4227), (Q.Q4_K, 4227), (Q.Q6_K, 4228), (Q.Q8_0, 4227), (Q.Q5_0, 4227)],
                         ids=lambda v: getattr(v, "name", str(v)))
def test_few_rows_ring(libs, qtype, n):
    """Several batches a block, k = 512: n = 4227 (265 batches of 16 over the emulator's 132 blocks, 3
    stages, a last batch at row 4211; Q6_K: 4228, its 420-byte rows back to back), 5 and 8 rows, both
    builds (tune 9: Q5_0's is off by default): == the tile kernel."""
    k = 512
    raw, _ = weights(qtype, n, k)
    x = activations(8, k, seed=11)
    for rows in (5, 8):
        want = run(libs[0], x[:rows], raw, qtype, n, tune=4)
        for build in libs:
            got = run(build, x[:rows], raw, qtype, n, tune=9)
            assert build.emu_last_launch_smem() == rows_smem(k, qtype), "not the few-row kernel"
            assert same_bits(got, want), f"{rows} rows: differs from the tile kernel"


def test_few_rows_falls_back(libs):
    """Where the few-row kernel does not run the tile kernel does (the same bits): Q6_K at k = 5120
    and IQ4_XS at k = 1280, n = 37 (the last batch, at row 21, would start 8 bytes off a 16-byte
    boundary), Q4_K at n = 9 (< 16 rows) and at 9 rows, Q5_K at k = 6400 at 9 rows (2..8 take the
    large-k form, below), Q8_0 at k = 896, n = 37 (952-byte rows: the last batch 8 bytes off; a last chunk
    of 4 groups, which the large-k form does not take), Q5_0 at k = 6400 (no large-k form for Q5_0)."""
    lib = libs[0]
    for qtype, k, n, rows in ((Q.Q6_K, 5120, 37, 3), (Q.IQ4_XS, 1280, 37, 5), (Q.Q5_K, 6400, 37, 9),
                              (Q.Q4_K, 512, 9, 4), (Q.Q4_K, 512, 37, 9), (Q.Q8_0, 896, 37, 5), (Q.Q5_0, 6400, 37, 5)):
        raw, _ = weights(qtype, n, k)
        x = activations(rows, k, seed=3)
        got = run(lib, x, raw, qtype, n, tune=9)
        assert lib.emu_last_launch_smem() != rows_smem(k, qtype), f"{qtype.name} k {k}, n {n}, {rows} rows: ran"
        if qtype in (Q.Q8_0, Q.Q5_0):
            assert lib.emu_last_launch_smem() != rows_k_smem(k, qtype), f"{qtype.name} k {k}: the large-k form ran"
        assert same_bits(got, run(lib, x, raw, qtype, n, tune=4)), f"{qtype.name} k {k}: differs"


def test_few_rows_nan_and_99kb_devices(tmp_path, monkeypatch):
    """A device of 99 KiB opt-in shared memory (RTX 30/40/50): at k = 5120 two stages do not fit and
    the tile kernel runs, at k = 512 the few-row kernel does (3 stages), the same bits either way; a
    NaN in one row's x stays in that row (Q5_K: through the min term too; Q5_0: its offset terms; tune 9)."""
    monkeypatch.setenv("LUCE_EMU_SMEM_OPTIN", "101376")
    small = _load(tmp_path)
    n = 37
    for qtype, k, ran in ((Q.Q5_K, 5120, False), (Q.Q5_K, 512, True), (Q.Q4_K, 512, True), (Q.Q8_0, 512, True),
                          (Q.Q5_0, 512, True)):
        raw, _ = weights(qtype, n, k)
        x = activations(5, k, seed=k)
        got = run(small, x, raw, qtype, n, tune=9)
        assert (small.emu_last_launch_smem() == rows_smem(k, qtype, 101376)) == ran, \
            f"{qtype.name} k {k}: the few-row kernel ran: {not ran}"
        assert same_bits(got, run(small, x, raw, qtype, n, tune=4))
        x[2, 7] = np.nan
        dirty = run(small, x, raw, qtype, n, tune=9)
        assert np.isnan(dirty[2]).all()
        assert same_bits(np.delete(dirty, 2, axis=0), np.delete(got, 2, axis=0))


# The large-k form (cuda/matmul_gemv_rows_k.cuh: k > 6144, 2..8 rows).
ROWS_K_MAX_WARPS = 12  # kRowsKMaxWarps


def rows_k_smem(k: int, qtype, limit: int = 232448) -> int:
    """Dynamic shared memory of the large-k form: W warps (P = ceil(chunks / kRowsKMaxWarps) chunks a warp,
    W = ceil(chunks / P)) of R stages (LaneCopier's 16 row slots of an odd number of 16-byte words
    covering a chunk at any alignment; R = 3 where a stage is at most 3,328 B, else 2), c [cbufs][chunks]
    [16][8] floats (two buffers where they fit `limit`, else one), the x scales [8][chunks] and for Q4_K /
    Q5_K the byte planes of x's group sums [chunks][8][32 B]; 0 where one buffer does not fit."""
    chunks = -(-k // 256)
    per_warp = -(-chunks // ROWS_K_MAX_WARPS)
    warps = -(-chunks // per_warp)
    words = (CHUNK_BYTES[qtype] + 30) // 16
    stage = 16 * 16 * (words if words % 2 else words + 1)
    planes = 256 * chunks if qtype in (Q.Q4_K, Q.Q5_K) else 0
    base = warps * (3 if stage <= 3328 else 2) * stage + 4 * 8 * chunks + planes
    for cbufs in (2, 1):
        if base + cbufs * 4 * 16 * 8 * chunks <= limit:
            return base + cbufs * 4 * 16 * 8 * chunks
    return 0


# The 27B's down projection k = 17408 (68 chunks: 12 warps, 8 of 6 chunks and 4 of 5), n = 38 / 37 (3
# batches, the last partly past n: its rows past n read row n - 1 and are not stored; Q6_K's odd rows start
# 8 bytes off a 16-byte boundary), and k = 6400 (25 chunks: 9 warps, 7 of 3 and 2 of 2) / 8960 (35: 12 warps, 11 of 3 and one of 2); Q8_0 at the
# 27B's out k = 6144 too (24 chunks: 12 warps of 2), where the few-row kernel's two stages do not fit.
LARGE_K = [(Q.IQ4_XS, 17408, 38), (Q.Q4_K, 17408, 38), (Q.Q5_K, 17408, 37), (Q.Q6_K, 17408, 37),
           (Q.Q6_K, 17408, 38), (Q.Q5_K, 6400, 37), (Q.IQ4_XS, 8960, 21), (Q.Q8_0, 17408, 37), (Q.Q8_0, 6144, 37)]
LARGE_K_BY_DEFAULT = {Q.IQ4_XS, Q.Q8_0}  # matmul_gemv_rows_launch.cuh kGemvRowsK*: the types tune 0 gives it


@pytest.mark.parametrize("qtype,k,n", LARGE_K, ids=lambda v: getattr(v, "name", str(v)))
def test_few_rows_large_k_gives_the_tile_kernels_bits(libs, qtype, k, n):
    """2..8 rows: tune 9 (the large-k form; tune 0 too for the types it takes by default) == tune 4 and 10
    (the tile kernel) on the same rows, bitwise, with and without bias (both builds at 2, 5, 8 rows); each
    row == the row alone (tune 0 at one row); close to the reference."""
    smem = rows_k_smem(k, qtype)
    assert smem > 0
    assert_rows_give_the_tile_kernels_bits(
        libs, qtype, k, n, k + 5, smem, lambda tune: tune == 9 or (tune == 0 and qtype in LARGE_K_BY_DEFAULT),
        every_build=lambda rows: rows in (2, 5, 8))


def test_few_rows_q8_0_under_16_rows_of_w(libs):
    """Q8_0 with n = 9 weight rows (fewer than a batch: the few-row kernel does not run) takes the large-k
    form, its one batch's rows past n reading row n - 1 and not stored: 2..8 rows == the tile kernel."""
    k, n = 512, 9
    raw, _ = weights(Q.Q8_0, n, k)
    x = activations(8, k, seed=19)
    for rows in range(2, 9):
        want = run(libs[0], x[:rows], raw, Q.Q8_0, n, tune=4)
        for build in libs:
            got = run(build, x[:rows], raw, Q.Q8_0, n)
            assert build.emu_last_launch_smem() == rows_k_smem(k, Q.Q8_0), f"{rows} rows: not the large-k form"
            assert same_bits(got, want), f"{rows} rows: differs from the tile kernel"


@pytest.mark.parametrize("qtype,n", [(Q.IQ4_XS, 4227), (Q.Q4_K, 4227), (Q.Q6_K, 4227)],
                         ids=lambda v: getattr(v, "name", str(v)))
def test_few_rows_large_k_ring(libs, qtype, n):
    """Several batches a block, k = 6400: n = 4227 (265 batches over the emulator's 132 blocks: each warp's
    ring of stages and the c buffers run on across 2-3 batches, a last batch past n), 5 rows: == the tile
    kernel."""
    k = 6400
    raw, _ = weights(qtype, n, k)
    x = activations(5, k, seed=13)
    want = run(libs[0], x, raw, qtype, n, tune=4)
    got = run(libs[0], x, raw, qtype, n, tune=9)
    assert libs[0].emu_last_launch_smem() == rows_k_smem(k, qtype), "not the large-k form"
    assert same_bits(got, want), "differs from the tile kernel"


def test_few_rows_large_k_env_nan_and_99kb_devices(tmp_path, monkeypatch):
    """LUCE_MATMUL_ROWS_TYPES picks the types taking the large-k form under tune 0 (tune 9 takes it
    regardless); a NaN in one row's x stays in that row; a 99 KiB device (one c buffer does not fit)
    takes the tile kernel: the same bits every way."""
    k, n = 17408, 21
    monkeypatch.setenv("LUCE_MATMUL_ROWS_TYPES", "q4_k")
    (tmp_path / "env").mkdir()
    picked = _load(tmp_path / "env")
    for qtype in (Q.Q4_K, Q.IQ4_XS):
        raw, _ = weights(qtype, n, k)
        x = activations(4, k, seed=21)
        want = run(picked, x, raw, qtype, n, tune=4)
        got = run(picked, x, raw, qtype, n)
        assert (picked.emu_last_launch_smem() == rows_k_smem(k, qtype)) == (qtype == Q.Q4_K), qtype.name
        assert same_bits(got, want)
        assert same_bits(run(picked, x, raw, qtype, n, tune=9), want)
        assert picked.emu_last_launch_smem() == rows_k_smem(k, qtype), f"{qtype.name}: tune 9"
        x[2, 7] = np.nan
        dirty = run(picked, x, raw, qtype, n, tune=9)
        assert np.isnan(dirty[2]).all()
        assert same_bits(np.delete(dirty, 2, axis=0), np.delete(got, 2, axis=0))
    raw, _ = weights(Q.Q8_0, 37, 512)  # Q8_0 at tune 9 only where the env names q4_k alone
    x = activations(5, 512, seed=23)
    want = run(picked, x, raw, Q.Q8_0, 37, tune=4)
    for tune, ran in ((0, False), (9, True)):
        got = run(picked, x, raw, Q.Q8_0, 37, tune=tune)
        assert (picked.emu_last_launch_smem() == rows_smem(512, Q.Q8_0)) == ran, f"Q8_0 tune {tune}: ran {not ran}"
        assert same_bits(got, want)
    monkeypatch.delenv("LUCE_MATMUL_ROWS_TYPES")
    monkeypatch.setenv("LUCE_EMU_SMEM_OPTIN", "101376")
    (tmp_path / "small").mkdir()
    small = _load(tmp_path / "small")
    raw, _ = weights(Q.IQ4_XS, n, k)
    x = activations(5, k, seed=22)
    got = run(small, x, raw, Q.IQ4_XS, n, tune=9)
    assert small.emu_last_launch_smem() != rows_k_smem(k, Q.IQ4_XS), "the large-k form ran on 99 KiB"
    assert same_bits(got, run(small, x, raw, Q.IQ4_XS, n, tune=4))
