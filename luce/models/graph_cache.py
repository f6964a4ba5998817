"""Captured graphs by key, for any call that launches a fixed sequence per key (DESIGN.md
section 4): a model's forward (luce.models.graphed_forward) and a tree commit
(luce.models.commit).

The life of a key: its first call runs eagerly while the backend records the constant
uploads; its second call is captured (nothing runs during capture) and then launched; later
calls write their per-call host arrays into the graph's arena and launch it. A call the
backend cannot capture (luce.ops.cuda_graph.GraphUnsafe: a host synchronisation, a host
fallback, an upload that is neither arena nor constant) leaves its key eager for good; a
capture that ran out of device memory drops every graph of the cache (their pools go back)
and runs eagerly, the key left to be captured on its next call. `eager_reasons` counts every
eager call by why: 'first call of a key' (warm-up: a key never captured), 'graph dropped,
captured again next call' (its graph went: max_graphs or out of memory), 'no replay key',
'out of device memory', or the capture failure's reason. `warmups` counts the calls that
cost far more than a replay and happen once per key (its first eager call, its capture, a
failed capture, a dropped graph's or an out-of-memory eager call): a caller timing its steady
state leaves out the calls during which it grew. The eager calls of keys that never replay
('no replay key', 'cannot capture') are steady state.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Callable

COUNTERS = ("replays", "captures", "rebuilds", "eager_steps", "failures", "drops")
DROPPED = "graph dropped, captured again next call"   # a key met before whose graph went (max_graphs, memory)
FIRST_CALL = "first call of a key"
OUT_OF_MEMORY = "out of device memory"
WARMUP_REASONS = (FIRST_CALL, DROPPED, OUT_OF_MEMORY)   # eager calls a later call of the key replays


class GraphCache:
    """Graphs of one caller on one backend; `counters` count replays, captures, rebuilds
    (a key captured again after its graph was dropped), eager calls, capture failures and
    dropped graphs."""

    def __init__(self, backend, max_graphs: int = 64, max_warm: int = 256):
        self.backend = backend
        self.max_graphs = max_graphs
        self.max_warm = max_warm      # keys seen once and waiting for a second call (oldest forgotten)
        self.graphs: OrderedDict = OrderedDict()
        self.warm: OrderedDict = OrderedDict()   # key -> constants recorded by its eager call
        self.unsafe: dict = {}        # key -> why it cannot be captured
        self.ever_captured: set = set()
        self.counters = dict.fromkeys(COUNTERS, 0)
        self.eager_reasons: dict[str, int] = {}
        self.warmups = 0          # calls that warmed a graph up (WARMUP_REASONS, captures, failed ones)
        self.last_nodes = None    # NodeCounts of the latest captured graph (luce.ops.launch_count)

    def _eager(self, why: str) -> None:
        self.counters["eager_steps"] += 1
        self.eager_reasons[why] = self.eager_reasons.get(why, 0) + 1
        self.warmups += why in WARMUP_REASONS

    def call(self, key, run: Callable, bind: Callable, rewrite: Callable):
        """run() through the key's graph. bind(allocator) -> arena (uploaded into the graph's
        pool before capture); rewrite(arena) writes this call's arrays into it before a replay."""
        if key is None or key in self.unsafe:
            self._eager("no replay key" if key is None else f"cannot capture: {self.unsafe[key]}")
            return run()
        graph = self.graphs.get(key)
        if graph is not None:
            self.graphs.move_to_end(key)
            rewrite(graph.meta)
            graph.launch()
            self.counters["replays"] += 1
            return graph.output
        constants = self.warm.pop(key, None)
        if constants is None:
            return self._warm(key, run)
        return self._capture(key, constants, run, bind)

    def _warm(self, key, run):
        from luce.ops.cuda_graph import Constants

        constants = Constants()
        self.backend.record_constants(constants)
        try:
            out = run()
        finally:
            self.backend.record_constants(None)
        self.warm[key] = constants
        while len(self.warm) > self.max_warm:
            self.warm.popitem(last=False)
        self._eager(DROPPED if key in self.ever_captured else FIRST_CALL)
        return out

    def _capture(self, key, constants, run, bind):
        from luce.ops.cuda_graph import GraphUnsafe

        try:
            graph = self.backend.capture(constants, run, bind)
        except GraphUnsafe as exc:
            if isinstance(exc.__cause__, MemoryError):   # not the key's fault: room is made, it stays warm
                self.make_room()
                self.warm[key] = constants
                self._eager(OUT_OF_MEMORY)
                return run()
            self.unsafe[key] = str(exc)
            self.counters["failures"] += 1
            self.warmups += 1
            self._eager(f"cannot capture: {exc}")
            return run()
        self.counters["captures"] += 1
        self.warmups += 1
        if key in self.ever_captured:
            self.counters["rebuilds"] += 1
        self.ever_captured.add(key)
        self.graphs[key] = graph
        self.last_nodes = getattr(graph, "nodes", None)
        while len(self.graphs) > self.max_graphs:
            self.graphs.popitem(last=False)[1].drop()
            self.counters["drops"] += 1
        graph.launch()
        return graph.output

    def make_room(self) -> None:
        """Drop every graph (their pools go back to the backend's allocator, which returns
        them to the driver when it runs short)."""
        for graph in self.graphs.values():
            graph.drop()
            self.counters["drops"] += 1
        self.graphs.clear()

    def invalidate(self) -> None:
        """Drop every graph (the state, owner or topology they were captured over is gone)."""
        self.make_room()
        self.warm.clear()
        self.unsafe.clear()
