"""The engine's side of speculative decoding (DESIGN.md sections 2 and 3): which decoding
lanes carry a draft tree this step, how each verified tree is accepted, and what reaches the
drafter at commit.

Per step, after the scheduler has placed every decoding lane as an AR row and the prompt
chunks: lanes are upgraded to trees, in order, while the token budget still holds a whole
tree (prefill never waits for speculation; a lane that does not fit, whose draft is empty,
or that is too close to its token or context limit stays an AR row). One batched drafter
call serves every upgraded lane. After the forward pass each tree is accepted losslessly
and purely (greedy: the longest path equal to the target argmax; sampled: the engine's own
draws at absolute positions, luce.engine.sampler); the transaction then commits exactly the
accepted root paths (luce.engine.txn) and hands the committed rows' target features to the
drafter (`promote_features`, device arrays throughout). How deep the lanes draft is the
depth policy's choice (luce.spec.depth): measured draft and step times, per-lane acceptance.
The engine brackets each step with `begin_step` and `end_step`: the whole step's time, less
its drafting, is what its rows cost.
"""
from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np

from luce.engine.constraint import Walk
from luce.engine.sampler import sample_token
from luce.engine.step import Cohort, StepBatch, TreeChunk
from luce.spec.acceptance import Acceptance, accept, accept_greedy
from luce.spec.depth import DepthPolicy
from luce.spec.speculator import Speculator
from luce.spec.stats import SpecStats


def accept_sampled(tree, logits, params, seed: int, root_position: int, prompt_ids=(), output_ids=(),
                   max_tokens: int | None = None, constraint=None) -> Acceptance:
    """Acceptance with the engine sampler (penalties, bias, grammar, seeded draws): at node i
    the target's token is sample_token at position root_position + depth[i] + 1 over the
    tokens emitted so far, with the grammar (constraint, in the committed state) advanced
    along the path to node i and rolled back after. logits: [N, V] rows of the tree's nodes
    (anything indexable by node giving a host [V] row; only visited rows are read)."""
    base = list(output_ids)
    with Walk(constraint) as walk:
        def choose(node: int, emitted) -> int:
            position = root_position + int(tree.depths[node]) + 1
            return sample_token(np.asarray(logits[node], np.float32), params, seed, position, prompt_ids,
                                base + list(emitted), walk.at(emitted))

        return accept(tree, choose, max_tokens)


REST_TIMING = 16     # at rest (plain decoding best, no try due), one step in this many is timed


