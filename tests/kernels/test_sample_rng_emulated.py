"""cuda/sample_rng.cu's own source on the CPU (tests/kernels/emu): each select block's list is
its slice's top_k in (logit descending, id ascending) order, exactly as numpy sorts them, over
exact ties, -inf entries, a whole slice of one value and slices smaller than k; and the drawn
ids equal the host sampler's (luce/ref/sample_rng.py), NaN rows -1.
tests/kernels/test_sample_rng.py runs the same kernel on a GPU."""
from __future__ import annotations

import ctypes as C

import numpy as np
import pytest

from luce.ref.sample_rng import sample_rng
from tests.kernels.emu import build as emu
from tests.kernels.test_sample_rng import _logits, _params

pytestmark = pytest.mark.slow
_P = C.c_void_p
SLICE, KMAX, NO_ID = 8192, 64, 0x7FFFFFFF
CAND = np.dtype([("v", np.float32), ("id", np.int32)])


class Params(C.Structure):
    """luce_sample_rng_params (cuda/luce_ops.h), field for field."""
    _fields_ = [(n, _P) for n in "logits temperature top_k top_p min_p seed position ids_out workspace".split()] + \
               [(n, C.c_int64) for n in "workspace_bytes rows vocab logits_stride".split()]


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    lib = emu.load(["sample_rng.cu"], tmp_path_factory.mktemp("emu_sample_rng"), "the sampling kernels")
    lib.luce_sample_rng.argtypes = [C.POINTER(Params), _P]
    lib.luce_sample_rng_workspace_bytes.restype = C.c_int64
    lib.luce_sample_rng_workspace_bytes.argtypes = [C.c_int64, C.c_int64]
    return lib


def run(lib, logits, p):
    """-> (ids [rows], the select blocks' lists [rows, slices, KMAX] of CAND)."""
    rows, vocab = logits.shape
    arrays = dict(logits=np.ascontiguousarray(logits, np.float32),
                  temperature=np.asarray(p["temperature"], np.float64), top_k=np.asarray(p["top_k"], np.int32),
                  top_p=np.asarray(p["top_p"], np.float64), min_p=np.asarray(p["min_p"], np.float64),
                  seed=np.asarray(p["seed"], np.uint64), position=np.asarray(p["position"], np.int64),
                  ids_out=np.full(rows, -7, np.int64))
    ws_bytes = lib.luce_sample_rng_workspace_bytes(rows, vocab)
    ws = np.zeros(ws_bytes, np.uint8)
    prm = Params(**{k: a.ctypes.data for k, a in arrays.items()}, workspace=ws.ctypes.data,
                 workspace_bytes=ws_bytes, rows=rows, vocab=vocab, logits_stride=vocab)
    assert lib.luce_sample_rng(C.byref(prm), None) == 0
    slices = -(-vocab // SLICE)
    lists = ws[:rows * slices * KMAX * CAND.itemsize].view(CAND).reshape(rows, slices, KMAX)
    return arrays["ids_out"], lists


def expected_list(values: np.ndarray, first_id: int, k: int) -> list[tuple[float, int]]:
    """The k first of a slice in (value descending, id ascending) order, (-inf, NO_ID) past the
    non-NaN ones."""
    ids = first_id + np.arange(len(values))
    keep = ~np.isnan(values)
    order = np.lexsort((ids[keep], -values[keep].astype(np.float64)))[:k]
    got = [(float(values[keep][i]), int(ids[keep][i])) for i in order]
    return got + [(-np.inf, NO_ID)] * (k - len(got))


@pytest.mark.parametrize("vocab", [50, 8197, 20000])
def test_select_lists_and_draws_equal_the_host_emulated(lib, vocab):
    rng = np.random.default_rng(vocab)
    rows = 3
    logits, p = _logits(rng, rows, vocab), _params(rng, rows)
    p["temperature"] = np.array([0.9, 0.0, 1.7])
    p["top_k"] = np.array([64, 7, 40], np.int32)
    logits[1, :min(vocab, 3000)] = 0.25          # a run of one value: its order is by id alone
    logits[1, 7] = -0.0
    logits[1, 9] = 0.0                           # -0.0 and 0.0 tie
    ids, lists = run(lib, logits, p)
    np.testing.assert_array_equal(ids, sample_rng(logits, **p))
    for r in range(rows):
        k = 1 if p["temperature"][r] == 0.0 else int(p["top_k"][r])
        for s in range(lists.shape[1]):
            want = expected_list(logits[r, s * SLICE:(s + 1) * SLICE], s * SLICE, k)
            got = [(float(c["v"]), int(c["id"])) for c in lists[r, s, :k]]
            assert got == want, (r, s)


def test_many_draws_of_one_row_and_nan_rows_emulated(lib):
    rng = np.random.default_rng(11)
    rows, vocab = 24, 9000
    logits = np.repeat(_logits(rng, 1, vocab), rows, axis=0)
    p = _params(rng, rows)
    p["temperature"] = np.full(rows, 1.3)
    p["top_k"] = np.full(rows, 64, np.int32)
    p["top_p"], p["min_p"] = np.ones(rows), np.zeros(rows)     # every candidate can be drawn
    logits[5, 100] = np.nan
    ids, _ = run(lib, logits, p)
    want = sample_rng(logits, **p)
    np.testing.assert_array_equal(ids, want)
    assert ids[5] == -1 and len(set(ids.tolist())) > 8          # the draws spread over the candidates
