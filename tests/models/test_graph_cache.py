"""Graph replay bookkeeping without a GPU (luce.models.graph_cache, graphed_forward,
luce.ops.cuda_step_meta): the warm -> capture -> replay life of a key, refusal of keys
that cannot be captured, eviction and rebuild counters, the keys GraphedForward chooses,
page padding (the padded batch computes the same logits on the numpy backend), and the
metadata arena's layout. The device side (graphs really replayed) is
tests/models/test_graphed_forward_cuda.py."""
from __future__ import annotations

import numpy as np
import pytest

from luce.models.packer import SegmentSpec, build_batch
from luce.models.graph_cache import GraphCache
from luce.models.graphed_forward import GraphedForward
from luce.ops import cuda_step_meta


class FakeGraph:
    def __init__(self, output, meta):
        self.output, self.meta, self.launches, self.dropped = output, meta, 0, False
        self.extra = {}

    def launch(self):
        self.launches += 1

    def drop(self):
        self.dropped = True


class FakeBackend:
    """Records what a GraphCache asks of a capturing backend."""

    supports_graphs = True

    def __init__(self, unsafe: bool = False):
        self.recording, self.unsafe, self.captured = [], unsafe, []

    def record_constants(self, constants):
        self.recording.append(constants is not None)

    def capture(self, constants, run, bind):
        from luce.ops.cuda_graph import GraphUnsafe

        meta = bind("pool")
        if self.unsafe:
            raise GraphUnsafe("a host synchronisation")
        graph = FakeGraph(run(), meta)
        self.captured.append(graph)
        return graph


def test_a_key_runs_eager_then_is_captured_then_replayed():
    backend = FakeBackend()
    cache = GraphCache(backend)
    calls, rewrites = [], []

    def step(i):
        return cache.call("k", lambda: calls.append(i) or f"out{i}", lambda pool: ("arena", pool),
                          lambda meta: rewrites.append((meta, i)))

    assert step(0) == "out0" and backend.recording == [True, False]   # eager, constants recorded
    assert cache.warmups == 1
    assert step(1) == "out1" and backend.captured[0].launches == 1      # captured (run traced), launched
    assert cache.warmups == 2                                           # the key's two warm-up calls
    assert step(2) == "out1" and step(3) == "out1"                      # replays return the graph's output
    assert cache.warmups == 2
    assert calls == [0, 1] and rewrites == [(("arena", "pool"), 2), (("arena", "pool"), 3)]
    assert cache.counters == dict(replays=2, captures=1, rebuilds=0, eager_steps=1, failures=0, drops=0)
    assert cache.eager_reasons == {"first call of a key": 1}


def test_a_key_that_cannot_be_captured_stays_eager():
    cache = GraphCache(FakeBackend(unsafe=True))
    outs = [cache.call("k", lambda i=i: i, lambda pool: None, lambda meta: None) for i in range(4)]
    assert outs == [0, 1, 2, 3]
    assert cache.counters["failures"] == 1 and cache.counters["replays"] == 0
    assert cache.counters["eager_steps"] == 4 and "host synchronisation" in cache.unsafe["k"]
    assert cache.eager_reasons == {"first call of a key": 1, "cannot capture: a host synchronisation": 3}
    cache.call(None, lambda: 0, lambda pool: None, lambda meta: None)
    assert cache.eager_reasons["no replay key"] == 1
    assert cache.warmups == 2       # the first call and the failed capture; eager for good after: steady


def test_eviction_drops_graphs_and_a_recaptured_key_counts_as_rebuild():
    backend = FakeBackend()
    cache = GraphCache(backend, max_graphs=1)
    for key in ("a", "a", "b", "b", "a", "a"):
        cache.call(key, lambda: key, lambda pool: None, lambda meta: None)
    assert backend.captured[0].dropped and cache.counters["drops"] == 2
    assert cache.counters["captures"] == 3 and cache.counters["rebuilds"] == 1
    # the eager call before the rebuild is not a new key: the counters say the graph was dropped
    assert cache.eager_reasons == {"first call of a key": 2, "graph dropped, captured again next call": 1}
    assert cache.warmups == 6       # every call here warmed a graph up: none replayed
    cache.invalidate()
    assert not cache.graphs and backend.captured[-1].dropped


