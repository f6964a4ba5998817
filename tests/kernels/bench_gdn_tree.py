"""Benchmark cases for the GDN tree kernels (cuda/gdn_tree.cu) at Qwen3.6-27B shapes: 48 value
heads, Dk = Dv = 128, f32 state [slots, 48, 128, 128] (3 MiB per slot and layer).

BENCH_CASES: callables returning (launch_fn, bytes_moved, flops); launch_fn(stream: int = 0)
launches once. bytes_moved is the floor. Verify: the resident state read once, per node
q, k, v, g, beta read and out, u and the k, g, beta factor copies written. Commit: the state
read and written once plus the path's k, g, u. Trees are DDTree-like (a chain with side
branches, fixed seed). Run: `python -m tests.kernels.bench_gdn_tree [out.json]`.
"""
from __future__ import annotations

import functools
import sys

import numpy as np

HV, DK, DV = 48, 128, 128


def ddtree_parents(width: int, seed: int = 0) -> np.ndarray:
    """Local parents [width] (root -1): extend the previous node with probability 0.6, else
    branch off a random earlier node."""
    rng = np.random.default_rng(seed)
    parents = np.full(width, -1, dtype=np.int64)
    for i in range(1, width):
        parents[i] = i - 1 if rng.random() < 0.6 else rng.integers(0, i)
    return parents


def verify_case(width: int, n_trees: int = 1):
    """n_trees tree segments of `width` nodes, each on its own slot."""
    from luce import _cuda_gdn_tree as kt
    from luce.ops.cuda_memory import DeviceBuffer
    from tests.kernels.bench_gdn_recurrent import gdn_buffers

    b = gdn_buffers(n_trees, width)  # q, k, v, g, beta, state, out, qo, slots for T = n_trees * width
    T = n_trees * width
    tp = np.concatenate([np.where(ddtree_parents(width, s) >= 0, ddtree_parents(width, s) + s * width, -1)
                         for s in range(n_trees)]).astype(np.int32)
    b["tp"] = DeviceBuffer.from_numpy(tp)
    for name, shape in (("u", (T, HV, DV)), ("k_out", (T, HV, DK)), ("g_out", (T, HV)), ("beta_out", (T, HV))):
        b[name] = DeviceBuffer(int(np.prod(shape)) * 4)
    ws_bytes = kt.verify_workspace_bytes(n_trees, HV, DK, DV, width)
    b["ws"] = DeviceBuffer(ws_bytes)

    def launch(stream: int = 0, b=b):
        kt.gdn_tree_verify(b["q"].ptr, b["k"].ptr, b["v"].ptr, b["g"].ptr, b["beta"].ptr, b["state"].ptr,
                           b["out"].ptr, b["u"].ptr, b["qo"].ptr, b["slots"].ptr, b["tp"].ptr, n_trees,
                           n_trees, HV, DK, DV, width, b["ws"].ptr, ws_bytes, b["k_out"].ptr, b["g_out"].ptr,
                           b["beta_out"].ptr, stream)

    nbytes = n_trees * HV * DK * DV * 4 + T * HV * (2 * DK + DV + 2 + 2 * DV + DK + 2) * 4
    return launch, nbytes, T * HV * DK * DV * 8


def commit_case(path_len: int, n_slots: int = 1):
    """Replay a path of path_len nodes on each of n_slots states."""
    from luce import _cuda_gdn_tree as kt
    from luce.ops.cuda_memory import DeviceBuffer
    from tests.kernels.bench_gdn_recurrent import gdn_buffers

    b = gdn_buffers(n_slots, path_len)
    b["u"] = DeviceBuffer.from_numpy((np.random.default_rng(1).standard_normal((n_slots * path_len, HV, DV))
                                      * 0.1).astype(np.float32))
    b["rows"] = DeviceBuffer.from_numpy(np.arange(n_slots * path_len, dtype=np.int32))

    def launch(stream: int = 0, b=b):  # b["qo"] doubles as the path CSR: path s = rows of segment s
        kt.gdn_tree_commit(b["k"].ptr, b["g"].ptr, b["u"].ptr, b["state"].ptr, b["qo"].ptr, b["rows"].ptr,
                           b["slots"].ptr, n_slots, n_slots, HV, DK, DV, stream)

    nbytes = n_slots * HV * DK * DV * 4 * 2 + n_slots * path_len * HV * (DK + 1 + DV) * 4
    return launch, nbytes, n_slots * path_len * HV * DK * DV * 2


BENCH_CASES = ([functools.partial(verify_case, w, n) for w, n in [(8, 1), (23, 1), (64, 1), (8, 8), (64, 8)]]
               + [functools.partial(commit_case, p, n) for p, n in [(8, 1), (16, 8)]])
for _c in BENCH_CASES:
    _c.__name__ = _c.func.__name__.replace("_case", "").replace("verify", "gdn_tree_verify").replace(
        "commit", "gdn_tree_commit") + "_" + "_".join(map(str, _c.args))


if __name__ == "__main__":
    from tests.kernels.bench_attention import run_cases

    run_cases(BENCH_CASES, sys.argv[1] if len(sys.argv) > 1 else None)
