"""Benchmark cases for paged attention (cuda/attention.cu) at Qwen3.6-27B shapes: 24 query
heads, 4 KV heads, head_dim 256, 16-token f32 pages.

BENCH_CASES: callables that allocate and fill device buffers and return
(launch_fn, bytes_moved, flops); launch_fn(stream: int = 0) launches once. bytes_moved is the
floor (every K/V row of every attended key read once, q read, out written). tools/bench.py
replays the launches in a CUDA graph; `python -m tests.kernels.bench_attention` runs these
cases (and the GDN ones) with the small graph-replay timer below.
"""
from __future__ import annotations

import functools
import json
import os
import statistics
import sys

import numpy as np

HQ, HKV, D, PAGE = 24, 4, 256, 16
COUNTERS = 1 << 16  # the engine's merge counters (luce/ops/cuda_sequence_ops.py ATTENTION_COUNTERS)
_TILE_FLOATS = 1 << 24  # 64 MiB of random floats, tiled over large buffers


def _rt():
    from cuda.bindings import runtime as cudart

    return cudart


def random_device_buffer(n_floats: int, seed: int, scale: float = 1.0):
    """A DeviceBuffer of n_floats f32: a random 64 MiB tile repeated (fast to set up)."""
    from luce.ops.cuda_memory import DeviceBuffer
    from luce.ops.gpu_runtime import check

    rt = _rt()
    tile = (np.random.default_rng(seed).standard_normal(min(n_floats, _TILE_FLOATS)) * scale).astype(np.float32)
    buf = DeviceBuffer(n_floats * 4)
    buf.upload(tile)
    done = tile.size
    while done < n_floats:
        n = min(done, n_floats - done)
        check(rt.cudaMemcpy(buf.ptr + done * 4, buf.ptr, n * 4,
                            rt.cudaMemcpyKind.cudaMemcpyDeviceToDevice), "cudaMemcpy D2D")
        done += n
    return buf