def _decode_batch(slots, step, tokens=(5, 6, 7, 8)):
    return build_batch([SegmentSpec(slot, [tokens[i]], 20 + step, list(range(slot * 8, slot * 8 + 8)))
                        for i, slot in enumerate(slots)])


class _Model:
    backend = FakeBackend()
    config = type("Config", (), {"vocab": 100})


def test_graph_keys_fix_topology_and_leave_values_to_the_arena():
    """The key is the batch's replay key (topology): tokens, positions and slots are arena
    values; prompt chunks have keys like decode rows (mixed steps replay too)."""
    fwd = GraphedForward(_Model())
    key = lambda b: fwd.key(b)  # noqa: E731
    assert key(_decode_batch([0, 2], 0)) == key(_decode_batch([0, 2], 5, tokens=(9, 3)))   # new tokens, positions
    assert key(_decode_batch([0, 2], 0)) == key(_decode_batch([0, 1], 0))                  # other slots
    assert key(_decode_batch([0, 2], 0)) != key(_decode_batch([0], 0))                     # other topology
    prefill = build_batch([SegmentSpec(0, [1, 2, 3], 0, [0])])
    assert key(prefill) is not None and key(prefill) != key(_decode_batch([0], 0))


def test_padded_pages_give_the_same_logits(tmp_path):
    """A trailing padding segment carrying the bucket's extra pages changes nothing."""
    from luce.models import load_model
    from luce.testing.tiny_models import make_qwen35

    make_qwen35(tmp_path / "q35.gguf", seed=3)
    model = load_model(tmp_path / "q35.gguf", "cpu")
    prompt = [int(t) for t in np.random.default_rng(0).integers(3, 200, 40)]
    batch = build_batch([SegmentSpec(1, prompt, 0, [5, 6, 7])])           # 40 rows: 3 pages
    padded = build_batch([SegmentSpec(1, prompt, 0, [5, 6, 7])], pad_pages=True)
    assert len(padded.kv_indices) == 4 and padded.seq_slots.tolist() == [1, -1]
    padded.validate()
    logits = [model.forward(b, model.new_state(max_pages=8, max_slots=2)).logits for b in (batch, padded)]
    np.testing.assert_array_equal(logits[0], logits[1])


def test_arena_layout_is_fixed_by_the_key():
    a, b = _decode_batch([0, 2], 0), _decode_batch([0, 2], 3, tokens=(11, 12))
    buf_a, layout_a = cuda_step_meta.pack(cuda_step_meta.step_arrays(a))
    buf_b, layout_b = cuda_step_meta.pack(cuda_step_meta.step_arrays(b))
    assert layout_a == layout_b and buf_a.shape == buf_b.shape and not np.array_equal(buf_a, buf_b)
    arrays = cuda_step_meta.step_arrays(a)
    pages, offsets, _ = a.row_kv_locations()
    np.testing.assert_array_equal(arrays["kv_dst"], pages * 16 + offsets)
    offset, dtype, shape = layout_a["token_ids"]
    np.testing.assert_array_equal(buf_a[offset:offset + 8].view(np.int32), [5, 6])


def test_mirrors_resolve_batch_arrays_and_their_views():
    from luce.ops.cuda_array import CudaArray

    class Block:
        ptr = 4096

    device = CudaArray(Block(), 4096, (6,), np.int32, backend=None)
    host = np.arange(6, dtype=np.int64)
    mirrors = cuda_step_meta.Mirrors()
    mirrors.add(host, device)
    assert mirrors.find(host).ptr == 4096
    view = mirrors.find(host[2:5])
    assert view.ptr == 4096 + 2 * 4 and view.shape == (3,) and view.dtype == np.int32
    assert mirrors.find(host.copy()) is None and mirrors.find([1, 2]) is None


