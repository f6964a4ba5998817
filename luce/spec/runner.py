"""SpecRunner: a small continuous-batching loop with speculation over the model API.

It is the executable specification of how an engine step carries speculation (and the
harness of the exactness matrix) until luce.engine takes the Speculator in: each step
admits arrived requests into free slots, drafts trees for decoding lanes in one batched
drafter call, packs `[prefill segments][AR rows][tree rows]` into one ForwardBatch, runs the
target once, samples prompt tails and AR rows at their absolute positions, accepts each
tree losslessly and commits its accepted path. Lanes without a draft decode as AR rows;
prefill in the same step does not stop the others from speculating.

Pages are static per slot (ctx plus the largest tree's scratch rows). Prompts are cut at
absolute multiples of 64 (DESIGN 5 rule 3) when they exceed the step's token budget.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from luce.engine.sampler import SamplingParams, sample_token
from luce.models.batch import SegmentSpec
from luce.models.dflash import features_from_captured
from luce.models.kv_cache import pages_needed
from luce.spec.batching import TreeSegment, build_spec_batch
from luce.spec.config import SpecConfig, make_drafter
from luce.spec.speculator import Speculator
from luce.spec.stats import SpecStats

PREFILL_ALIGN = 64


@dataclass
class RunRequest:
    rid: int
    prompt: list[int]
    params: SamplingParams
    seed: int
    arrival: int                       # first step it may be admitted at
    output: list[int] = field(default_factory=list)
    slot: int | None = None
    n_prefilled: int = 0
    done: bool = False
    stats: SpecStats = field(default_factory=SpecStats)

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.output


class SpecRunner:
    def __init__(self, model, spec: SpecConfig | None = None, drafter=None, max_slots: int = 5,
                 ctx: int = 512, token_budget: int = 256, eos_ids: Sequence[int] = (), draft_model=None):
        self.model, self.backend = model, model.backend
        self.spec = spec or SpecConfig()
        if self.spec.enabled and drafter is None:
            drafter = make_drafter(self.spec, model, max_slots, ctx, draft_model=draft_model)
        self.speculator = Speculator(self.spec, model, drafter) if self.spec.enabled else None
        scratch = self.speculator.max_nodes() if self.speculator else 1
        self.ctx, self.token_budget, self.eos_ids = ctx, token_budget, frozenset(eos_ids)
        self.pages_per_slot = pages_needed(ctx + scratch)
        self.state = model.new_state(max_pages=max_slots * self.pages_per_slot, max_slots=max_slots)
        self.free_slots = list(range(max_slots))
        self.requests: list[RunRequest] = []
        self.steps = 0
        self.feature_layers = self.speculator.feature_layers if self.speculator else ()

    def pages(self, slot: int) -> list[int]:
        return list(range(slot * self.pages_per_slot, (slot + 1) * self.pages_per_slot))

    def add(self, prompt: Sequence[int], params: SamplingParams | None = None, arrival: int = 0) -> int:
        params = params or SamplingParams()
        if not prompt or len(prompt) + params.max_tokens > self.ctx:
            raise ValueError(f"prompt of {len(prompt)} tokens plus {params.max_tokens} new ones must fit ctx {self.ctx}")
        rid = len(self.requests)
        self.requests.append(RunRequest(rid, list(prompt), params, params.seed if params.seed is not None else rid,
                                        arrival))
        return rid

    def run(self, max_steps: int = 10_000) -> list[list[int]]:
        while any(not r.done for r in self.requests):
            if self.steps >= max_steps:
                raise RuntimeError(f"SpecRunner: requests unfinished after {max_steps} steps")
            self.step()
        return [r.output for r in self.requests]

    # ---- one step ------------------------------------------------------------------------------
    def step(self) -> None:
        self._admit()
        live = [r for r in self.requests if r.slot is not None and not r.done]
        decoding = [r for r in live if r.n_prefilled == len(r.prompt)]
        trees = {}
        if self.speculator is not None and decoding:
            trees = self.speculator.draft_trees([(r.slot, r.tokens, self._depth_room(r)) for r in decoding])
        items, owners = [], []
        room = self.token_budget - len(decoding)
        for r in live:
            if r.n_prefilled < len(r.prompt) and room > 0:
                end = self._prefill_end(r, room)
                if end is not None:
                    items.append(SegmentSpec(r.slot, r.prompt[r.n_prefilled:end], r.n_prefilled, self.pages(r.slot),
                                             logits="last" if end == len(r.prompt) else "none"))
                    owners.append((r, "prefill"))
                    room -= end - r.n_prefilled
        for r in decoding:
            if r.slot not in trees:
                items.append(SegmentSpec(r.slot, [r.output[-1]], len(r.tokens) - 1, self.pages(r.slot)))
                owners.append((r, "ar"))
        for r in decoding:
            if r.slot in trees:
                items.append(TreeSegment(r.slot, trees[r.slot], len(r.tokens) - 1, self.pages(r.slot)))
                owners.append((r, "tree"))
        if not items:
            self.steps += 1
            return
        chains = self.speculator.chains_as_segments if self.speculator else False
        batch, first = build_spec_batch(items, self.feature_layers, chains_as_segments=chains)
        out = self.model.forward(batch, self.state)
        logits = np.asarray(self.backend.to_numpy(out.logits))
        feats = features_from_captured(out.captured, self.feature_layers, self.backend) if self.feature_layers else None
        feats = None if feats is None else np.asarray(self.backend.to_numpy(feats))
        if trees:
            self.speculator.stats.verify_steps += 1
        for s, ((r, kind), item, row) in enumerate(zip(owners, items, first)):
            r0, r1 = batch.segment_rows(s)
            if kind == "prefill":
                self._prefilled(r, item, logits, row, None if feats is None else feats[r0:r1])
            elif kind == "ar":
                if feats is not None:
                    self.speculator.add_features(r.slot, feats[r0:r1])
                self._emit(r, [self._sample(r, logits[row], len(r.tokens))])
            else:
                self._verify(r, item, logits[row:row + item.tree.n_nodes], None if feats is None else feats[r0:r1])
        self.steps += 1

    def _admit(self) -> None:
        for r in self.requests:
            if r.slot is None and not r.done and r.arrival <= self.steps and self.free_slots:
                r.slot = self.free_slots.pop(0)
                self.state.reset_slot(r.slot)
                if self.speculator is not None:
                    self.speculator.release(r.slot)

    def _prefill_end(self, r: RunRequest, room: int) -> int | None:
        if len(r.prompt) - r.n_prefilled <= room:
            return len(r.prompt)
        end = (r.n_prefilled + room) // PREFILL_ALIGN * PREFILL_ALIGN
        return end if end > r.n_prefilled else None

    def _depth_room(self, r: RunRequest) -> int:
        """Deepest useful draft: a verify emits at most depth + 1 tokens."""
        return max(0, min(r.params.max_tokens - len(r.output), self.ctx - len(r.tokens)) - 1)

    def _sample(self, r: RunRequest, row: np.ndarray, position: int) -> int:
        return sample_token(row, r.params, r.seed, position, r.prompt, r.output)

    def _prefilled(self, r: RunRequest, item: SegmentSpec, logits, row: int, feats) -> None:
        r.n_prefilled = item.start_pos + len(item.token_ids)
        if feats is not None:
            self.speculator.add_features(r.slot, feats)
        if r.n_prefilled == len(r.prompt):
            self._emit(r, [self._sample(r, logits[row], len(r.prompt))])

    def _verify(self, r: RunRequest, item: TreeSegment, logits, feats) -> None:
        acc = self.speculator.accept(item.tree, logits, r.params, r.seed, item.start, r.prompt, r.output,
                                     max_tokens=r.params.max_tokens - len(r.output), stop_ids=self._stops(r))
        self.speculator.commit(self.state, r.slot, item.pages, item.start, item.tree, acc, feats)
        r.stats.record(item.tree.n_nodes, acc.n_accepted, len(acc.tokens))
        self._emit(r, list(acc.tokens))

    def _stops(self, r: RunRequest) -> frozenset:
        return frozenset() if r.params.ignore_eos else self.eos_ids | frozenset(r.params.stop_token_ids)

    def _emit(self, r: RunRequest, tokens: list[int]) -> None:
        stops = self._stops(r)
        for t in tokens:
            r.output.append(int(t))
            if t in stops or len(r.output) >= r.params.max_tokens or len(r.tokens) >= self.ctx:
                self._finish(r)
                return

    def _finish(self, r: RunRequest) -> None:
        r.done = True
        if self.speculator is not None:
            self.speculator.release(r.slot)
            if self.state.recurrent is not None and hasattr(self.state.recurrent, "drop_tree"):
                self.state.recurrent.drop_tree(r.slot)
        self.free_slots.append(r.slot)
        self.free_slots.sort()
