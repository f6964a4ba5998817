"""luce_gdn_tree_verify (cuda/gdn_tree.cu's own source on the CPU, tests/kernels/emu): each node's
output is bitwise luce_gdn_recurrent's (cuda/gdn_recurrent.cu) for the last token of the node's
root path from the same slot state, whichever order the walk takes, and luce_gdn_tree_commit's
replay of a path's factors leaves that kernel's state; with the gated RMSNorm
epilogue, normed is bitwise luce_gated_rmsnorm (cuda/gated_rmsnorm.cu) of out with z read at its
row stride, out and u are the bits of the verify without it, padding segments' rows are left
alone and a malformed tree's rows are NaN. tests/kernels/test_gdn_tree.py and
test_gdn_tree_chain.py check the kernels on a GPU."""
from __future__ import annotations

import ctypes as C

import numpy as np
import pytest

from tests.kernels.emu import build as emu
from tests.kernels.test_gated_rmsnorm_emulated import Params as NormParams

pytestmark = pytest.mark.slow
_P = C.c_void_p
HV, DK, DV, SLOTS, EPS = 3, 64, 64, 3, 1e-6
TREES = [(2, [-1, 0, 1, 0, 3]), (-1, [-1]), (0, [-1, 0, 0])]   # (slot, local parents); slot -1: padding


class VerifyParams(C.Structure):
    """luce_gdn_tree_verify_params (cuda/luce_ops_sequence.h), field for field."""
    _fields_ = [(n, _P) for n in "q k v g beta state out u_out k_out g_out beta_out workspace qo_indptr seq_slots "
                                 "tree_parents".split()] + \
               [(n, C.c_int64) for n in ("n_slots", "workspace_bytes")] + \
               [(n, C.c_int32) for n in "n_segments n_heads dk dv max_tree_rows".split()] + \
               [(n, _P) for n in "z norm_weight normed arrivals".split()] + [("z_stride", C.c_int64), ("rms_eps", C.c_float)]


class CommitParams(C.Structure):
    """luce_gdn_tree_commit_params."""
    _fields_ = [(n, _P) for n in "k g u state path_indptr path_rows seq_slots".split()] + [("n_slots", C.c_int64)] + \
               [(n, C.c_int32) for n in "n_segments n_heads dk dv".split()]


class RecurrentParams(C.Structure):
    """luce_gdn_recurrent_params."""
    _fields_ = [(n, _P) for n in "q k v g beta state out qo_indptr seq_slots".split()] + [("n_slots", C.c_int64)] + \
               [(n, C.c_int32) for n in "n_segments n_heads dk dv".split()]


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    lib = emu.load(["gdn_tree.cu", "gdn_recurrent.cu", "gated_rmsnorm.cu"], tmp_path_factory.mktemp("emu_gdn_tree"),
                   "the GDN tree verify, recurrent and gated RMSNorm kernels")
    lib.luce_gdn_tree_verify.argtypes = [C.POINTER(VerifyParams), _P]
    lib.luce_gdn_recurrent.argtypes = [C.POINTER(RecurrentParams), _P]
    lib.luce_gdn_tree_commit.argtypes = [C.POINTER(CommitParams), _P]
    lib.luce_gated_rmsnorm.argtypes = [C.POINTER(NormParams), _P]
    return lib


def verify(lib, x, parents, qo, slots, norm: bool, z_stride: int | None = None):
    T = int(qo[-1])
    out = {n: np.full((T, HV, DV), np.nan, np.float32) for n in ("out", "u", "normed")}
    arrivals = np.zeros((len(slots), HV), np.int32)
    addr = lambda a: a.ctypes.data  # noqa: E731
    z = x["zwide"] if z_stride else x["z"]
    p = VerifyParams(*(addr(x[n]) for n in "q k v g beta state".split()), addr(out["out"]), addr(out["u"]),
                     None, None, None, None, addr(qo), addr(slots), addr(parents), SLOTS, 0, len(slots), HV, DK, DV,
                     8, addr(z) if norm else None, addr(x["norm"]) if norm else None,
                     addr(out["normed"]) if norm else None, addr(arrivals) if norm else None,
                     z_stride or HV * DV, EPS)
    status = lib.luce_gdn_tree_verify(C.byref(p), None)
    return status, out


def inputs(seed: int, T: int):
    rng = np.random.default_rng(seed)
    f32 = lambda a: np.ascontiguousarray(a, np.float32)  # noqa: E731
    unit = lambda a: a / np.linalg.norm(a, axis=-1, keepdims=True)  # noqa: E731
    z = f32(rng.standard_normal((T, HV * DV)))
    zwide = f32(np.concatenate([z, rng.standard_normal((T, 5))], 1))   # z as a merged part's column block
    return dict(q=f32(unit(rng.standard_normal((T, HV, DK))) / 8), k=f32(unit(rng.standard_normal((T, HV, DK)))),
                v=f32(rng.standard_normal((T, HV, DV))), g=f32(-np.abs(rng.standard_normal((T, HV)))),
                beta=f32(rng.uniform(0.1, 0.9, (T, HV))), state=f32(rng.standard_normal((SLOTS, HV, DK, DV)) * 0.1),
                z=z, zwide=zwide, norm=f32(1.0 + 0.1 * rng.standard_normal(DV)))


