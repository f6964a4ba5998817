"""The wide-token tile kernel (cuda/matmul_rows.cuh; LUCE_MATMUL_TUNE 12: 4 warps of one m-tile a
block; 13 / 14: its cluster form, the 4 k parts shared by 2 / 4 blocks that sum them through each
other's shared memory; 15: the cluster size counted from the launch's blocks, the device's resident
blocks (the emulator: one a multiprocessor, 132) and k's chunks) on the CPU through the decode matmul's own source (tests/kernels/emu): bitwise
the tile kernel of today (tune 3: one row tile a block; tune 2: two) at 16, 17, 23, 33, 64 and 80 rows
(partial token tiles, one and two token blocks), and each row == the row alone (tune 4: the tile
kernel at one row), for IQ4_XS, Q4_K, Q5_K, Q6_K, Q8_0 and Q5_0; n = 37 (a block's last warp
partly or wholly past n), k = 512 (k parts 2 and 3 without chunks: in the cluster form, blocks
without work), 1280 (k part 0 two chunks: a cluster of 2 blocks with 3 and 2 chunks) and 896 for
Q8_0 / Q5_0 (a last chunk of 4 groups); with bias; a 99 KB device (fewer stages) and a 64 KB one
(falls back where 2 stages do not fit). The emulator fills each block's shared memory with NaN
bytes first, so a part sum read before it is written shows. tests/kernels/test_matmul.py runs the
same check natively on a GPU.
"""
from __future__ import annotations

import ctypes as C

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from tests.kernels.emu import build as emu
from tests.kernels.test_matmul import activations, assert_rows_close, weights
from tests.kernels.test_matmul_emulated import run, same_bits

pytestmark = pytest.mark.slow
_P = C.c_void_p

ROWS = (16, 17, 23, 33, 64, 80)
CHUNK_BYTES = {Q.Q4_K: 144, Q.Q5_K: 176, Q.Q6_K: 210, Q.IQ4_XS: 136, Q.Q8_0: 272, Q.Q5_0: 176}


def _load(tmp_path, defines=()):
    """The decode matmul's source built for the emulator (with `defines`), its entry points typed."""
    from tests.kernels.emu.matmul_params import MatmulParams as Params

    lib = emu.load(["matmul.cu"], tmp_path, "the quantized matmul", defines=defines)
    lib.luce_matmul_workspace_bytes.restype = C.c_int64
    lib.luce_matmul_workspace_bytes.argtypes = [C.c_int64, C.c_int64]
    lib.luce_matmul.argtypes = [C.POINTER(Params), _P]
    lib.emu_last_launch_smem.restype = C.c_size_t
    lib.emu_last_launch_cluster.restype = C.c_uint
    return lib


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    return _load(tmp_path_factory.mktemp("emu_matmul_rows"))


TUNES = (12, 13, 14, 15)  # blocks a cluster: 1, 2, 4, counted
EMU_RESIDENT = 132  # tests/kernels/emu: one block of any kernel a multiprocessor, 132 of them