class EngineSpeculation:
    def __init__(self, speculator: Speculator, token_budget: int, ctx: int, during_prefill: bool = True,
                 clock: Callable[[], float] = time.perf_counter, warmups: Callable[[], int] = lambda: 0):
        """during_prefill False: no lane speculates in a step that prefills a prompt. clock:
        seconds (tests inject one); warmups: the engine's graph warm-up calls so far (a key's
        first, eager call or its capture: luce.models.graph_cache.GraphCache.warmups), whose
        time is not what a depth costs in steady state."""
        self.speculator = speculator
        self.during_prefill = during_prefill
        self.token_budget = token_budget
        self.ctx = ctx
        self.clock, self.warmups = clock, warmups
        self.max_nodes = speculator.max_nodes()
        self.trees: dict[int, Any] = {}        # slot -> DraftTree of the step being run
        draft_min = speculator.config.draft_min
        # draft_min None: a fixed depth; else [draft_min, max] and plain decoding (no short drafts)
        self.policy = DepthPolicy(speculator.max_depth,
                                  speculator.max_depth if draft_min is None else min(draft_min, speculator.max_depth),
                                  plain=draft_min is not None)
        self._began: tuple[float, int] | None = None   # (clock, warm-ups) when the step began
        self._draft = (0.0, 0)                 # this step's drafting: (seconds, warm-ups)
        self._drafted: set[int] = set()        # slots that drafted in the previous step
        self.depths: dict[int, int] = {}        # depth -> steps that chose it (0: plain), of the steps
                                                # with lanes that could draft (resting: with decode rows)
        self.draft_seconds = 0.0               # drafting so far (draft calls and prompt prefills), for reports
        self._rest_steps = 0

    @property
    def stats(self) -> SpecStats:
        return self.speculator.stats

    @property
    def feature_layers(self) -> tuple[int, ...]:
        return self.speculator.feature_layers

    def reserve_tokens(self) -> int:
        """KV rows a request needs beyond its own tokens (a tree's rows are written past the
        committed length before acceptance)."""
        return self.max_nodes

    # ---- before the forward pass ------------------------------------------------------------
    def begin_step(self) -> None:
        """The engine starts a step (before admission and scheduling): its timing starts (at
        rest, one step in REST_TIMING: plain decoding's time is known, and a step's host work
        is the one cost speculation at rest adds)."""
        self._draft = (0.0, 0)
        self._rest_steps += 1
        if self.policy.at_rest() and not self.policy.probing_plain and self._rest_steps % REST_TIMING:
            self._began = None
            return
        self._began = (self.clock(), self.warmups())

    def propose(self, cohort: Cohort, requests: dict) -> Cohort:
        """`cohort` with the lanes that speculate this step turned from AR rows into trees."""
        self.trees = {}
        previous, self._drafted = self._drafted, set()
        if cohort.prefill and not self.during_prefill:
            return cohort
        if cohort.decode and self.policy.adaptive and self.policy.resting():
            self.depths[0] = self.depths.get(0, 0) + 1
            return cohort
        room = self.token_budget - cohort.n_rows
        lanes = []
        for row in cohort.decode:
            if room < self.max_nodes - 1:
                break
            r = requests[row.request_id]
            depth = min(r.params.max_tokens - len(r.output_ids), self.ctx - r.n_tokens) - 1
            if depth < 1 or row.position + self.max_nodes > self.ctx:
                continue
            lanes.append((row.slot, r, depth))
            room -= self.max_nodes - 1
        depth = self.policy.choose([s for s, _, _ in lanes], max((d for _, _, d in lanes), default=0),
                                   ar_rows=len(cohort.decode) - len(lanes))
        if lanes:
            self.depths[depth] = self.depths.get(depth, 0) + 1
        if not lanes or depth == 0:
            return cohort
        t0, w0 = self.clock(), self.warmups()
        self.trees = self.speculator.draft_trees([(s, [*r.prompt_ids, *r.output_ids], min(d, depth))
                                                  for s, r, d in lanes])
        self._draft = (self.clock() - t0, self.warmups() - w0)
        # Timed only when every lane drafted in the previous step too: a draft model then feeds
        # one or two rows per lane. After plain steps (or a lane's first draft) it catches up on
        # every token since, a switching cost that must not pass for the cost of this depth
        # (but is what a try from plain decoding costs, graph warm-ups of catch-ups of new
        # lengths included); nor may a draft pass's graph warm-up (its key's first, eager call,
        # or its capture), which is what a try of a shape never drafted pays.
        self._drafted = {s for s, _, _ in lanes}
        self.draft_seconds += self._draft[0]
        if not self._drafted <= previous:
            self.policy.record_switch(self._draft[0])
        elif not self._draft[1]:
            self.policy.record_draft(depth, self._draft[0], lanes=len(lanes))
        else:
            self.policy.record_warmup(self._draft[0])
        decode, trees = [], []
        for row in cohort.decode:
            tree = self.trees.get(row.slot)
            if tree is None:
                decode.append(row)
            else:
                trees.append(TreeChunk(row.slot, row.request_id, tuple(int(t) for t in tree.tokens),
                                       tuple(int(p) for p in tree.parents), row.position))
        return Cohort(cohort.prefill, decode, trees)

    def rests(self) -> bool:
        """Does the next step decode plainly with nothing to weigh (the depth policy settled on
        plain decoding, no try due; counted as propose counts it)? Such a step may be launched
        before the last one's tokens reach the host (luce.engine.ahead)."""
        if not (self.policy.adaptive and self.policy.resting()):
            return False
        self._drafted = set()
        self.depths[0] = self.depths.get(0, 0) + 1
        return True

    # ---- after the forward pass (pure) --------------------------------------------------------
    def accept(self, step: StepBatch, logits, choice, request_of: Callable[[int], Any]) -> dict[int, Acceptance]:
        """Accept every tree of the step: slot -> Acceptance. logits [L, V] host rows of the
        step (a tree's rows are consecutive, node order), or None when choice [L] (the
        target's token at every row, drawn on the backend) is given instead."""
        rows: dict[int, list[int]] = {}
        for i, slot in enumerate(step.logits_slot.tolist()):
            if slot in self.trees:
                rows.setdefault(slot, []).append(i)
        out = {}
        for chunk in step.cohort.tree:
            r, tree, mine = request_of(chunk.slot), self.trees[chunk.slot], rows[chunk.slot]
            max_tokens = r.params.max_tokens - len(r.output_ids)
            if choice is not None:
                out[chunk.slot] = accept_greedy(tree, np.asarray(choice)[mine], max_tokens)
                continue
            out[chunk.slot] = accept_sampled(tree, logits[mine], r.params, r.seed, chunk.start, r.prompt_ids,
                                             r.output_ids, max_tokens, r.constraint)
        return out

    # ---- at commit ----------------------------------------------------------------------------
    def check_features(self, segments) -> None:
        """ValueError (nothing changed) unless the drafter can take these committed rows."""
        self.speculator.check_context(segments)

    def promote_features(self, output, rows, segments) -> None:
        """The committed rows' target features (ForwardOutput.captured) to the drafter."""
        self.speculator.add_context(output.captured, np.asarray(rows, dtype=np.int64), segments)

    def record(self, step: StepBatch, accepted: dict[int, Acceptance], request_of: Callable[[int], Any]) -> None:
        """After every committed step: statistics of its trees and the lanes' acceptance;
        prompts completed this step go to the drafter (a draft model prefills them now)."""
        if self.policy.drafting:       # else a lane's first draft catches up on its whole sequence
            t0 = self.clock()
            self.speculator.prefill([(c.slot, request_of(c.slot).prompt_ids) for c in step.cohort.prefill
                                     if c.completes_prompt])
            self.draft_seconds += self.clock() - t0
        for chunk in step.cohort.tree:
            acc, tree = accepted[chunk.slot], self.trees[chunk.slot]
            self.speculator.record(tree, acc.n_accepted, len(acc.tokens))
            self.policy.record_verify(chunk.slot, tree.max_depth, acc.n_accepted)
        if step.cohort.tree:
            self.stats.verify_steps += 1

    def end_step(self, step: StepBatch, steady: bool = True) -> None:
        """The step's outputs are out: its time from begin_step, less the drafting, to the depth
        policy: all the per-step work (scheduling, building, forward, acceptance, commit,
        outputs) is paid by plain and speculating steps alike. Decode steps only (a prompt
        chunk's cost is not a verify's), and not a step that ran a graph's warm-up (its time is
        the policy's warm-up cost instead), nor one that is not `steady`: a step that launched
        the next one ahead but was not launched ahead itself (the switch into steps ahead, not
        what a plain step costs)."""
        if self._began is None or not steady:
            self._began = None
            return
        (t0, w0), self._began = self._began, None
        if step.cohort.prefill:
            return
        seconds = self.clock() - t0 - self._draft[0]
        if self.warmups() - w0 == self._draft[1]:
            self.policy.record_step(step.cohort.n_rows, seconds)
        else:
            self.policy.record_warmup(seconds)

    def forget(self, slot: int) -> None:
        """The slot's sequence ended or was reset: drop the drafter's leftovers."""
        self.speculator.release(slot)
        self.policy.forget(slot)
        self._drafted.discard(slot)


def drafter_chain(drafter) -> list:
    """The drafter and the ones it wraps (benchmark drafters wrap a real one), if any."""
    out = []
    while drafter is not None:
        out.append(drafter)
        drafter = getattr(drafter, "inner", None)
    return out


def draft_models(drafter) -> list:
    """The draft models the drafter chain runs (a DFlash draft, a draft model)."""
    return [m for d in drafter_chain(drafter) for m in (getattr(d, "model", None), getattr(d, "draft", None))
            if m is not None]
