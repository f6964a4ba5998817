"""Graph replay of a model's forward (DESIGN.md section 4) on backends that capture graphs.

`GraphedForward(model)(batch, state)` is `model.forward(batch, state)`. The graph key is the
batch's replay key (luce/models/packer.py: topology only, set by the one packer, padded by
the engine's StepBuilder) plus what fixes the launches besides the batch: the model, the
state and the kernel choices. Per step, every value (token ids, positions, the KV CSR, slots,
KV destinations, logits rows, tree parents) goes to the graph's metadata arena
(luce/ops/cuda_step_meta.py); mixed steps [prefill][AR][tree] replay like decode steps.

A key runs eagerly once (recording the constant uploads), is captured the next time and
replayed after that; the forward has no host side effects to repeat (what a tree commit
needs is in its output, at the graph's addresses). A forward that cannot be captured
(GraphUnsafe: a host fallback, an unexpected upload) keeps its key eager, and the counters
say why (luce.models.graph_cache). Graphs are dropped when the state object changes, and
the least recently used beyond `max_graphs`. Batches are validated once, here or in the
engine's preflight.
"""
from __future__ import annotations

from luce.models.batch import ForwardBatch, ensure_valid
from luce.models.graph_cache import GraphCache
from luce.ops import cuda_step_meta


class GraphedForward:
    """model.forward with graph replay; `counters` as luce.models.graph_cache.GraphCache's."""

    def __init__(self, model, enabled: bool = True, max_graphs: int = 64):
        self.model = model
        self.backend = model.backend
        self.enabled = bool(enabled) and bool(getattr(self.backend, "supports_graphs", False))
        self.cache = GraphCache(self.backend, max_graphs)
        self.counters = self.cache.counters
        self._state = None
        self._vocab = int(getattr(model.config, "vocab", 0)) or None
        self.last_ids = None      # [slots] int32 on the device: each slot's latest AR token (keep_ids_for)
        self.keep_every_segment = False

    @property
    def graphs(self):
        return self.cache.graphs

    @property
    def unsafe(self):
        return self.cache.unsafe

    @property
    def eager_reasons(self) -> dict[str, int]:
        return self.cache.eager_reasons

    def key(self, batch: ForwardBatch):
        """The graph key of `batch`, or None (eager) when it has no replay key."""
        if batch.replay_key is None:
            return None
        return (batch.replay_key, getattr(self.model, "gdn_tree_mode", None),
                getattr(self.backend, "tree_attention_kernel", None))

    def keep_ids_for(self, n_slots: int, every_segment: bool = False) -> None:
        """From now on the graph of every call with AR rows starts by feeding them from ids
        kept by slot on the device (backend.feed_ids from `last_ids`) and a greedy call keeps
        its AR rows' argmax there (backend.keep_ids; every_segment: the argmax of each live
        segment's last row, a draft model's chain), so a later call can be `fed` before the
        ids reach the host (luce.engine.ahead); a call not fed puts its host ids there first
        (backend.put_ids), so both replay one graph. Drops the graphs captured without it."""
        self.invalidate()
        self.last_ids = self.backend.ids_store(n_slots)
        self.keep_every_segment = bool(every_segment)

    def __call__(self, batch: ForwardBatch, state, greedy_ids: bool = False, fed: bool = False):
        """model.forward(batch, state). With greedy_ids, on a backend that captures graphs (or
        keeping ids: keep_ids_for), the output's greedy_ids also holds each logits row's
        argmax on the device (backend.argmax_ids inside the graph: no launch of its own per
        step; backend.ids_to_host brings the ids back). fed (keeping ids): the batch's AR
        rows take the ids kept by slot, not their token ids."""
        ensure_valid(batch, state.max_slots, self._vocab)
        feeds, keeps = self.last_ids is not None and batch.has_ar_rows, greedy_ids and self.last_ids is not None
        if fed and not feeds:
            raise ValueError("a fed call has AR rows and comes after keep_ids_for")
        if not self.enabled and not (feeds or keeps):
            return self.model.forward(batch, state)
        if feeds and not fed:
            self.backend.put_ids(batch, self.last_ids)

        def run():
            if feeds:
                self.backend.feed_ids(batch, self.last_ids, self._vocab)
            out = self.model.forward(batch, state)
            return self._with_ids(out, batch) if greedy_ids else out
        if not self.enabled:
            return run()
        if state is not self._state:
            self.invalidate()
            self._state = state
        key = self.key(batch)
        if key is not None:     # other graphs: the forward's launches and the argmax's (and the ids' links)
            key = (*key, *(("greedy ids",) if greedy_ids else ()), *(("fed",) if feeds else ()))
        return self.cache.call(key, run,
                               lambda allocator: cuda_step_meta.bind(self.backend, batch, allocator),
                               lambda meta: cuda_step_meta.rewrite(self.backend, meta, batch))

    def _with_ids(self, out, batch):
        if out.logits.shape[0]:
            out.greedy_ids = self.backend.argmax_ids(out.logits)
            if self.last_ids is not None:
                self.backend.keep_ids(out.greedy_ids, batch, self.last_ids, every_segment=self.keep_every_segment)
        return out

    def invalidate(self) -> None:
        """Drop every graph (the state, owner or topology they were captured over is gone)."""
        self.cache.invalidate()