def attention_case(n_seqs: int, context: int, rows_per_seq: int = 1, heads: tuple = (HQ, HKV, D),
                   tiled: bool = False, prompt_kernel: str = "f16", decode_form: str | None = None):
    """n_seqs sequences of `context` KV rows each, the last rows_per_seq of them queries
    (1: AR decode rows; more: a prefill chunk). heads (Hq, Hkv, D); tiled: every row takes
    the prompt-row kernel (prompt_rows = all rows), prompt_kernel "f16" (f16 tensor cores,
    cuda/attention_prefill_f16*.cuh, staging the keys as f16 first: the default), "f16s" / "f16w"
    / "f16l" / "f16l4" / "f16l2" / "f16g" (its 8-warp / wide / long / warpgroup staged forms), "f16p" (its paged form, every
    tile converting the f32 pages) or "tf32" (the TF32 one; LUCE_ATTN_PROMPT,
    set around each launch), else the per-row partition kernel (the decode rows' arithmetic);
    decode_form: LUCE_ATTN_DECODE around each launch ("cluster": its merge through distributed shared
    memory, cuda/attention_cluster.cuh; "chain": the workspace merge; None: the library's default).
    The timed launch includes the staging pre-pass and the combine; it gets merge counters as the
    engine's launches do (luce/ops/cuda_sequence_ops.py), so rows without prompt rows merge in the
    partition kernel (no combine launch)."""
    hq, hkv, d = heads
    from luce import _cuda_attention as ka
    from luce.ops.cuda_memory import DeviceBuffer
    from luce.ops.native import load_kernels

    load_kernels()
    pages_per_seq = -(-context // PAGE)
    n_pages = n_seqs * pages_per_seq
    page_floats = PAGE * hkv * d
    k = random_device_buffer(n_pages * page_floats, 1)
    v = random_device_buffer(n_pages * page_floats, 2)
    rows = n_seqs * rows_per_seq
    q = random_device_buffer(rows * hq * d, 3)
    out = DeviceBuffer(rows * hq * d * 4)
    perm = np.random.default_rng(0).permutation(n_pages).astype(np.int32)
    meta = [np.arange(n_seqs + 1, dtype=np.int32) * rows_per_seq,
            np.arange(n_seqs + 1, dtype=np.int32) * pages_per_seq, perm,
            np.full(n_seqs, context - (pages_per_seq - 1) * PAGE, np.int32),
            np.arange(n_seqs, dtype=np.int32)]
    meta_bufs = [DeviceBuffer.from_numpy(a) for a in meta]
    n_kv_indices = n_pages if tiled and prompt_kernel in ("f16", "f16s", "f16w", "f16l", "f16l4", "f16l2", "f16g") else 0
    ws_bytes = ka.workspace_bytes(rows, hq, d, context, rows if tiled else 0, hkv, PAGE, n_kv_indices)
    ws = DeviceBuffer(ws_bytes)
    counters = DeviceBuffer.from_numpy(np.zeros(COUNTERS, np.int32))
    keep = (k, v, q, out, ws, meta_bufs, counters)

    def launch(stream: int = 0, _keep=keep):
        env = {"LUCE_ATTN_PROMPT": prompt_kernel, **({"LUCE_ATTN_DECODE": decode_form} if decode_form else {})}
        before = {name: os.environ.get(name) for name in env}
        os.environ.update(env)
        try:
            ka.attention(q.ptr, k.ptr, v.ptr, out.ptr, ws.ptr, ws_bytes, *(b.ptr for b in meta_bufs),
                         rows, n_seqs, hq, hkv, d, PAGE, context, 1.0 / 16, True, stream,
                         prompt_rows=rows if tiled else 0, n_kv_indices=n_kv_indices,
                         counters=counters.ptr, n_counters=COUNTERS)
        finally:
            for name, value in before.items():
                if value is None:
                    del os.environ[name]
                else:
                    os.environ[name] = value

    keys = n_seqs * sum(context - rows_per_seq + j + 1 for j in range(rows_per_seq))
    bytes_moved = n_seqs * context * hkv * d * 4 * 2 + 2 * rows * hq * d * 4
    return launch, bytes_moved, 4 * keys * hq * d


def tree_attention_case(n_decoders: int, context: int, width: int, heads: tuple = (HQ, HKV, D)):
    """n_decoders AR rows at `context` keys, then one width-`width` tree segment (DDTree-like
    parents) whose committed prefix is `context`: the verify step's attention launch; heads
    (Hq, Hkv, D)."""
    from luce import _cuda_attention as ka
    from luce.ops.cuda_memory import DeviceBuffer
    from luce.ops.native import load_kernels
    from tests.kernels.bench_gdn_tree import ddtree_parents

    load_kernels()
    hq, hkv, d = heads
    lens = [context] * n_decoders + [context + width]
    rows_of = [1] * n_decoders + [width]
    pages_of = [-(-n // PAGE) for n in lens]
    n_pages, rows = sum(pages_of), sum(rows_of)
    page_floats = PAGE * hkv * d
    k = random_device_buffer(n_pages * page_floats, 1)
    v = random_device_buffer(n_pages * page_floats, 2)
    q = random_device_buffer(rows * hq * d, 3)
    out = DeviceBuffer(rows * hq * d * 4)
    parents = ddtree_parents(width)
    tp = np.full(rows, -1, np.int32)
    tp[n_decoders:] = np.where(parents >= 0, parents + n_decoders, -1)
    meta = [np.concatenate([[0], np.cumsum(rows_of)]).astype(np.int32),
            np.concatenate([[0], np.cumsum(pages_of)]).astype(np.int32),
            np.random.default_rng(0).permutation(n_pages).astype(np.int32),
            np.array([n - (p - 1) * PAGE for n, p in zip(lens, pages_of)], np.int32),
            np.arange(len(lens), dtype=np.int32), tp]
    meta_bufs = [DeviceBuffer.from_numpy(a) for a in meta]
    ws_bytes = ka.workspace_bytes(rows, hq, d, max(lens))
    ws = DeviceBuffer(ws_bytes)
    counters = DeviceBuffer.from_numpy(np.zeros(COUNTERS, np.int32))
    keep = (k, v, q, out, ws, meta_bufs, counters)

    def launch(stream: int = 0, _keep=keep):
        ka.attention(q.ptr, k.ptr, v.ptr, out.ptr, ws.ptr, ws_bytes, *(b.ptr for b in meta_bufs[:5]),
                     rows, len(lens), hq, hkv, d, PAGE, max(lens), 1.0 / 16, True, stream,
                     tree_parents=meta_bufs[5].ptr, counters=counters.ptr, n_counters=COUNTERS)

    depth = np.zeros(width, np.int64)
    for i in range(1, width):
        depth[i] = depth[parents[i]] + 1
    keys = n_decoders * context + int((context + depth + 1).sum())
    bytes_moved = sum(lens) * hkv * d * 4 * 2 + 2 * rows * hq * d * 4
    return launch, bytes_moved, 4 * keys * hq * d


BENCH_CASES = [
    functools.partial(attention_case, n, ctx, rows)
    for n, ctx, rows in [(1, 4096, 1), (1, 32768, 1), (8, 4096, 1), (8, 8192, 1), (8, 32768, 1),
                         (32, 4096, 1), (1, 4096, 64)]
]
for _c in BENCH_CASES:
    _c.__name__ = "attention_" + "_".join(map(str, _c.args))
# Prompt chunks of 512 rows ending at 4K and 12K keys at the 27B shape and the Coder-1.5B one
# (Hq 12, Hkv 2, D 128): the f16 prompt kernel (staged; at D = 128 its wide form), its paged
# form ("f16p": the kernel before staging), the TF32 one ("tiled": the names PERF.md's earlier
# rows use, e.g. 1,954 us and 364 us at 4K) and per-row; then the engine's 2,048-row chunks at
# 12K (f16, f16p). At the Coder shape also the 8-warp staged form ("f16s", the default before
# the wide form).
SHAPES = {"27b": (HQ, HKV, D), "1p5b": (12, 2, 128)}
PREFILL_CASES = []
for _shape, _heads in SHAPES.items():
    for _ctx in (4096, 12288):
        for _name, _tiled, _kernel in (("f16", True, "f16"), ("f16p", True, "f16p"), ("tiled", True, "tf32"),
                                       ("per_row", False, "f16"), ("f16s", True, "f16s")):
            if _name == "f16s" and _shape != "1p5b":
                continue
            _c = functools.partial(attention_case, 1, _ctx, 512, _heads, _tiled, _kernel)
            _c.__name__ = f"attention_prompt_{_name}_{_shape}_{_ctx}_512"
            PREFILL_CASES.append(_c)
    for _name in ("f16", "f16p") + (("f16s",) if _shape == "1p5b" else ()):
        _c = functools.partial(attention_case, 1, 12288, 2048, _heads, True, _name)
        _c.__name__ = f"attention_prompt_{_name}_{_shape}_12288_2048"
        PREFILL_CASES.append(_c)
# The long form (cuda/attention_prefill_f16_long.cuh: blocks walk runs of splits; f16l 6 warps,
# f16l4 4 warps, f16l2 4 warps of two m-tiles; f16g: the warpgroup form, wgmma) at the Coder shape: 512 rows at 4K and 12K, 2,048 rows at 12K.
for _name in ("f16l", "f16l4", "f16l2", "f16g"):
    for _ctx, _rows in ((4096, 512), (12288, 512), (12288, 2048)):
        _c = functools.partial(attention_case, 1, _ctx, _rows, SHAPES["1p5b"], True, _name)
        _c.__name__ = f"attention_prompt_{_name}_1p5b_{_ctx}_{_rows}"
        PREFILL_CASES.append(_c)
# The Coder-0.5B's shape (Hq 14, Hkv 2, D 64: the 8-warp staged form by default) in the default,
# long and warpgroup forms, to pick its default.
for _name in ("f16", "f16l", "f16g"):
    for _ctx, _rows in ((4096, 2048), (12288, 2048)):
        _c = functools.partial(attention_case, 1, _ctx, _rows, (14, 2, 64), True, _name)
        _c.__name__ = f"attention_prompt_{_name}_q05_{_ctx}_{_rows}"
        PREFILL_CASES.append(_c)
for _name, _kernel in (("f16", "f16"), ("f16p", "f16p"), ("tiled", "tf32")):
    _c = functools.partial(attention_case, 1, 4096, 64, (HQ, HKV, D), True, _kernel)
    _c.__name__ = f"attention_prompt_{_name}_27b_4096_64"
    PREFILL_CASES.append(_c)
# One decode row at the small models' shapes and short contexts (a chat turn's first tokens):
# the partition kernel's latency, which a Coder-1.5B / 0.5B decode step pays once a layer
# (LUCE_ATTN_CHUNK_MIN=256: the kernel before chunks, for A/B runs).
DECODE_SHAPES = {"1p5b": (12, 2, 128), "q05": (14, 2, 64)}
for _shape, _heads in DECODE_SHAPES.items():
    for _ctx in (160, 1024):
        _c = functools.partial(attention_case, 1, _ctx, 1, _heads)
        _c.__name__ = f"attention_decode_{_shape}_{_ctx}"
        BENCH_CASES.append(_c)
        for _form in ("chain", "cluster"):   # LUCE_ATTN_DECODE: the merge's two forms, for A/B in one run
            _c = functools.partial(attention_case, 1, _ctx, 1, _heads, decode_form=_form)
            _c.__name__ = f"attention_decode_{_form}_{_shape}_{_ctx}"
            BENCH_CASES.append(_c)
# The 27B verify's trees (23 and 64 rows over 1,024 keys, bench_decode's verify section) and longer prefixes.
TREE_CASES = [functools.partial(tree_attention_case, n, ctx, w) for n, ctx, w in [(2, 1024, 8), (0, 4096, 64),
                                                                                 (0, 4096, 8), (0, 1024, 23),
                                                                                 (0, 1024, 64)]]
for _c in TREE_CASES:
    _c.__name__ = "attention_tree_" + "_".join(map(str, _c.args))
# A verify of one DDTree of 23 / 64 rows over 128 committed keys at the Coder shapes (the 1.5B's
# verify bench, docs/PERF.md session 26: 20.7 / 30.7 us a layer against 10.5 for its AR row).
for _shape, _heads in DECODE_SHAPES.items():
    for _w in (23, 64):
        _c = functools.partial(tree_attention_case, 0, 128, _w, _heads)
        _c.__name__ = f"attention_tree_{_shape}_128_{_w}"
        TREE_CASES.append(_c)
# A width-1 verify's tree row against an AR row at the 27B shape over 128 keys (bench_decode's
# verify over its 128-token prompt; CUPTI, docs/PERF.md session 32: 31 us a call against 12).
_c = functools.partial(tree_attention_case, 0, 128, 1)
_c.__name__ = "attention_tree_27b_128_1"
TREE_CASES.append(_c)
_c = functools.partial(attention_case, 1, 129, 1)
_c.__name__ = "attention_decode_27b_129"
BENCH_CASES.append(_c)
BENCH_CASES += TREE_CASES + PREFILL_CASES


# ---- a small graph-replay timer (stand-in until tools/bench.py runs these cases) ----------

def _ok(result, what):
    from luce.ops.gpu_runtime import check

    return check(result, what)


def _elapsed_ms(start, end) -> float:
    rt = _rt()
    fn = getattr(rt, "cudaEventElapsedTime", None) or getattr(rt, "cudaEventElapsedTime_v2")
    return float(_ok(fn(start, end), "cudaEventElapsedTime"))


def time_launches(launch, reps: int = 20, trials: int = 15) -> tuple[float, str]:
    """Median seconds per launch: `reps` launches captured in one graph, replayed `trials`
    times between events (falls back to a plain launch loop if capture fails)."""
    rt = _rt()
    stream = _ok(rt.cudaStreamCreate(), "cudaStreamCreate")
    start, end = (_ok(rt.cudaEventCreate(), "cudaEventCreate") for _ in range(2))
    launch(int(stream))  # warm-up, outside capture
    _ok(rt.cudaStreamSynchronize(stream), "sync")
    try:
        _ok(rt.cudaStreamBeginCapture(stream, rt.cudaStreamCaptureMode.cudaStreamCaptureModeThreadLocal), "capture")
        for _ in range(reps):
            launch(int(stream))
        graph = _ok(rt.cudaStreamEndCapture(stream), "end capture")
        exe = _ok(rt.cudaGraphInstantiate(graph, 0), "instantiate")
        run, mode = (lambda: _ok(rt.cudaGraphLaunch(exe, stream), "graph launch")), "graph"
    except Exception:  # noqa: BLE001 - report the mode, keep timing
        rt.cudaStreamEndCapture(stream)
        rt.cudaGetLastError()

        def run():
            for _ in range(reps):
                launch(int(stream))
        mode = "loop"
    run()
    times = []
    for _ in range(trials):
        _ok(rt.cudaEventRecord(start, stream), "record")
        run()
        _ok(rt.cudaEventRecord(end, stream), "record")
        _ok(rt.cudaEventSynchronize(end), "event sync")
        times.append(_elapsed_ms(start, end) / 1e3 / reps)
    return statistics.median(times), mode


def copy_bandwidth(n_bytes: int = 1 << 30) -> float:
    """Device-to-device copy rate, bytes read plus written per second (the roofline)."""
    from luce.ops.cuda_memory import DeviceBuffer

    rt = _rt()
    src, dst = DeviceBuffer(n_bytes), DeviceBuffer(n_bytes)
    kind = rt.cudaMemcpyKind.cudaMemcpyDeviceToDevice

    def launch(stream: int = 0):
        _ok(rt.cudaMemcpyAsync(dst.ptr, src.ptr, n_bytes, kind, stream), "cudaMemcpyAsync")

    seconds, _ = time_launches(launch, reps=5, trials=9)
    return 2 * n_bytes / seconds


def run_cases(cases, json_path: str | None = None) -> list[dict]:
    bw = copy_bandwidth()
    print(f"device copy bandwidth: {bw / 1e9:.0f} GB/s (read + write)")
    results = []
    for case in cases:
        name = getattr(case, "__name__", repr(case))
        try:
            launch, nbytes, flops = case()
            seconds, mode = time_launches(launch)
        except Exception as exc:  # noqa: BLE001 - one failed case must not hide the others
            print(f"{name:40s} FAILED: {exc}")
            results.append({"case": name, "error": str(exc)})
            continue
        row = {"case": name, "us": seconds * 1e6, "GB/s": nbytes / seconds / 1e9,
               "pct_copy_bw": 100 * nbytes / seconds / bw, "TFLOP/s": flops / seconds / 1e12,
               "bytes": nbytes, "flops": flops, "mode": mode}
        results.append(row)
        print(f"{name:40s} {row['us']:10.2f} us {row['GB/s']:8.0f} GB/s {row['pct_copy_bw']:6.1f}% "
              f"{row['TFLOP/s']:7.2f} TFLOP/s ({mode})")
        del launch
    if json_path:
        with open(json_path, "w") as f:
            json.dump({"copy_bandwidth": bw, "cases": results}, f, indent=1)
    return results


if __name__ == "__main__":
    from tests.kernels.bench_gdn_chunked import BENCH_CASES as CHUNKED_CASES
    from tests.kernels.bench_gdn_recurrent import BENCH_CASES as GDN_CASES

    run_cases(BENCH_CASES + GDN_CASES + CHUNKED_CASES, sys.argv[1] if len(sys.argv) > 1 else None)
