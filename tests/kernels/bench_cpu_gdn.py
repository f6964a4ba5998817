"""Benchmark cases for the cpu backend's Gated DeltaNet (luce/cpu/gdn.c, gdn_tree.c) at
Qwen3.6-27B shapes: 48 value heads, Dk = Dv = 128, f32 state [48, 128, 128] (3 MiB per slot
and layer). AR rows over a slot pool, prefill (gdn_chunked: the per-token recurrence on the
cpu), tree verify ('factor' and 'baseline') and the factor-replay commit.

CPU_BENCH_CASES: callables returning (run_fn, bytes_moved, flops); run_fn() runs the backend op
once, synchronously (Python included). The state is updated in place by the AR cases, so
repeats keep evolving it (g < 0 keeps it bounded). bytes_moved is the floor: each state read
and written once (verify: read once; baseline: every node's state written) plus the rows."""
from __future__ import annotations

import functools

import numpy as np

HV, DK, DV = 48, 128, 128
STATE_BYTES = HV * DK * DV * 4


def _inputs(T: int, seed: int = 0):
    from tests.kernels.gdn_harness import gdn_inputs

    return gdn_inputs(np.random.default_rng(seed), T, HV, DK, DV)


def _row_bytes(T: int) -> int:
    return T * HV * (2 * DK + 2 * DV + 2) * 4


def segments_case(n_slots: int):
    """n_slots AR rows, each on its own slot of a shuffled pool."""
    from luce.models.packer import SegmentSpec, build_batch
    from luce.ops.cpu_backend import CpuBackend

    b = CpuBackend()
    rng = np.random.default_rng(1)
    pool = (rng.standard_normal((n_slots, HV, DK, DV), dtype=np.float32) * 0.1)
    batch = build_batch([SegmentSpec(int(s), [0], 10, [0], "none") for s in rng.permutation(n_slots)])
    inputs = _inputs(n_slots)
    return (lambda: b.gdn_recurrent_segments(*inputs, pool, batch)), \
        n_slots * 2 * STATE_BYTES + _row_bytes(n_slots), n_slots * HV * DK * DV * 8


def prefill_case(T: int):
    from luce.ops.cpu_backend import CpuBackend

    b = CpuBackend()
    h0 = np.random.default_rng(2).standard_normal((HV, DK, DV), dtype=np.float32) * 0.1
    inputs = _inputs(T, 3)
    return (lambda: b.gdn_chunked(*inputs, h0, chunk=64)), 2 * STATE_BYTES + _row_bytes(T), T * HV * DK * DV * 8


def _tree(n: int) -> np.ndarray:
    return np.array([-1] + [i - 1 if i % 3 else max(0, i - 2) for i in range(1, n)])


def verify_case(n: int, mode: str):
    from luce.ops.cpu_backend import CpuBackend

    b = CpuBackend()
    h0 = np.random.default_rng(4).standard_normal((HV, DK, DV), dtype=np.float32) * 0.1
    inputs, parents = _inputs(n, 5), _tree(n)
    extra = n * STATE_BYTES if mode == "baseline" else 0
    return (lambda: b.gdn_tree_verify(mode, *inputs, parents, h0)), STATE_BYTES + extra + _row_bytes(n), \
        n * HV * DK * DV * 8


def commit_case(n: int, path_len: int):
    from luce.ops.api import TreeStage
    from luce.ops.cpu_backend import CpuBackend

    b = CpuBackend()
    rng = np.random.default_rng(6)
    h0 = rng.standard_normal((HV, DK, DV), dtype=np.float32) * 0.1
    inputs, parents = _inputs(n, 7), np.arange(-1, n - 1)
    _, kept = b.gdn_tree_verify("factor", *inputs, parents, h0)
    pending = TreeStage(conv_inputs=rng.standard_normal((n, 3 * 2048), dtype=np.float32), mode="factor",
                        parents=parents, **kept)
    conv = np.zeros((3, 3 * 2048), np.float32)
    path = np.arange(path_len, dtype=np.int32)
    return (lambda: b.gdn_tree_commit(pending, conv, h0, path)), 2 * STATE_BYTES + _row_bytes(path_len), \
        path_len * HV * DK * DV * 4


def _case(name, fn, *args):
    case = functools.partial(fn, *args)
    case.__name__ = name
    return case


CPU_BENCH_CASES = [
    _case("cpu_gdn_ar_1", segments_case, 1),
    _case("cpu_gdn_ar_4", segments_case, 4),
    _case("cpu_gdn_prefill_64", prefill_case, 64),
    _case("cpu_gdn_prefill_512", prefill_case, 512),
    _case("cpu_gdn_verify_factor_16", verify_case, 16, "factor"),
    _case("cpu_gdn_verify_factor_64", verify_case, 64, "factor"),
    _case("cpu_gdn_verify_baseline_16", verify_case, 16, "baseline"),
    _case("cpu_gdn_commit_8", commit_case, 16, 8),
]