@pytest.mark.parametrize("argv,eager", [([], False), (["--enforce-eager"], True)])
def test_serve_flag_enforce_eager(argv, eager):
    from luce.server.serve_cli import build_parser

    assert build_parser().parse_args(["model.gguf", *argv]).enforce_eager is eager


def test_graph_counters_render_in_metrics():
    from luce.server.bridge import EngineStats
    from luce.server.metrics import ServerMetrics

    graphs = {"replays": 7, "captures": 2, "rebuilds": 1, "eager_steps": 5,
              "eager_reasons": {"first call of a key": 2, "cannot capture: a host synchronisation": 3}}
    text = ServerMetrics().render(EngineStats(graphs=graphs), 0)
    for line in ("luce_graph_replays_total 7", "luce_graph_captures_total 2", "luce_graph_rebuilds_total 1",
                 "luce_graph_failures_total 0", 'luce_graph_eager_total{reason="first call of a key"} 2',
                 'luce_graph_eager_total{reason="cannot capture: a host synchronisation"} 3'):
        assert line in text


def test_a_capture_out_of_device_memory_drops_the_graphs_and_the_key_is_captured_later():
    """An allocation that fails during a capture is no property of the key: every graph of the
    cache is dropped (their pools return to the allocator), the call runs eagerly, and the key
    is captured on its next call (the per-node-state ddtree's graphs hold gigabytes each)."""
    from luce.ops.cuda_graph import GraphUnsafe
    from luce.ops.cuda_memory import OutOfDeviceMemory

    class ShortOfMemory(FakeBackend):
        def __init__(self):
            super().__init__()
            self.fail_next = False

        def capture(self, constants, run, bind):
            if self.fail_next:
                self.fail_next = False
                raise GraphUnsafe("capture failed: out of memory") from OutOfDeviceMemory("cudaMalloc")
            return super().capture(constants, run, bind)

    backend = ShortOfMemory()
    cache = GraphCache(backend)
    call = lambda key, i: cache.call(key, lambda: f"{key}{i}", lambda pool: None, lambda meta: None)  # noqa: E731
    call("a", 0), call("a", 1)                       # a: warm, captured
    call("b", 0)
    backend.fail_next = True
    assert call("b", 1) == "b1"                      # its capture ran out of memory: eager
    assert backend.captured[0].dropped and not cache.graphs and "b" not in cache.unsafe
    assert cache.eager_reasons["out of device memory"] == 1
    assert call("b", 2) == "b2" and call("b", 3) == "b2"   # captured now, then replayed
    assert cache.counters["failures"] == 0 and cache.counters["drops"] == 1


def test_a_replay_packs_the_bytes_the_arena_was_laid_out_with():
    """cuda_step_meta.rewrite packs a step's values (ForwardBatch.step_values) with the
    arena's struct: the bytes are pack(step_arrays) of that step, padding included; a step
    whose values do not fit the layout is refused."""
    a, b = _decode_batch([0, 2], 0), _decode_batch([0, 2], 3, tokens=(11, 12))
    buf_a, layout = cuda_step_meta.pack(cuda_step_meta.step_arrays(a))

    class Device:
        shape, ptr, backend = buf_a.shape, 4096, None

    class Staging:
        def upload(self, ptr, host):
            self.got = (ptr, host.tobytes())

    backend = type("Backend", (), {"staging": Staging()})()
    meta = cuda_step_meta.StepMeta(Device(), layout, a.kv_span, True)
    cuda_step_meta.rewrite(backend, meta, b)
    assert backend.staging.got == (4096, cuda_step_meta.pack(cuda_step_meta.step_arrays(b))[0].tobytes())
    assert b.__dict__["_cuda_step_meta"] is meta
    with pytest.raises(ValueError, match="does not fit"):
        cuda_step_meta.rewrite(backend, meta, _decode_batch([0, 1, 2], 0))
