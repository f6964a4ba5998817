"""Benchmark cases for the cpu backend's paged attention and KV write (luce/cpu/attention.c)
at Qwen2.5-Coder-1.5B shapes: 12 query heads, 2 KV heads, head_dim 128, 16-token f32 pages;
one 27B-shaped decode case (24 / 4 heads, head_dim 256).

CPU_BENCH_CASES: callables returning (run_fn, bytes_moved, flops); run_fn() runs the backend
op once, synchronously (Python argument checks included, as the model calls it). bytes_moved
is the floor: every attended key's K and V row read once, q read, out written."""
from __future__ import annotations

import dataclasses
import functools

import numpy as np

PAGE = 16


def attention_case(n_seqs: int, context: int, rows_per_seq: int = 1, tree: int = 0, hq: int = 12, hkv: int = 2,
                   d: int = 128):
    """n_seqs sequences of `context` KV rows, the last rows_per_seq of each the query rows
    (1: AR decode; more: a causal prefill chunk); tree > 0 adds one tree segment of that many
    nodes (a chain with side branches) after `context` committed rows."""
    from luce.models.packer import SegmentSpec, build_batch
    from luce.ops.cpu_backend import CpuBackend

    backend = CpuBackend()
    rng = np.random.default_rng(0)
    per_seq = -(-(context + tree) // PAGE)
    n_pages = (n_seqs + (1 if tree else 0)) * per_seq
    kv = dataclasses.make_dataclass("KV", ["k", "v"])(
        rng.standard_normal((n_pages, PAGE, hkv, d), dtype=np.float32),
        rng.standard_normal((n_pages, PAGE, hkv, d), dtype=np.float32))
    pages = rng.permutation(n_pages).tolist()
    specs = [SegmentSpec(i, [0] * rows_per_seq, context - rows_per_seq, pages[i * per_seq:(i + 1) * per_seq], "none")
             for i in range(n_seqs)]
    keys = n_seqs * (rows_per_seq * (context - rows_per_seq) + rows_per_seq * (rows_per_seq + 1) // 2)
    if tree:
        specs.append(SegmentSpec(n_seqs, [0] * tree, context, pages[n_seqs * per_seq:], "none"))
    batch = build_batch(specs)
    if tree:
        parents = np.array([-1] + [i - 1 if i % 3 else max(0, i - 2) for i in range(1, tree)])
        tp = np.full(batch.n_rows, -1, np.int32)
        r0 = batch.n_rows - tree
        tp[r0:] = np.where(parents >= 0, parents + r0, -1)
        batch = dataclasses.replace(batch, tree_parents=tp)
        depth = np.zeros(tree, np.int64)
        for i in range(1, tree):
            depth[i] = depth[parents[i]] + 1
        keys += int(tree * context + (depth + 1).sum())
    q = rng.standard_normal((batch.n_rows, hq, d), dtype=np.float32)
    scale = 1.0 / np.sqrt(d)

    def run():
        backend.attention(q, kv, batch, scale)

    bytes_moved = keys * hkv * d * 4 * 2 + 2 * q.nbytes
    return run, bytes_moved, keys * hq * d * 4


def kv_write_case(rows: int, hkv: int = 2, d: int = 128):
    from luce.models.packer import SegmentSpec, build_batch
    from luce.ops.cpu_backend import CpuBackend

    backend = CpuBackend()
    rng = np.random.default_rng(1)
    n_pages = -(-(rows + 1000) // PAGE)
    kv = dataclasses.make_dataclass("KV", ["k", "v"])(np.zeros((n_pages, PAGE, hkv, d), np.float32),
                                                      np.zeros((n_pages, PAGE, hkv, d), np.float32))
    batch = build_batch([SegmentSpec(0, [0] * rows, 1000, list(range(n_pages)), "none")])
    k = rng.standard_normal((rows, hkv, d), dtype=np.float32)

    def run():
        backend.kv_write(kv, batch, k, k)

    return run, 4 * k.nbytes, 0


def _case(name, fn, *args, **kw):
    case = functools.partial(fn, *args, **kw)
    case.__name__ = name
    return case


CPU_BENCH_CASES = [
    _case("cpu_attention_decode_1x1024", attention_case, 1, 1024),
    _case("cpu_attention_decode_1x4096", attention_case, 1, 4096),
    _case("cpu_attention_decode_4x4096", attention_case, 4, 4096),
    _case("cpu_attention_prefill_512", attention_case, 1, 512, 512),
    _case("cpu_attention_prefill_64_at_4096", attention_case, 1, 4096, 64),
    _case("cpu_attention_tree_16_at_4096", attention_case, 0, 4096, 1, tree=16),
    _case("cpu_attention_27b_decode_1x4096", attention_case, 1, 4096, hq=24, hkv=4, d=256),
    _case("cpu_kv_write_1", kv_write_case, 1),
    _case("cpu_kv_write_512", kv_write_case, 512),
]
