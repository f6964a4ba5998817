"""Instruction-set independence of the cpu sequence kernels (luce/cpu/cpu_sequence_ops.h): the
C sources built on their own for the x86-64 baseline (SSE2), x86-64-v3 (AVX2, FMA) and, where
this CPU runs it, x86-64-v4 (AVX-512), each without clones (LUCE_NO_CLONES), give bitwise the
results of luce._cpu (whose clones pick the best path here) for attention with tree rows, the
norms, pointwise maths, rotary and the GDN step and tree verify. Needs gcc; x86-64 Linux only."""
from __future__ import annotations

import ctypes
import dataclasses
import platform
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from tests.kernels.cpu_sequence_harness import cpu_backend, same_bits
from tests.kernels.gdn_harness import gdn_inputs, random_states
from tests.kernels.test_attention import Pool, pack_trees
from tests.kernels.test_gdn_tree import random_tree

SRC = Path(__file__).resolve().parents[2] / "luce" / "cpu"
SOURCES = ["attention.c", "norms.c", "rotary.c", "pointwise.c", "gdn.c", "gdn_tree.c", "seq_common.c", "pool.c"]
FLAGS = ["-O3", "-std=c11", "-pthread", "-ffp-contract=off", "-fno-fast-math", "-fPIC", "-shared", "-DLUCE_NO_CLONES"]

pytestmark = pytest.mark.skipif(platform.machine() != "x86_64" or shutil.which("gcc") is None,
                                reason="needs gcc on x86-64")


def cpu_flags() -> set:
    try:
        return set(Path("/proc/cpuinfo").read_text().split("flags")[1].split("\n")[0].split())
    except (OSError, IndexError):
        return set()


ARCHES = [a for a, need in (("x86-64", None), ("x86-64-v3", "avx2"), ("x86-64-v4", "avx512f"))
          if need is None or need in cpu_flags()]


class Batch(ctypes.Structure):
    _fields_ = [(name, ctypes.c_void_p) for name in ("qo", "kvp", "idx", "last", "slots", "tree")] + \
               [(name, ctypes.c_int64) for name in ("n_indices", "T", "S", "n_pages", "page_size")]


class Rows(ctypes.Structure):
    _fields_ = [(name, ctypes.c_void_p) for name in ("q", "k", "v", "g", "beta")] + \
               [(name, ctypes.c_int64) for name in ("T", "H", "Dk", "Dv")]


@pytest.fixture(scope="module", params=ARCHES)
def lib(request, tmp_path_factory):
    out = tmp_path_factory.mktemp("isa") / f"seq_{request.param}.so"
    stub = out.with_suffix(".stub.c")
    stub.write_text("int luce_cpu_get_threads(void) { return 1; }\n")
    subprocess.run(["gcc", *FLAGS, f"-march={request.param}", "-I", str(SRC), "-o", str(out),
                    *(str(SRC / s) for s in SOURCES), str(stub), "-lm"], check=True)
    return ctypes.CDLL(str(out))


def ptr(a: np.ndarray):
    assert a.flags.c_contiguous
    return ctypes.c_void_p(a.ctypes.data)


def test_attention_with_trees(lib):
    cpu = cpu_backend()
    rng = np.random.default_rng(1)
    for hq, hkv, d in ((12, 2, 128), (10, 1, 40), (3, 3, 17)):
        pool = Pool(rng, 80, hkv, d)
        seqs = [pool.seq(0, 300, 1), pool.seq(1, 100 + 9, 9), pool.seq(-1, 0, 2), pool.seq(2, 64, 64)]
        batch, tp = pack_trees(seqs, [None, random_tree(rng, 9), None, None])
        batch = dataclasses.replace(batch, tree_parents=tp)
        q = rng.standard_normal((batch.n_rows, hq, d)).astype(np.float32)
        want = cpu.attention(q, pool, batch, 0.1)
        got = np.full_like(want, np.nan)
        keep = [np.ascontiguousarray(a, np.int32) for a in (batch.qo_indptr, batch.kv_indptr, batch.kv_indices,
                                                               batch.kv_last_page_len, batch.seq_slots, tp)]
        b = Batch(*(ptr(a) for a in keep), len(keep[2]), batch.n_rows, batch.n_segments, pool.k.shape[0], 16)
        rc = lib.luce_cpu_attention(ptr(q), ptr(pool.k), ptr(pool.v), ptr(got), ctypes.byref(b),
                                    ctypes.c_int64(hq), ctypes.c_int64(hkv), ctypes.c_int64(d), ctypes.c_float(0.1),
                                    ctypes.c_int(1))
        assert rc == 0 and same_bits(got, want), (hq, hkv, d)


