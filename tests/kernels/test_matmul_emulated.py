"""The decode matmul's own source on the CPU (cuda/matmul.cu through luce_matmul, built by
tests/kernels/emu): a one-row call of the dp4a kernel (cuda/matmul_gemv.cuh; tune 5, tune 6,
or tune 0 where luce_matmul picks it) gives bitwise the tensor-core tile kernel's row (tune 4)
and its row of a 3-row call, for the per-group f16-scale types Q5_0 and Q8_0, IQ4_XS (its own
lane layout, cuda/matmul_gemv_iq4.cuh) and Q4_K as the control: k = 896 (three and a half 256-value chunks, Qwen2.5-0.5B's hidden size), 256, 352
and 288 (a last chunk of 3 groups and of one); n odd; weights 2 bytes off a 4-byte boundary;
blocks that take several batches; the Qwen2.5-0.5B shapes. IQ4_XS's staged form
(cuda/matmul_gemv_staged.cuh: tune 0, 5, 6, 8; tune 7 its register form) with its bulk copies
and mbarrier phases emulated (a wait on an incomplete phase or a misaligned copy aborts) and,
in a second build, its per-thread copies: at the 27B's k, with an odd chunk count (even n; odd
n takes the register form), 2 and 3 stages; the staged form of Q4_K, Q5_K (StagedK45) and Q6_K
(StagedKQuant; tune 8, and tune 0 where the register form does not run; Q6_K's 210-byte chunks:
even chunk counts) likewise. The emulator's f32 arithmetic is
the host's, so only bitwise comparisons between two kernels of one build (and the parity
against the reference) mean anything here; tests/kernels/test_matmul.py runs the same checks
natively on a GPU.
"""
from __future__ import annotations

import ctypes as C

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from tests.kernels.emu import build as emu
from tests.kernels.emu.matmul_params import MatmulParams as Params
from tests.kernels.test_matmul import activations, assert_rows_close, weights

pytestmark = pytest.mark.slow
_P = C.c_void_p


def load_matmul(out_dir):
    """cuda/matmul.cu built for the host (tests/kernels/emu), its entry points typed."""
    lib = emu.load(["matmul.cu"], out_dir, "the quantized matmul")
    lib.luce_matmul_workspace_bytes.restype = C.c_int64
    lib.luce_matmul_workspace_bytes.argtypes = [C.c_int64, C.c_int64]
    lib.luce_matmul.argtypes = [C.POINTER(Params), _P]
    lib.luce_matmul_pair.argtypes = [C.POINTER(Params), C.POINTER(Params), _P]
    lib.emu_last_launch_smem.restype = C.c_size_t
    lib.emu_launches.restype = C.c_size_t
    return lib


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    return load_matmul(tmp_path_factory.mktemp("emu_matmul"))


