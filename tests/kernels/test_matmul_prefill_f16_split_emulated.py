"""Tune 81 of the f16 prompt-row GEMM (cuda/matmul_prefill_wgmma.cuh: the 80- / 48-token
warpgroup tiles with k split over a cluster of Z blocks), its own source on the CPU (tests/kernels/emu
runs a cluster's blocks as one set of fibers, each wgmma as its m16n8k16 products). Z is forced to 3
(LUCE_PREFILL_SPLIT_K, read once by the library this module builds), so the k parts of 5 and 6
chunks are uneven ([0, 1), [1, 3), [3, 5)) and even.

The split's bits are a fixed function of the matrix: block z's chain over its chunks, then
((p0 + p1) + p2) in rank order. Checked exactly against tune 80 (one chain, no split) run on each
part's k slice alone, with x made so every slice has the row's max (the same power-of-two x scale,
so the same f16 x and the same out_scale), and the parts summed here in f32 in rank order.
"""
from __future__ import annotations

import ctypes as C
import os

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from luce.ref.matmul_prefill_f16 import f32_sum_bound, matmul_prefill_f16
from tests.kernels.emu import build as emu
from tests.kernels.test_matmul import activations, weights
from tests.kernels.test_matmul_prefill_f16_emulated import run

pytestmark = pytest.mark.slow
Z = 3
CHUNK = 256
CHUNK_BYTES = {Q.Q8_0: 8 * 34, Q.Q6_K: 210, Q.IQ4_XS: 136}


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    """A library whose tune 81 splits k in Z parts (the variable is latched by a first call)."""
    before = os.environ.get("LUCE_PREFILL_SPLIT_K")
    os.environ["LUCE_PREFILL_SPLIT_K"] = str(Z)
    try:
        lib = emu.load(["matmul_prefill_f16.cu"], tmp_path_factory.mktemp("emu_split"), "the f16 prompt-row GEMM")
        lib.luce_matmul_prefill_f16_workspace_bytes.restype = C.c_int64
        lib.luce_matmul_prefill_f16_workspace_bytes.argtypes = [C.c_int64, C.c_int64]
        raw, _ = weights(Q.Q8_0, 16, 3 * CHUNK)
        run(lib, activations(1, 3 * CHUNK, seed=1), raw, Q.Q8_0, 16, tune=81)
    finally:
        if before is None:
            del os.environ["LUCE_PREFILL_SPLIT_K"]
        else:
            os.environ["LUCE_PREFILL_SPLIT_K"] = before
    return lib


def parts(chunks: int) -> list[tuple[int, int]]:
    """The chunk ranges of the Z k parts (matmul_prefill_wgmma.cuh: [chunks z / Z, chunks (z + 1) / Z))."""
    return [(chunks * z // Z, chunks * (z + 1) // Z) for z in range(Z)]


def same_max_in_every_part(x: np.ndarray, chunks: int) -> np.ndarray:
    """x with each row's largest |value| (times 1.5) placed at the start of every k part, so each
    part's slice has the whole row's scale."""
    x = x.copy()
    top = 1.5 * np.abs(x).max(axis=1)
    for first, _ in parts(chunks):
        x[:, first * CHUNK] = top
    return x


@pytest.mark.parametrize("qtype,chunks", [(Q.Q8_0, 5), (Q.Q6_K, 6), (Q.IQ4_XS, 5)])
def test_split_is_the_parts_chains_summed_in_rank_order(lib, qtype, chunks):
    """n = 200 (a second, partial 192-row block), 37 and 100 rows (80-token tiles: two, the last
    past the padded x; 37: one 48-token tile): tune 81 == ((p0 + p1) + p2) of tune 80 on each
    part's k slice, bit for bit; and not tune 80's one chain over all of k (the split is real)."""
    n, k = 200, chunks * CHUNK
    raw, _ = weights(qtype, n, k)
    x = same_max_in_every_part(activations(100, k, seed=chunks), chunks)
    cb = CHUNK_BYTES[qtype]
    for rows in (37, 100):
        got, _ = run(lib, x[:rows], raw, qtype, n, tune=81)
        want = None
        for first, end in parts(chunks):
            p, _ = run(lib, x[:rows, first * CHUNK:end * CHUNK], raw[:, first * cb:end * cb], qtype, n, tune=80)
            want = p if want is None else (want + p).astype(np.float32)
        assert np.isfinite(want).all()
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), \
            f"{rows} rows: {np.sum(got != want)} of {got.size} outputs differ"
        whole, _ = run(lib, x[:rows], raw, qtype, n, tune=80)
        assert not np.array_equal(got.view(np.uint32), whole.view(np.uint32))


def test_split_rows_do_not_depend_on_the_call_and_stay_within_the_reference_bound(lib):
    """Q8_0, k = 1,536 (6 chunks: parts of 2), bias: a row's bits are the same alone, among 37 and
    among 100 (batch invariance: Z follows the matrix, never the rows); outputs within
    f32_sum_bound of the float64 reference."""
    n, k, qtype = 200, 6 * CHUNK, Q.Q8_0
    raw, _ = weights(qtype, n, k)
    x = activations(100, k, seed=5)
    bias = np.random.default_rng(6).standard_normal(n).astype(np.float32)
    full, _ = run(lib, x, raw, qtype, n, bias, tune=81)
    assert np.array_equal(run(lib, x[:37], raw, qtype, n, bias, tune=81)[0], full[:37])
    assert np.array_equal(run(lib, x[90:91], raw, qtype, n, bias, tune=81)[0][0], full[90])
    want = matmul_prefill_f16(x, raw, qtype, n, bias)
    err = np.abs(full.astype(np.float64) - want)
    bound = f32_sum_bound(x, raw, qtype, n) + 2.0 ** -23 * np.abs(want)
    assert (err <= bound).all(), f"over the bound by {(err - bound).max():.3g}"


def test_the_library_answers_the_parts_it_splits_into(lib):
    """luce_matmul_prefill_split_k's f16 answer (the draft's routing asks it): Z (forced 3) at most
    the chunks (2 for k = 512), 0 for a float type, k not whole blocks or no rows."""
    parts_of = lib.luce_matmul_prefill_f16_split_k
    parts_of.restype, parts_of.argtypes = C.c_int, [C.c_int32, C.c_int64, C.c_int64]
    assert parts_of(int(Q.Q8_0), 200, 5 * CHUNK) == Z and parts_of(int(Q.Q6_K), 5120, 68 * CHUNK) == Z
    assert parts_of(int(Q.Q8_0), 200, 2 * CHUNK) == 2
    assert parts_of(int(Q.F32), 200, CHUNK) == 0 and parts_of(int(Q.Q8_0), 200, 100) == 0
    assert parts_of(int(Q.Q8_0), 0, CHUNK) == 0
