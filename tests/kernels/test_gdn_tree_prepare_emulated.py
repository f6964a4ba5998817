"""luce_gdn_tree_prepare (cuda/gdn_decode.cu's own source on the CPU, tests/kernels/emu): the q, k,
v, g and beta of each draft-tree row are bitwise those luce_gdn_decode gives the last row of that
row's root path run as AR rows from the same slot, the conv state is left as it was, the tree
verify's arrival counters are zeroed, padding segments get nothing, and the values stay close to
luce/ref/gdn_decode.py gdn_tree_inputs. A parent that is not an earlier row of its tree gives
NaN, as luce_conv_tree. tests/kernels/test_gdn_tree_chain.py checks the whole tree chain against
the composition on a GPU."""
from __future__ import annotations

import ctypes as C

import numpy as np
import pytest

from luce.ops.gdn_inputs import gdn_q_scale
from luce.ref.gdn_decode import gdn_tree_inputs
from tests.kernels.emu import build as emu
from tests.kernels.test_gdn_decode_emulated import CH, DK, DV, EPS, HK, HV, K, Params

pytestmark = pytest.mark.slow
_P = C.c_void_p
# (slot, local parents) per segment: a branching tree, a padding segment, a chain past K - 1 rows
TREES = [(2, [-1, 0, 1, 0, 3, 1]), (-1, [-1]), (0, [-1, 0, 1, 2])]
OUTPUTS = {"q": (HV, DK), "k": (HV, DK), "v": (HV, DV), "g": (HV,), "beta": (HV,)}


class ConvTreeParams(C.Structure):
    """luce_conv_tree_params."""
    _fields_ = [(n, _P) for n in "x weight y state qo_indptr seq_slots tree_parents".split()] + \
               [(n, C.c_int64) for n in "n_segments channels x_stride y_stride".split()] + \
               [(n, C.c_int32) for n in "kernel_size max_segment_rows silu".split()]


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    lib = emu.load(["gdn_decode.cu", "tree_conv.cu"], tmp_path_factory.mktemp("emu_gdn_tree_prepare"),
                   "the GDN decode and tree conv kernels")
    lib.luce_gdn_decode.argtypes = [C.POINTER(Params), _P]
    lib.luce_conv_tree.argtypes = [C.POINTER(ConvTreeParams), _P]
    lib.luce_gdn_tree_prepare.argtypes = [C.POINTER(Params), _P, C.c_int32, _P]
    return lib


def layout(trees):
    """(qo_indptr, slots, global parents) of segments laid out in turn."""
    qo, parents = [0], []
    for _, local in trees:
        parents += [p + qo[-1] if p >= 0 else -1 for p in local]
        qo.append(qo[-1] + len(local))
    return (np.asarray(qo, np.int32), np.asarray([s for s, _ in trees], np.int32), np.asarray(parents, np.int32))


def inputs(seed: int, T: int):
    rng = np.random.default_rng(seed)
    f32 = lambda a: np.ascontiguousarray(a, np.float32)  # noqa: E731
    x = dict(qkv=f32(rng.standard_normal((T, CH))), z=f32(rng.standard_normal((T, HV * DV))),
             b=f32(rng.standard_normal((T, HV))), a=f32(rng.standard_normal((T, HV))))
    w = dict(conv=f32(rng.standard_normal((CH, K)) * 0.5), dt_bias=f32(rng.standard_normal(HV)),
             ssm_a=f32(-np.exp(rng.standard_normal(HV) * 0.5)), norm=f32(1.0 + 0.1 * rng.standard_normal(DV)))
    pools = (f32(rng.standard_normal((3, K - 1, CH))), f32(rng.standard_normal((3, HV, DK, DV)) * 0.1))
    return x, w, pools