def run(lib, x, raw, qtype, n, bias=None, tune=0, offset=0):
    """y [rows, n] of one decode-path call, y starting NaN; `offset` bytes shift the weights
    (2: rows 2-byte but not 4-byte aligned where the row size allows)."""
    x = np.ascontiguousarray(x, np.float32)
    rows, k = x.shape
    buf = np.zeros(raw.nbytes + 16, np.uint8)  # 16-byte aligned (numpy allocations are)
    buf[offset:offset + raw.nbytes] = raw.reshape(-1)
    nbytes = lib.luce_matmul_workspace_bytes(rows, k)
    ws = np.zeros(nbytes // 4 + 4, np.float32)
    y = np.full((rows, n), np.nan, np.float32)
    b = None if bias is None else np.ascontiguousarray(bias, np.float32)
    p = Params(x.ctypes.data, buf.ctypes.data + offset, None if b is None else b.ctypes.data, y.ctypes.data,
               ws.ctypes.data, nbytes, rows, n, k, int(qtype), 0, 0, tune)
    assert lib.luce_matmul(C.byref(p), None) == 0
    return y


# (type, f32 floats a chunk and row of the one-row kernel's c, rows a batch at tune 5 / 0)
GEMV = {Q.Q5_0: (16, 4, 4), Q.Q8_0: (16, 4, 4), Q.Q4_K: (1, 2, 4), Q.Q5_K: (1, 2, 4), Q.Q6_K: (1, 2, 2),
        Q.IQ4_XS: (1, 4, 4)}
RING = {Q.Q5_0: 4, Q.Q8_0: 4, Q.Q4_K: 16, Q.Q5_K: 16, Q.Q6_K: 16, Q.IQ4_XS: 16}   # batches of c a block keeps (GroupFloatC / ChunkIntC::kRing)


def gemv_smem(qtype, k: int, rows: int) -> int:
    """Dynamic shared memory of the one-row kernel's register form (matmul_gemv.cuh gemv_smem_bytes)."""
    per_chunk = GEMV[qtype][0]
    chunks, groups = -(-k // 256), k // 32
    return 4 * ((RING[qtype] * rows * per_chunk + 1) * chunks + (groups if qtype == Q.Q5_0 else 0))


STAGED_CHUNK_BYTES = {Q.IQ4_XS: 136, Q.Q4_K: 144, Q.Q5_K: 176, Q.Q6_K: 210}


def staged_rows(qtype, k: int, n: int, tune: int, offset: int = 0) -> int:
    """Rows a batch of the staged form (matmul_gemv_staged.cuh) a call takes, 0 if it takes the
    register form: IQ4_XS by cuda/matmul_gemv_launch.cuh launch_gemv_iq4 (tune 0, 5, 8: 4 rows,
    6: 8, 7: the register form), Q4_K, Q5_K and Q6_K at tune 8 and at tune 0 where the register form
    does not run (Q4_K / Q5_K past 64 chunks; Q6_K from 16 MiB) (4 rows), where the weights are
    16-byte aligned, n >= the rows, a batch's rows and row n - rows start 16-byte
    aligned (Q6_K: an even chunk count; IQ4_XS: an even chunk count or n even) and k <= 32,768."""
    if qtype not in STAGED_CHUNK_BYTES or offset % 16 or k > 32768:
        return 0
    row_bytes = (k // 256) * STAGED_CHUNK_BYTES[qtype]
    if qtype == Q.IQ4_XS and tune == 7:
        return 0
    if qtype != Q.IQ4_XS:   # tune 8; tune 0 where the register form does not run
        register_runs = k // 256 <= 64 if qtype in (Q.Q4_K, Q.Q5_K) else n * row_bytes < (16 << 20)
        if not (tune == 8 or (tune == 0 and not register_runs)):
            return 0
    rows = 8 if tune == 6 else 4
    return rows if n >= rows and (rows * row_bytes) % 16 == 0 and ((n - rows) * row_bytes) % 16 == 0 else 0


def staged_smem(k: int, n: int, rows: int, qtype=Q.IQ4_XS) -> int:
    """Dynamic shared memory of the staged form: its stages of `rows` rows, c [2][rows][chunks], xd.
    Stages (launch_gemv_staged): 3 where the one-wave grid (the emulator's 132 blocks) gives a
    block two batches, else 2."""
    chunks, batches = -(-k // 256), -(-n // rows)
    stages = 3 if -(-batches // 132) == 2 else 2
    return stages * rows * chunks * STAGED_CHUNK_BYTES[qtype] + 4 * (2 * rows + 1) * chunks


def assert_one_row_kernel_ran(lib, qtype, k, tune, n=None, offset=0):
    """The last launch was the one-row kernel (the staged form where it runs, at n rows)."""
    staged = staged_rows(qtype, k, n, tune, offset) if n is not None else 0
    if staged:
        assert lib.emu_last_launch_smem() == staged_smem(k, n, staged, qtype), f"tune {tune}: not the staged one-row kernel"
        return
    assert n is not None or qtype != Q.IQ4_XS, "IQ4_XS: say n (the staged form depends on it)"
    _, r5, r0 = GEMV[qtype]
    rows = {0: r0, 5: r5, 6: 2 * r5, 7: r5, 8: r5}[tune]
    if -(-k // 256) > 64:  # two chunk slots a lane (matmul_gemv.cuh with_gemv_shape): half the rows
        rows = {0: r0 // 2, 5: r5 // 2, 6: r5, 7: r5 // 2, 8: r5 // 2}[tune]
    assert lib.emu_last_launch_smem() == gemv_smem(qtype, k, rows), f"tune {tune}: not the one-row kernel"


def same_bits(a, b) -> bool:
    return np.array_equal(a.view(np.uint32), b.view(np.uint32))


CASES = [(Q.Q5_0, 896, 37), (Q.Q8_0, 896, 37), (Q.Q5_0, 256, 13), (Q.Q8_0, 352, 21), (Q.Q4_K, 512, 19),
         (Q.Q5_K, 1280, 11),
         (Q.Q6_K, 512, 19), (Q.Q6_K, 1536, 7), (Q.IQ4_XS, 512, 19), (Q.IQ4_XS, 1280, 11), (Q.IQ4_XS, 1280, 12)]


@pytest.mark.parametrize("qtype,k,n", CASES, ids=lambda v: getattr(v, "name", str(v)))
def test_one_row_kernel_gives_the_tile_kernels_row(lib, qtype, k, n):
    """Rows 0 and 1 of a 3-row call (N(0, 1), and scaled by 1000), with and without bias: the
    row alone through the one-row kernel (tune 5, tune 6: twice the rows a batch, tune 0) ==
    alone through the tile kernel (tune 4) == its row of the 3-row call, bitwise; the 3 rows
    close to the reference."""
    raw, wd = weights(qtype, n, k)
    x = activations(3, k, seed=k + n)
    bias = np.random.default_rng(n).standard_normal(n).astype(np.float32)
    for b in (None, bias):
        three = run(lib, x, raw, qtype, n, b)
        assert_rows_close(three, x.astype(np.float64) @ wd.T.astype(np.float64) + (0 if b is None else b),
                          "matmul_blocks")
        for r in range(2):
            tile = run(lib, x[r:r + 1], raw, qtype, n, b, tune=4)
            assert same_bits(tile[0], three[r]), f"row {r}: the tile kernel alone differs from 3 rows"
            for tune in (0, 5, 6, 7, 8):
                got = run(lib, x[r:r + 1], raw, qtype, n, b, tune=tune)
                assert_one_row_kernel_ran(lib, qtype, k, tune, n)
                assert same_bits(got, tile), f"row {r}: tune {tune} differs from the tile kernel"


@pytest.mark.parametrize("qtype,k,n", [(Q.Q8_0, 352, 21), (Q.Q5_0, 896, 9)], ids=lambda v: getattr(v, "name", str(v)))
def test_weights_at_2_mod_4(lib, qtype, k, n):
    """Weights 2 bytes past a 4-byte boundary (Q8_0 at k = 352: 374-byte rows, so rows
    alternate too): the one-row kernel's realigned loads give the same bits."""
    raw, _ = weights(qtype, n, k)
    x = activations(1, k, seed=3)
    want = run(lib, x, raw, qtype, n, tune=4)
    for tune in (5, 6):
        got = run(lib, x, raw, qtype, n, tune=tune, offset=2)
        assert_one_row_kernel_ran(lib, qtype, k, tune)
        assert same_bits(got, want), f"tune {tune}: weights at 2 mod 4 changed bits"


@pytest.mark.parametrize("qtype,k", [(Q.Q5_0, 256), (Q.Q8_0, 288), (Q.IQ4_XS, 256)],
                         ids=lambda v: getattr(v, "name", str(v)))
def test_blocks_that_take_several_batches(lib, qtype, k):
    """n = 4227: the emulator's one-wave grid (132 blocks) gives each block 5 to 9 batches, so
    the ring of c wraps (IQ4_XS: a ring of 16 batches, 8 to 9 batches a block at tune 5, and a
    last batch of 3 rows); k = 288: a last chunk of one group. Tune 5 and 6 == the tile kernel."""
    n = 4227
    raw, _ = weights(qtype, n, k)
    x = activations(1, k, seed=5)
    want = run(lib, x, raw, qtype, n, tune=4)
    for tune in (5, 6, 7):
        got = run(lib, x, raw, qtype, n, tune=tune)
        assert_one_row_kernel_ran(lib, qtype, k, tune, n)
        assert same_bits(got, want), f"tune {tune} differs from the tile kernel"


# Qwen2.5-0.5B-Instruct Q4_K_M decode (hidden 896): q / out 896 x 896 (Q5_0), k 128 x 896
# (Q5_0), v 128 x 896 (Q8_0), gate and up merged 9728 x 896 (Q5_0).
QWEN05B = [(Q.Q5_0, 896), (Q.Q5_0, 128), (Q.Q8_0, 128), (Q.Q5_0, 9728)]


@pytest.mark.parametrize("qtype,n", QWEN05B, ids=lambda v: getattr(v, "name", str(v)))
def test_qwen05b_shapes(lib, qtype, n):
    """One row at k = 896: tune 0 (the one-row kernel by default) == tune 4 (the tile kernel)."""
    raw, _ = weights(qtype, n, 896)
    x = activations(1, 896, seed=n)
    got = run(lib, x, raw, qtype, n)
    assert_one_row_kernel_ran(lib, qtype, 896, 0)
    assert same_bits(got, run(lib, x, raw, qtype, n, tune=4))


def test_iq4_xs_two_chunk_slots(lib):
    """IQ4_XS at k = 16,640 (65 chunks: two chunk slots a lane, the 27B down projection's form at
    k = 17,408; lanes of the second slot past k load the last chunk and drop their sums), n = 7 (a
    last batch of fewer rows): tune 0, 5 and 6 == the tile kernel, bitwise."""
    k, n = 16640, 7
    raw, _ = weights(Q.IQ4_XS, n, k)
    x = activations(1, k, seed=11)
    want = run(lib, x, raw, Q.IQ4_XS, n, tune=4)
    for tune in (0, 5, 6, 7):
        got = run(lib, x, raw, Q.IQ4_XS, n, tune=tune)
        assert_one_row_kernel_ran(lib, Q.IQ4_XS, k, tune, n)
        assert same_bits(got, want), f"tune {tune} differs from the tile kernel"


@pytest.mark.parametrize("qtype,k", [(Q.Q8_0, 16640), (Q.Q8_0, 17504), (Q.Q5_0, 17504), (Q.Q8_0, 5216),
                                     (Q.Q5_0, 6144)], ids=lambda v: getattr(v, "name", str(v)))
def test_group_scale_long_chains(lib, qtype, k):
    """Q8_0 / Q5_0 past 64 chunks (two chunk slots a lane, 2 rows a batch; k = 17,504: 68 whole
    chunks and one of 3 groups, the 27B's down projections at k = 17,408 plus a partial chunk;
    16,640: 65 whole) and with one slot at the 27B's other k (5,216: 20 whole chunks and one of 3
    groups; 6,144: 24 whole): the one-row kernel's ordered chains of 5 to 17 chunks' (sum, scale)
    pairs, four chunks' combines side by side where GroupFloatC::chain takes that form (tune 0 and
    5; tune 6's ring does not fit 48 KiB past 64 chunks) give bitwise the tile kernel's row."""
    n = 9
    raw, _ = weights(qtype, n, k)
    x = activations(1, k, seed=k)
    want = run(lib, x, raw, qtype, n, tune=4)
    for tune in (0, 5):
        got = run(lib, x, raw, qtype, n, tune=tune)
        assert_one_row_kernel_ran(lib, qtype, k, tune, n)
        assert same_bits(got, want), f"tune {tune} differs from the tile kernel"


@pytest.fixture(scope="module")
def lib_cooperative(tmp_path_factory):
    """The same source with the staged one-row form's copies by every thread (cp.async words,
    the path of HIP and sm_80-89) instead of one bulk copy on an mbarrier (sm_90, the default)."""
    lib = emu.load(["matmul.cu"], tmp_path_factory.mktemp("emu_matmul_coop"), "the quantized matmul",
                   defines=("LUCE_GEMV_COOPERATIVE=1",))
    lib.luce_matmul_workspace_bytes.restype = C.c_int64
    lib.luce_matmul_workspace_bytes.argtypes = [C.c_int64, C.c_int64]
    lib.luce_matmul.argtypes = [C.POINTER(Params), _P]
    lib.emu_last_launch_smem.restype = C.c_size_t
    return lib


# IQ4_XS at the 27B's k: 5120 (gate/up, qkv; 20 chunks, 5 warps a block of the staged form) and
# 17408 (down; 68 chunks, 17 warps); n = 9: batches of 4 rows 0-3, 4-7 and a last one at rows 5-8
# (rows 5-7 computed twice, stored once), of 8 rows 0-7 and 1-8.
# Q4_K, Q5_K (StagedK45) and Q6_K (StagedKQuant): tune 8 staged, 5 / 6 their register form, 0 the
# register form, or (Q4_K / Q5_K at k = 17,408, the tile kernel before) the staged form.
STAGED_TUNES = {Q.IQ4_XS: (0, 5, 6, 7, 8), Q.Q4_K: (0, 5, 6, 8), Q.Q5_K: (0, 5, 6, 8), Q.Q6_K: (0, 5, 6, 8)}


@pytest.mark.parametrize("qtype", [Q.IQ4_XS, Q.Q4_K, Q.Q5_K, Q.Q6_K], ids=lambda v: v.name)
@pytest.mark.parametrize("k", [5120, 17408])
def test_staged_at_27b_k(lib, lib_cooperative, qtype, k):
    """The staged form (IQ4_XS: tune 0, 5, 6, 8; the K types: tune 8, and Q4_K's / Q5_K's tune 0 at
    k = 17,408) and the register form (IQ4_XS tune 7; the K types 5, 6) == the tile kernel (tune 4),
    bitwise, with bias; with bulk
    copies and with per-thread copies (lib_cooperative); with the weights 8 bytes past a 16-byte
    boundary (IQ4_XS) the register form runs, the same bits. Q6_K: n = 10 (its 4,200-byte rows: row
    n - 4 is 16-byte aligned for n even only)."""
    n = 10 if qtype == Q.Q6_K else 9
    staged_at_0 = qtype == Q.IQ4_XS or (qtype in (Q.Q4_K, Q.Q5_K) and k > 16384)   # where the register form does not run
    assert staged_rows(qtype, k, n, 8) == 4 and bool(staged_rows(qtype, k, n, 0)) == staged_at_0
    raw, wd = weights(qtype, n, k)
    x = activations(1, k, seed=k)
    bias = np.random.default_rng(k).standard_normal(n).astype(np.float32)
    want = run(lib, x, raw, qtype, n, bias, tune=4)
    assert_rows_close(want, x.astype(np.float64) @ wd.T.astype(np.float64) + bias, "matmul_blocks")
    for build in (lib, lib_cooperative):
        for tune in STAGED_TUNES[qtype]:
            got = run(build, x, raw, qtype, n, bias, tune=tune)
            if qtype == Q.IQ4_XS or staged_rows(qtype, k, n, tune):
                assert_one_row_kernel_ran(build, qtype, k, tune, n)
            assert same_bits(got, want), f"tune {tune} differs from the tile kernel"
    if qtype == Q.IQ4_XS:
        got = run(lib, x, raw, Q.IQ4_XS, n, bias, offset=8)
        assert_one_row_kernel_ran(lib, Q.IQ4_XS, k, 0, n, offset=8)
        assert same_bits(got, want), "weights at 8 mod 16 changed bits"


@pytest.mark.parametrize("qtype", [Q.IQ4_XS, Q.Q5_K, Q.Q6_K], ids=lambda v: v.name)
@pytest.mark.parametrize("n", [4227, 801])
def test_staged_ring(lib, lib_cooperative, qtype, n):
    """The staged form's ring over several batches a block, k = 256: n = 4227 (8 to 9 batches a
    block of the emulator's 132 at 4 rows, 2 stages; a last batch of 3 rows) and n = 801 (two
    batches a block at 4 rows: 3 stages, both batches copied before the first is used; IQ4_XS at 8
    rows: 2 stages, a block of one batch), with bulk and with per-thread copies: == the tile kernel.
    Q6_K at k = 512 and n rounded up to n - 4 a multiple of 4 (4228, 804: its batches and row n - 4
    16-byte aligned, so the staged form runs)."""
    k = 256
    if qtype == Q.Q6_K:
        k, n = 512, n + (-(n - 4)) % 4
    assert qtype == Q.IQ4_XS or staged_rows(qtype, k, n, 8) == 4
    raw, _ = weights(qtype, n, k)
    x = activations(1, k, seed=5)
    want = run(lib, x, raw, qtype, n, tune=4)
    for build in (lib, lib_cooperative):
        for tune in (0, 6) if qtype == Q.IQ4_XS else (8,):
            got = run(build, x, raw, qtype, n, tune=tune)
            assert_one_row_kernel_ran(build, qtype, k, tune, n)
            assert same_bits(got, want), f"tune {tune} differs from the tile kernel"


ROW_CHUNK_BYTES = {Q.IQ4_XS: 136, Q.Q5_K: 176, Q.Q4_K: 144, Q.Q6_K: 210, Q.Q8_0: 272, Q.Q5_0: 176}


def rows_smem(k: int, qtype=Q.IQ4_XS, limit: int = 232448) -> int:
    """Dynamic shared memory of the few-row kernel (matmul_gemv_rows.cuh): 3 stages of 16 rows where
    they fit `limit` (the emulator's 227 KiB; else 2), rows `stride` apart (+16 B where row_bytes / 16
    is even; rows not of a multiple of 16 bytes back to back), c [2][chunks][16][8], the x scales [8][chunks] and for Q4_K / Q5_K (mins) the byte planes
    of x's group sums [chunks][8][32 B], for Q5_0 x's group sums [8][groups] and the rows' offsets
    [2][chunks][16][8] (floats). Q8_0 / Q5_0: blocks of 32 values, a last chunk of k % 256."""
    chunks = -(-k // 256)
    row_bytes = ROW_CHUNK_BYTES[qtype] * k // 256
    stride = row_bytes + (16 if row_bytes % 16 == 0 and (row_bytes // 16) % 2 == 0 else 0)
    rest = 4 * (2 * 16 + 1) * 8 * chunks + (256 * chunks if qtype in (Q.Q4_K, Q.Q5_K) else 0)
    if qtype == Q.Q5_0:
        rest += 4 * (8 * (k // 32) + 2 * chunks * 16 * 8)
    stages = 3 if 3 * 16 * stride + rest <= limit else 2
    return stages * 16 * stride + rest


# The few-row kernel at k = 512 (2 chunks, row_bytes / 16 odd: no padding), 5120 (the 27B's gate/up
# and qkv: 20 warps, padded rows) and 6144 (out: 24 warps); n = 37: batches of rows 0-15, 16-31 and
# a last one at rows 21-36 (rows 21-31 computed twice, stored once).
@pytest.mark.parametrize("k", [512, 5120, 6144])
def test_iq4_xs_few_rows_kernel(lib, lib_cooperative, k):
    """2..8 rows (tune 0 and 9: the few-row kernel, matmul_gemv_rows.cuh) == the tile kernel (tune 4, 10)
    on the same rows, bitwise, with and without bias, with bulk and per-thread copies; each row ==
    the row alone (the one-row staged kernel, tune 0); close to the reference."""
    n = 37
    raw, wd = weights(Q.IQ4_XS, n, k)
    x = activations(8, k, seed=k + 1)
    bias = np.random.default_rng(k).standard_normal(n).astype(np.float32)
    alone = {b is None: [run(lib, x[r:r + 1], raw, Q.IQ4_XS, n, b)[0] for r in range(8)] for b in (None, bias)}
    for rows in range(2, 9):
        for b in (None, bias):
            tile = run(lib, x[:rows], raw, Q.IQ4_XS, n, b, tune=4)
            for build in (lib, lib_cooperative):
                for tune in (0, 9, 10):  # 10: the tile kernel
                    got = run(build, x[:rows], raw, Q.IQ4_XS, n, b, tune=tune)
                    assert (build.emu_last_launch_smem() == rows_smem(k)) == (tune != 10), \
                        f"{rows} rows, tune {tune}: the few-row kernel ran: {tune == 10}"
                    assert same_bits(got, tile), f"{rows} rows, tune {tune}: differs from the tile kernel"
            for r in range(rows):
                assert same_bits(tile[r], alone[b is None][r]), f"{rows} rows: row {r} differs from the row alone"
    want = x.astype(np.float64) @ wd.T.astype(np.float64) + bias
    assert_rows_close(run(lib, x, raw, Q.IQ4_XS, n, bias, tune=9), want, "matmul_blocks")


@pytest.mark.parametrize("n", [4227, 2112])
def test_iq4_xs_few_rows_ring(lib, lib_cooperative, n):
    """The few-row kernel's stages over several batches a block, k = 512: n = 4227 (265 batches of 16
    over the emulator's 132 blocks: 2 to 3 a block, 3 stages, a last batch at row 4211) and 2112 (132
    batches: one a block), 5 rows, with bulk and per-thread copies: == the tile kernel."""
    k = 512
    raw, _ = weights(Q.IQ4_XS, n, k)
    x = activations(5, k, seed=7)
    want = run(lib, x, raw, Q.IQ4_XS, n, tune=4)
    for build in (lib, lib_cooperative):
        got = run(build, x, raw, Q.IQ4_XS, n)
        assert build.emu_last_launch_smem() == rows_smem(k), "not the few-row kernel"
        assert same_bits(got, want), "differs from the tile kernel"


def test_iq4_xs_few_rows_falls_back(lib):
    """Where the few-row kernel does not run the tile kernel does (the same bits): k = 1280 at n = 37
    (680-byte rows: the last batch 8 bytes off a 16-byte boundary; at n = 38 it runs,
    test_matmul_few_rows_emulated.py), n = 9 (< 16 rows), 9 rows (also at k = 17408, where 2..8 rows
    take the large-k form: test_matmul_few_rows_emulated.py)."""
    for k, n, rows in ((17408, 16, 9), (1280, 37, 4), (512, 9, 4), (512, 37, 9)):
        raw, _ = weights(Q.IQ4_XS, n, k)
        x = activations(rows, k, seed=3)
        got = run(lib, x, raw, Q.IQ4_XS, n)
        assert lib.emu_last_launch_smem() != rows_smem(k), f"k {k}, n {n}, {rows} rows: the few-row kernel ran"
        assert same_bits(got, run(lib, x, raw, Q.IQ4_XS, n, tune=4))


def test_iq4_xs_few_rows_nan_and_99kb_devices(tmp_path, monkeypatch):
    """A device of 99 KiB opt-in shared memory (RTX 30/40/50: LUCE_EMU_SMEM_OPTIN): at k = 5120 two
    stages (108 KB) do not fit and the tile kernel runs, at k = 512 the few-row kernel does (3
    stages), the same bits either way; a NaN in one row's x stays in that row."""
    monkeypatch.setenv("LUCE_EMU_SMEM_OPTIN", "101376")
    small = load_matmul(tmp_path)
    for k, ran in ((5120, False), (512, True)):
        n = 37
        raw, _ = weights(Q.IQ4_XS, n, k)
        x = activations(5, k, seed=k)
        got = run(small, x, raw, Q.IQ4_XS, n)
        assert (small.emu_last_launch_smem() == rows_smem(k)) == ran, f"k {k}: the few-row kernel ran: {not ran}"
        assert same_bits(got, run(small, x, raw, Q.IQ4_XS, n, tune=4))
        clean = got
        x[2, 7] = np.nan
        dirty = run(small, x, raw, Q.IQ4_XS, n)
        assert np.isnan(dirty[2]).all()
        assert same_bits(np.delete(dirty, 2, axis=0), np.delete(clean, 2, axis=0))