def layout(trees):
    qo, parents = [0], []
    for _, local in trees:
        parents += [p + qo[-1] if p >= 0 else -1 for p in local]
        qo.append(qo[-1] + len(local))
    return np.asarray(qo, np.int32), np.asarray([s for s, _ in trees], np.int32), np.asarray(parents, np.int32)


@pytest.mark.parametrize("z_stride", [None, HV * DV + 5], ids=["dense_z", "strided_z"])
def test_normed_is_gated_rmsnorm_of_out(lib, z_stride):
    qo, slots, parents = layout(TREES)
    x = inputs(31, int(qo[-1]))
    st_plain, plain = verify(lib, x, parents, qo, slots, norm=False)
    st_norm, fused = verify(lib, x, parents, qo, slots, norm=True, z_stride=z_stride)
    assert st_plain == st_norm == 0
    live = np.concatenate([np.arange(qo[s], qo[s + 1]) for s in range(len(slots)) if slots[s] >= 0])
    pad = np.setdiff1d(np.arange(int(qo[-1])), live)
    for n in ("out", "u"):
        assert np.array_equal(fused[n][live], plain[n][live]), f"{n} changed with the epilogue"
    want = np.full_like(fused["normed"], np.nan)
    rows = int(qo[-1]) * HV
    p = NormParams(plain["out"].ctypes.data, x["z"].ctypes.data, x["norm"].ctypes.data, want.ctypes.data, rows, DV,
                   EPS)
    assert lib.luce_gated_rmsnorm(C.byref(p), None) == 0
    assert np.array_equal(fused["normed"][live], want[live])
    assert np.isnan(fused["normed"][pad]).all(), "a padding segment's normed rows were written"


def test_a_malformed_tree_has_nan_normed_rows(lib):
    trees = [(1, [-1, 0, 1])]
    qo, slots, parents = layout(trees)
    parents[1] = 2   # row 1's parent after it
    x = inputs(32, 3)
    status, out = verify(lib, x, parents, qo, slots, norm=True)
    assert status == 0 and np.isnan(out["normed"]).all()


def test_a_z_stride_below_the_row_width_is_refused(lib):
    qo, slots, parents = layout(TREES)
    x = inputs(33, int(qo[-1]))
    assert verify(lib, x, parents, qo, slots, norm=True, z_stride=HV * DV - 1)[0] != 0


def root_path(parents, row: int) -> list[int]:
    path = [row]
    while parents[path[-1]] >= 0:
        path.append(int(parents[path[-1]]))
    return path[::-1]


def recurrent(lib, x, path: list[int], slot: int) -> tuple[np.ndarray, np.ndarray]:
    """(slot states, outputs [len(path), HV, DV]) of luce_gdn_recurrent stepping `path`'s rows
    from x's states."""
    chain = {n: np.ascontiguousarray(x[n][path]) for n in "q k v g beta".split()}
    state, out = x["state"].copy(), np.full((len(path), HV, DV), np.nan, np.float32)
    one, slot_arr = np.asarray([0, len(path)], np.int32), np.asarray([slot], np.int32)
    p = RecurrentParams(*(chain[n].ctypes.data for n in "q k v g beta".split()), state.ctypes.data,
                        out.ctypes.data, one.ctypes.data, slot_arr.ctypes.data, SLOTS, 1, HV, DK, DV)
    assert lib.luce_gdn_recurrent(C.byref(p), None) == 0
    return state, out


def test_each_node_is_the_recurrent_step_along_its_root_path(lib):
    qo, slots, parents = layout(TREES)
    x = inputs(34, int(qo[-1]))
    status, got = verify(lib, x, parents, qo, slots, norm=False)
    assert status == 0
    for seg, slot in enumerate(slots):
        for row in range(qo[seg], qo[seg + 1]) if slot >= 0 else ():
            _, out = recurrent(lib, x, root_path(parents, row), int(slot))
            assert np.array_equal(got["out"][row], out[-1]), f"node {row}'s output differs from its root path's"


def test_commit_of_a_path_leaves_the_recurrent_state(lib):
    """Each tree's last row's root path (3 and 2 rows) committed from verify's u: every slot's
    state bitwise what luce_gdn_recurrent leaves stepping those tokens; the padding segment's slot
    and the slot no tree names are untouched."""
    qo, slots, parents = layout(TREES)
    x = inputs(35, int(qo[-1]))
    status, got = verify(lib, x, parents, qo, slots, norm=False)
    assert status == 0
    paths = [root_path(parents, int(qo[s + 1]) - 1) if slot >= 0 else [] for s, slot in enumerate(slots)]
    indptr = np.cumsum([0] + [len(p) for p in paths]).astype(np.int32)
    rows = np.asarray([r for p in paths for r in p], np.int32)
    state = x["state"].copy()
    p = CommitParams(x["k"].ctypes.data, x["g"].ctypes.data, got["u"].ctypes.data, state.ctypes.data,
                     indptr.ctypes.data, rows.ctypes.data, slots.ctypes.data, SLOTS, len(slots), HV, DK, DV)
    assert lib.luce_gdn_tree_commit(C.byref(p), None) == 0
    for path, slot in zip(paths, slots):
        if slot >= 0:
            want, _ = recurrent(lib, x, path, int(slot))
            assert np.array_equal(state[slot], want[slot]), f"slot {slot}: the commit of {path} is not the recurrent state"
    untouched = set(range(SLOTS)) - {int(s) for s in slots if s >= 0}
    for slot in untouched:
        assert np.array_equal(state[slot], x["state"][slot])