def auto_cluster(blocks: int, chunks: int, resident: int = EMU_RESIDENT) -> int:
    """The cluster size matmul_rows.cuh's rows_auto_cluster picks: the fewest waves x (chunks a
    block + 2), the smaller size on a tie."""
    cost = {z: -(-blocks * z // resident) * (-(-chunks // z) + 2) for z in (1, 2, 4)}
    return min(cost, key=lambda z: (cost[z], z))


def cluster_of(tune: int, rows: int = 0, n: int = 0, k: int = 0) -> int:
    if tune < 15:
        return 1 << (tune - 12)
    tiles = -(-rows // 8)
    token_blocks = -(-tiles // 5)
    return auto_cluster(-(-n // 64) * token_blocks, -(-k // 256))


def rows_smem(qtype, rows: int, tune: int, limit: int = 232448, most: int = 2, n: int = 37, k: int = 512) -> int:
    """Dynamic shared memory of the wide-token kernel (matmul_rows.cuh): `most` stages (2: the default
    of LUCE_MATMUL_ROWS_STAGES) down to 2 where they fit `limit` of the block's tokens' x (576 B a token)
    and its 64 weight row slots, then the warps' k-part sums (one running sum at tune 12; 4 / Z part
    sums in a cluster of Z); 0 where 2 stages do not fit."""
    tiles = -(-rows // 8)
    blocks = -(-tiles // 5)
    nt = max(2, -(-tiles // blocks))
    words = (CHUNK_BYTES[qtype] + 30) // 16
    slot = 16 * (words if words % 2 else words + 1)
    z = cluster_of(tune, rows, n, k)
    sums = 1 if z == 1 else 4 // z
    stage, tot = 8 * nt * 576 + 64 * slot, sums * 2 * nt * 1024  # 64 weight rows a block (4 warps x 1 m-tile)
    for s in range(most, 1, -1):
        if s * stage + tot <= limit:
            return s * stage + tot
    return 0


CASES = [(Q.IQ4_XS, 512), (Q.IQ4_XS, 1280), (Q.Q4_K, 512), (Q.Q5_K, 512), (Q.Q6_K, 512), (Q.Q8_0, 896),
         (Q.Q5_0, 896)]


@pytest.mark.parametrize("qtype,k", CASES, ids=lambda v: getattr(v, "name", str(v)))
def test_wide_token_kernel_gives_the_tile_kernels_bits(lib, qtype, k):
    n = 37
    raw, wd = weights(qtype, n, k)
    x = activations(80, k, seed=k + 7)
    bias = np.random.default_rng(k).standard_normal(n).astype(np.float32)
    alone = {r: run(lib, x[r:r + 1], raw, qtype, n, bias, tune=4)[0] for r in (0, 16, 22, 63, 79)}
    for rows in ROWS:
        b = bias if rows % 2 else None
        want = run(lib, x[:rows], raw, qtype, n, b, tune=3)
        assert same_bits(want, run(lib, x[:rows], raw, qtype, n, b, tune=2)), f"{rows} rows: tune 2 != tune 3"
        for tune in TUNES:
            got = run(lib, x[:rows], raw, qtype, n, b, tune=tune)
            assert lib.emu_last_launch_smem() == rows_smem(qtype, rows, tune, n=n, k=k), f"{rows} rows, tune {tune}: not the kernel"
            assert lib.emu_last_launch_cluster() == cluster_of(tune, rows, n, k), f"{rows} rows, tune {tune}: not the cluster"
            assert same_bits(got, want), f"{rows} rows, tune {tune}: differs from the tile kernel"
        if b is bias:
            for r, row in alone.items():
                if r < rows:
                    assert same_bits(want[r], row), f"{rows} rows: row {r} differs from the row alone"
    for tune in TUNES:
        assert_rows_close(run(lib, x, raw, qtype, n, bias, tune=tune),
                          x.astype(np.float64) @ wd.T.astype(np.float64) + bias, "matmul_blocks")


@pytest.mark.parametrize("limit", [101376, 65536])
def test_small_shared_memory_devices(tmp_path, monkeypatch, limit):
    """99 KB (RTX 30/40/50): fewer stages; 64 KB (RDNA3/4): at 80 rows 2 stages do not fit (the tile
    kernel runs): the same bits either way."""
    monkeypatch.setenv("LUCE_EMU_SMEM_OPTIN", str(limit))
    small = _load(tmp_path)
    n = 37
    for qtype, k in ((Q.Q8_0, 896), (Q.IQ4_XS, 512)):
        raw, _ = weights(qtype, n, k)
        x = activations(80, k, seed=3)
        want = run(small, x, raw, qtype, n, tune=3)
        for tune in TUNES:
            got = run(small, x, raw, qtype, n, tune=tune)
            smem = rows_smem(qtype, 80, tune, limit, n=n, k=k)
            assert (small.emu_last_launch_smem() == smem) == (smem > 0), f"{qtype.name} tune {tune}"
            assert same_bits(got, want), f"{qtype.name} tune {tune}: differs from the tile kernel"


def test_deeper_stages(tmp_path, monkeypatch):
    """LUCE_MATMUL_ROWS_STAGES=4 (4 stages where they fit: the ring wraps within a k part and across
    k parts at k = 1280): the same bits as the tile kernel."""
    monkeypatch.setenv("LUCE_MATMUL_ROWS_STAGES", "4")
    deep = _load(tmp_path)
    n = 37
    for qtype, k in ((Q.IQ4_XS, 1280), (Q.Q8_0, 896)):
        raw, _ = weights(qtype, n, k)
        x = activations(80, k, seed=9)
        for rows in (23, 80):
            want = run(deep, x[:rows], raw, qtype, n, tune=3)
            for tune in TUNES:
                got = run(deep, x[:rows], raw, qtype, n, tune=tune)
                assert deep.emu_last_launch_smem() == rows_smem(qtype, rows, tune, most=4, n=n, k=k), "not 4 stages"
                assert same_bits(got, want), f"{qtype.name} {rows} rows, tune {tune}: differs from the tile kernel"


def test_counted_cluster_size(lib):
    """Tune 15 counts the cluster size: one chunk of k (256) gains nothing from sharing it (1 block),
    2 chunks tie 2 and 4 blocks (the smaller), 5 chunks take 4; each the tile kernel's bits."""
    n = 37
    for k, z in ((256, 1), (512, 2), (1280, 4)):
        raw, _ = weights(Q.IQ4_XS, n, k)
        x = activations(23, k, seed=k)
        want = run(lib, x, raw, Q.IQ4_XS, n, tune=3)
        got = run(lib, x, raw, Q.IQ4_XS, n, tune=15)
        assert lib.emu_last_launch_cluster() == z == cluster_of(15, 23, n, k), f"k = {k}"
        assert same_bits(got, want), f"k = {k}: differs from the tile kernel"


def test_clusters_off_by_env(lib, tmp_path, monkeypatch):
    """LUCE_MATMUL_CLUSTERS=0: tune 0 at 9-16 rows takes the one-block form (tune 12 or the tile kernel)
    instead of the cluster form it takes by default (tune 15: 4 blocks at k = 1280), tune 15 still runs
    clusters; the same bits every way."""
    n, k = 37, 1280
    raw, _ = weights(Q.IQ4_XS, n, k)
    x = activations(16, k, seed=5)
    want = run(lib, x, raw, Q.IQ4_XS, n, tune=3)
    assert same_bits(run(lib, x, raw, Q.IQ4_XS, n), want)
    assert lib.emu_last_launch_cluster() == 4, "tune 0's default is no longer the cluster form"
    monkeypatch.setenv("LUCE_MATMUL_CLUSTERS", "0")
    off = _load(tmp_path)
    assert same_bits(run(off, x, raw, Q.IQ4_XS, n), want)
    assert off.emu_last_launch_cluster() == 1, "LUCE_MATMUL_CLUSTERS=0: tune 0 still ran clusters"
    assert same_bits(run(off, x, raw, Q.IQ4_XS, n, tune=15), want)
    assert off.emu_last_launch_cluster() == 4, "tune 15 no longer runs clusters"
