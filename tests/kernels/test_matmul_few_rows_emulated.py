"""The few-row decode kernel (cuda/matmul_gemv_rows.cuh) for the K-quants Q5_K, Q4_K (integer scales
and mins: the min term MS from x's byte planes) and Q6_K (signed scales by 16-value halves) on the
CPU through the decode matmul's own source (tests/kernels/emu): 2..8 rows (tune 0 and 9) bitwise the
tile kernel (tune 4 and 10) with and without bias, with bulk and with per-thread copies, every row
bitwise the row alone (tune 0 at one row: the one-row kernel where it runs); n = 37 (a last batch
overlapping the one before), the 27B's k (5120: gate/up and qkv, 6144: out), k = 1280 (an odd chunk
count: Q5_K / Q4_K rows stay 16-byte multiples); rows not of a multiple of 16 bytes, staged back to
back (Q6_K at k = 5120: 4,200 B, IQ4_XS at k = 1280: 680 B) at n = 38; many batches a block; where it
does not run (those rows at n = 37: the last batch not 16-byte aligned; 25 chunks; n < 16; 9 rows; a
99 KB device at k = 5120) the tile kernel does, the same bits. IQ4_XS's other cases are in
test_matmul_emulated.py; tests/kernels/test_matmul.py runs the same
checks natively on a GPU.
"""
from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from tests.kernels.test_matmul import activations, assert_rows_close, weights
from tests.kernels.test_matmul_emulated import rows_smem, run, same_bits
from tests.kernels.test_matmul_rows_emulated import _load

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def libs(tmp_path_factory):
    """The bulk-copy build (sm_90) and the per-thread cp.async one (sm_80-89, HIP)."""
    return (_load(tmp_path_factory.mktemp("emu_rows_kq")),
            _load(tmp_path_factory.mktemp("emu_rows_kq_coop"), ("LUCE_GEMV_COOPERATIVE=1",)))


CASES = [(Q.Q5_K, 5120, 37), (Q.Q5_K, 6144, 37), (Q.Q5_K, 1280, 37), (Q.Q4_K, 5120, 37), (Q.Q4_K, 6144, 37),
         (Q.Q4_K, 512, 37), (Q.Q6_K, 6144, 37), (Q.Q6_K, 5120, 38), (Q.Q6_K, 2048, 37), (Q.IQ4_XS, 1280, 38)]


@pytest.mark.parametrize("qtype,k,n", CASES, ids=lambda v: getattr(v, "name", str(v)))
def test_few_rows_kernel_gives_the_tile_kernels_bits(libs, qtype, k, n):
    """2..8 rows: tune 0 and 9 (the few-row kernel) == tune 4 and 10 (the tile kernel) on the same rows,
    bitwise, with and without bias, both builds; each row == the row alone; close to the reference."""
    lib = libs[0]
    raw, wd = weights(qtype, n, k)
    x = activations(8, k, seed=k + 3)
    bias = np.random.default_rng(k).standard_normal(n).astype(np.float32)
    alone = {b is None: [run(lib, x[r:r + 1], raw, qtype, n, b)[0] for r in range(8)] for b in (None, bias)}
    for rows in range(2, 9):
        for b in (None, bias) if rows in (2, 5, 8) else ((bias if rows % 2 else None),):
            tile = run(lib, x[:rows], raw, qtype, n, b, tune=4)
            for build in libs:
                for tune in (0, 9, 10):  # 10: the tile kernel
                    got = run(build, x[:rows], raw, qtype, n, b, tune=tune)
                    assert (build.emu_last_launch_smem() == rows_smem(k, qtype)) == (tune != 10), \
                        f"{rows} rows, tune {tune}: the few-row kernel ran: {tune == 10}"
                    assert same_bits(got, tile), f"{rows} rows, tune {tune}: differs from the tile kernel"
            for r in range(rows):
                assert same_bits(tile[r], alone[b is None][r]), f"{rows} rows: row {r} differs from the row alone"
    want = x.astype(np.float64) @ wd.T.astype(np.float64) + bias
    assert_rows_close(run(lib, x, raw, qtype, n, bias, tune=9), want, "matmul_blocks")


@pytest.mark.parametrize("qtype,n", [(Q.Q5_K, 4227), (Q.Q4_K, 4227), (Q.Q6_K, 4228)],
                         ids=lambda v: getattr(v, "name", str(v)))
def test_few_rows_ring(libs, qtype, n):
    """Several batches a block, k = 512: n = 4227 (265 batches of 16 over the emulator's 132 blocks, 3
    stages, a last batch at row 4211; Q6_K: 4228, its 420-byte rows back to back), 5 and 8 rows, both
    builds: == the tile kernel."""
    k = 512
    raw, _ = weights(qtype, n, k)
    x = activations(8, k, seed=11)
    for rows in (5, 8):
        want = run(libs[0], x[:rows], raw, qtype, n, tune=4)
        for build in libs:
            got = run(build, x[:rows], raw, qtype, n)
            assert build.emu_last_launch_smem() == rows_smem(k, qtype), "not the few-row kernel"
            assert same_bits(got, want), f"{rows} rows: differs from the tile kernel"


def test_few_rows_falls_back(libs):
    """Where the few-row kernel does not run the tile kernel does (the same bits): Q6_K at k = 5120
    and IQ4_XS at k = 1280, n = 37 (the last batch, at row 21, would start 8 bytes off a 16-byte
    boundary), Q5_K at k = 6400 (25 chunks: x would not fit in registers), Q4_K at n = 9 (< 16 rows)
    and at 9 rows."""
    lib = libs[0]
    for qtype, k, n, rows in ((Q.Q6_K, 5120, 37, 3), (Q.IQ4_XS, 1280, 37, 5), (Q.Q5_K, 6400, 37, 4),
                              (Q.Q4_K, 512, 9, 4), (Q.Q4_K, 512, 37, 9)):
        raw, _ = weights(qtype, n, k)
        x = activations(rows, k, seed=3)
        got = run(lib, x, raw, qtype, n, tune=9)
        assert lib.emu_last_launch_smem() != rows_smem(k, qtype), f"{qtype.name} k {k}, n {n}, {rows} rows: ran"
        assert same_bits(got, run(lib, x, raw, qtype, n, tune=4)), f"{qtype.name} k {k}: differs"


def test_few_rows_nan_and_99kb_devices(tmp_path, monkeypatch):
    """A device of 99 KiB opt-in shared memory (RTX 30/40/50): at k = 5120 two stages do not fit and
    the tile kernel runs, at k = 512 the few-row kernel does (3 stages), the same bits either way; a
    NaN in one row's x stays in that row (Q5_K: through the min term too)."""
    monkeypatch.setenv("LUCE_EMU_SMEM_OPTIN", "101376")
    small = _load(tmp_path)
    n = 37
    for qtype, k, ran in ((Q.Q5_K, 5120, False), (Q.Q5_K, 512, True), (Q.Q4_K, 512, True)):
        raw, _ = weights(qtype, n, k)
        x = activations(5, k, seed=k)
        got = run(small, x, raw, qtype, n)
        assert (small.emu_last_launch_smem() == rows_smem(k, qtype, 101376)) == ran, \
            f"{qtype.name} k {k}: the few-row kernel ran: {not ran}"
        assert same_bits(got, run(small, x, raw, qtype, n, tune=4))
        x[2, 7] = np.nan
        dirty = run(small, x, raw, qtype, n)
        assert np.isnan(dirty[2]).all()
        assert same_bits(np.delete(dirty, 2, axis=0), np.delete(got, 2, axis=0))