def launch(lib, entry: str, blocks, w, pools, qo, slots, parents=None, max_rows: int = 0, stage=None,
           stage_row0: int = 0):
    """One call of `entry` on copies of the pools -> (status, outputs {q k v g beta}, conv pool,
    arrivals [segments, Hv], 7 before the call, normed [T, Hv, Dv], NaN before the call);
    stage: the conv-input stage (luce_gdn_tree_prepare's conv_stage) at stage_row0."""
    T = int(qo[-1])
    conv_pool, gdn_pool = (p.copy() for p in pools)
    out = {n: np.full((T,) + shape, np.nan, np.float32) for n, shape in OUTPUTS.items()}
    spare = {n: np.full((T, HV, DV), np.nan, np.float32) for n in ("out", "normed")}
    arrivals = np.full((len(slots), HV), 7, np.int32)
    addr = lambda a: a.ctypes.data  # noqa: E731
    qkv, z, b, a = blocks
    p = Params(addr(qkv), addr(w["conv"]), addr(conv_pool), addr(b), addr(a), addr(w["dt_bias"]), addr(w["ssm_a"]),
               addr(z), addr(w["norm"]), addr(gdn_pool), *(addr(out[n]) for n in OUTPUTS),
               addr(spare["out"]), addr(spare["normed"]), addr(arrivals), addr(qo), addr(slots), len(gdn_pool),
               len(slots), HK, HV, DK, DV, K, gdn_q_scale(DK), EPS, EPS, *(blk.strides[0] // 4 for blk in blocks))
    if stage is not None:
        p.conv_stage, p.stage_row0 = addr(stage), stage_row0
    if entry == "tree":
        status = lib.luce_gdn_tree_prepare(C.byref(p), addr(parents), max_rows, None)
    else:
        status = lib.luce_gdn_decode(C.byref(p), None)
    return status, out, conv_pool, arrivals, spare["normed"]


def root_path(parents, row: int) -> list[int]:
    path = [row]
    while parents[path[-1]] >= 0:
        path.append(int(parents[path[-1]]))
    return path[::-1]


@pytest.mark.parametrize("merged", [False, True], ids=["dense", "zba_merged"])
def test_tree_rows_are_their_root_paths_as_ar_rows(lib, merged):
    qo, slots, parents = layout(TREES)
    x, w, pools = inputs(21, int(qo[-1]))
    blocks = [x[n] for n in ("qkv", "z", "b", "a")]
    if merged:   # z | b | a as column blocks of one part, read in place
        zba = np.ascontiguousarray(np.concatenate(blocks[1:], 1))
        blocks = [x["qkv"], zba[:, :HV * DV], zba[:, HV * DV:HV * DV + HV], zba[:, HV * DV + HV:]]
    status, got, conv_pool, arrivals, _ = launch(lib, "tree", blocks, w, pools, qo, slots, parents,
                                                 max(len(t) for _, t in TREES))
    assert status == 0
    assert np.array_equal(conv_pool, pools[0]), "the tree prepare wrote the conv state"
    assert not arrivals.any(), "the tree verify's arrival counters were not zeroed"
    for seg, (slot, _) in enumerate(TREES):
        rows = range(qo[seg], qo[seg + 1])
        if slot < 0:
            assert all(np.isnan(got[n][rows]).all() for n in OUTPUTS), "a padding segment's rows were written"
            continue
        for row in rows:
            path = root_path(parents, row)
            chain = {n: np.ascontiguousarray(x[n][path]) for n in ("qkv", "z", "b", "a")}
            path_qo = np.asarray([0, len(path)], np.int32)
            st, ar, *_ = launch(lib, "ar", [chain[n] for n in ("qkv", "z", "b", "a")], w, pools, path_qo,
                               np.asarray([slot], np.int32))
            assert st == 0
            for n in OUTPUTS:
                assert np.array_equal(got[n][row], ar[n][-1]), f"{n} of row {row} differs from its root path's"
        local = np.asarray([p - qo[seg] if p >= 0 else -1 for p in parents[rows]])
        want = gdn_tree_inputs(x["qkv"][rows], x["b"][rows], x["a"][rows], w["conv"], w["dt_bias"], w["ssm_a"],
                               pools[0][slot], local, HK, HV, DK, EPS)
        for n, ref in zip(OUTPUTS, want):
            np.testing.assert_allclose(got[n][rows], ref, rtol=1e-4, atol=1e-5, err_msg=n)


@pytest.mark.parametrize("merged", [False, True], ids=["dense", "qkvz_merged"])
def test_the_prepare_stages_the_conv_inputs_and_zeroes_padding_rows(lib, merged):
    """The commit's conv inputs (a tree row's qkv row, at its row less stage_row0) and the zeros
    of the padding rows of normed, which the LM head reads (the memcpy and memset launches the
    prepare replaces); the tree rows of normed are the verify's (untouched here)."""
    trees = [(-1, [-1, -1]), *TREES]      # a padding segment before the first tree: stage_row0 2
    qo, slots, parents = layout(trees)
    T, row0 = int(qo[-1]), int(qo[1])
    x, w, pools = inputs(25, T)
    qkv = x["qkv"]
    if merged:   # qkv | z as column blocks of one part: the stage copies the qkv columns alone
        qkv = np.ascontiguousarray(np.concatenate([x["qkv"], x["z"]], 1))[:, :CH]
    stage = np.full((T - row0 + 1, CH), np.nan, np.float32)   # one row more: nothing written past the rows
    status, got, _, _, normed = launch(lib, "tree", [qkv, x["z"], x["b"], x["a"]], w, pools, qo, slots, parents,
                                       max(len(t) for _, t in trees), stage=stage, stage_row0=row0)
    assert status == 0
    for seg, (slot, _) in enumerate(trees):
        rows = np.arange(qo[seg], qo[seg + 1])
        if slot < 0:
            assert not normed[rows].any() and not np.signbit(normed[rows]).any(), "padding rows not zeroed"
            assert np.isnan(stage[rows[rows >= row0] - row0]).all(), "a padding row was staged"
        else:
            assert np.array_equal(stage[rows - row0], x["qkv"][rows]), "a tree row's conv input differs"
            assert np.isnan(normed[rows]).all(), "the prepare wrote a tree row of normed"
    assert np.isnan(stage[-1]).all()


def test_a_parent_not_before_its_row_gives_nan(lib):
    trees = [(1, [-1, 0, 1])]
    qo, slots, parents = layout(trees)
    parents[1] = 2   # row 1's parent comes after it
    x, w, pools = inputs(22, 3)
    status, got, *_ = launch(lib, "tree", [x[n] for n in ("qkv", "z", "b", "a")], w, pools, qo, slots, parents, 3)
    assert status == 0
    assert np.isnan(got["q"][1]).all() and np.isnan(got["k"][1]).all() and np.isnan(got["v"][1]).all()
    assert not np.isnan(got["q"][0]).any() and not np.isnan(got["v"][0]).any()


def test_a_tree_past_65535_rows_or_a_narrow_stride_is_refused(lib):
    qo, slots, parents = layout(TREES)
    x, w, pools = inputs(23, int(qo[-1]))
    blocks = [x[n] for n in ("qkv", "z", "b", "a")]
    assert launch(lib, "tree", blocks, w, pools, qo, slots, parents, 65536)[0] != 0
    assert launch(lib, "tree", blocks, w, pools, qo, slots, parents, -1)[0] != 0
    qkv_narrow = np.ascontiguousarray(x["qkv"][:, :CH - 1])
    assert launch(lib, "tree", [qkv_narrow] + blocks[1:], w, pools, qo, slots, parents, 6)[0] != 0


@pytest.mark.parametrize("bad_parent", [False, True], ids=["tree", "parent_after_row"])
def test_v_is_luce_conv_tree_of_the_v_channels(lib, bad_parent):
    """The prepare's v and luce_conv_tree's SiLU output share conv1d.cuh's tree_window and
    conv1d_dot: the same bits, NaN alike for a malformed tree."""
    qo, slots, parents = layout(TREES)
    if bad_parent:
        parents[2] = 4   # row 2's parent comes after it
    T = int(qo[-1])
    x, w, pools = inputs(24, T)
    _, got, *_ = launch(lib, "tree", [x[n] for n in ("qkv", "z", "b", "a")], w, pools, qo, slots, parents,
                        max(len(t) for _, t in TREES))
    y = np.full((T, CH), np.nan, np.float32)
    addr = lambda a: a.ctypes.data  # noqa: E731
    p = ConvTreeParams(addr(x["qkv"]), addr(w["conv"]), addr(y), addr(pools[0]), addr(qo), addr(slots),
                       addr(parents), len(slots), CH, CH, CH, K, max(len(t) for _, t in TREES), 1)
    assert lib.luce_conv_tree(C.byref(p), None) == 0
    live = [r for s_, (slot, _) in enumerate(TREES) if slot >= 0 for r in range(qo[s_], qo[s_ + 1])]
    want = y[live, 2 * HK * DK:].reshape(len(live), HV, DV)
    assert np.array_equal(got["v"][live], want, equal_nan=True)
    assert np.isnan(got["v"][2]).all() == bad_parent