def test_norms_pointwise_and_rotary(lib):
    cpu = cpu_backend()
    rng = np.random.default_rng(2)
    x = (rng.standard_normal((37, 129)) * 5).astype(np.float32)
    z = rng.standard_normal((37, 129)).astype(np.float32)
    w = rng.standard_normal(129).astype(np.float32)
    y = np.empty_like(x)
    eps = ctypes.c_double(1e-6)
    i64 = ctypes.c_int64
    assert lib.luce_cpu_rmsnorm(ptr(x), ptr(w), ptr(y), i64(37), i64(129), eps) == 0
    assert same_bits(y, cpu.rmsnorm(x, w, 1e-6))
    assert lib.luce_cpu_l2norm(ptr(x), ptr(y), i64(37), i64(129), eps) == 0
    assert same_bits(y, cpu.l2norm(x, 1e-6))
    assert lib.luce_cpu_gated_rmsnorm(ptr(x), ptr(z), ptr(w), ptr(y), i64(37), i64(129), eps) == 0
    assert same_bits(y, cpu.gated_rmsnorm(x, z, w, 1e-6))
    big = (rng.standard_normal(5000) * 40).astype(np.float32)
    out = np.empty_like(big)
    for code, op in enumerate(("silu", "sigmoid", "softplus", "exp")):
        assert lib.luce_cpu_unary(ptr(big), ptr(out), i64(big.size), ctypes.c_int(code)) == 0
        assert same_bits(out, getattr(cpu, op)(big)), op
    assert lib.luce_cpu_swiglu(ptr(x), ptr(z), ptr(y), i64(x.size)) == 0
    assert same_bits(y, cpu.swiglu(x, z))
    h = rng.standard_normal((9, 5, 64)).astype(np.float32)
    pos = rng.integers(0, 9000, size=(9, 4)).astype(np.int64)
    sections = np.array([11, 11, 10, 0], np.int64)
    hy = np.empty_like(h)
    assert lib.luce_cpu_rope(ptr(h), ptr(hy), ptr(pos), i64(4), i64(9), i64(5), i64(64), i64(48),
                             ctypes.c_double(1e6), ptr(sections)) == 0
    assert same_bits(hy, cpu.rope(h, pos, 48, 1e6, (11, 11, 10, 0)))


def test_gdn_step_and_tree_verify(lib):
    cpu = cpu_backend()
    rng = np.random.default_rng(3)
    for H, dk, dv in ((3, 128, 128), (2, 17, 33)):
        inputs = gdn_inputs(rng, 12, H, dk, dv)
        h0 = random_states(rng, 1, H, dk, dv)[0]
        rows = Rows(*(ptr(a) for a in inputs), 12, H, dk, dv)
        o, h = np.empty((12, H, dv), np.float32), np.empty_like(h0)
        assert lib.luce_cpu_gdn_recurrent(ctypes.byref(rows), ptr(h0), ptr(h), ptr(o)) == 0
        want_o, want_h = cpu.gdn_recurrent(*inputs, h0)
        assert same_bits(o, want_o) and same_bits(h, want_h)
        parents = random_tree(rng, 12).astype(np.int32)
        u = np.empty((12, H, dv), np.float32)
        assert lib.luce_cpu_gdn_tree_verify(ctypes.byref(rows), ptr(parents), ptr(h0), ptr(o), ptr(u), None) == 0
        want_o, kept = cpu.gdn_tree_verify("factor", *inputs, parents, h0)
        assert same_bits(o, want_o) and same_bits(u, kept["factors"].u)
