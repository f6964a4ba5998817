"""Engine: continuous batching over one model (DESIGN.md section 2).

    engine = Engine(model, tokenizer, EngineConfig(max_slots=5, ctx=4096))
    rid = engine.add_request(prompt_ids, SamplingParams(max_tokens=32))
    while engine.has_unfinished():
        engine.step()
    out = engine.take_output(rid)          # RequestOutput

One step: admit queued requests into free slots (state re-initialised), schedule the cohort
(AR rows for decoding requests, prompt chunks under the token budget), with speculation on
(`EngineConfig.spec`) turn the decoding lanes that fit into draft trees
(luce.engine.speculation), build the StepBatch, preflight it, run the model, sample on the
host (the token at absolute position n uses the draw (seed, n)) or accept each tree, commit
(trees: their accepted paths only), then hand the tokens to their requests and retire
finished ones. Greedy or seeded, the tokens are the same with speculation on or off.
A failure from the model onward (after it may have written durable state) retires exactly
that step's cohort, each request finishing with reason 'error'; everything else goes on.
Cancellation between steps frees the slot and its pages and touches nothing else.
The engine never imports a backend: it uses the model's (`model.backend.to_numpy`).
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Sequence

from luce.engine.pages import PagePool, PoolExhausted
from luce.engine.request import DECODE, FINISHED, PREFILL, FinishReason, Request, RequestOutput
from luce.engine.rng import MASK64, splitmix64
from luce.engine.sampler import SamplingParams, backend_can_draw, sample_token
from luce.engine.scheduler import PREFILL_ALIGN, Scheduler
from luce.engine.slots import SlotManager
from luce.engine.state_slots import StateSlots
from luce.engine.step import ROW_TREE, Cohort, StepBatch, StepBuilder
from luce.engine.txn import Reject, Transaction
from luce.models.graphed_forward import GraphedForward
from luce.models.kv_cache import pages_needed
from luce.spec.config import SpecConfig


@dataclass(frozen=True)
class EngineConfig:
    max_slots: int = 5            # requests decoding together
    ctx: int = 4096               # tokens per sequence (prompt + output)
    token_budget: int = 512       # live rows per step (AR rows + prompt chunks)
    kv_pages: int | None = None   # KV pages in the pool; default max_slots * pages(ctx)
    max_queue: int = 1024         # requests waiting for a slot before add_request refuses
    max_snapshots: int = 0        # snapshot table entries (prefix cache, rollback)
    pad_steps: bool = True        # pad shapes to replay-key buckets
    capture_state: bool = False   # keep the cohort's recurrent state per step so abort restores it
    cuda_graphs: bool = True      # replay captured graphs for decode / verify steps (backends that can)
    seed: int = 0                 # requests without a seed get one drawn from (seed, submission number)
    spec: SpecConfig | None = None  # speculative decoding (None or spec='off': plain decoding)

    def __post_init__(self):
        for name in ("max_slots", "ctx", "token_budget"):
            if getattr(self, name) < 1:
                raise ValueError(f"EngineConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.kv_pages is not None and self.kv_pages < 1:
            raise ValueError(f"EngineConfig.kv_pages must be >= 1, got {self.kv_pages}")

    @property
    def n_pages(self) -> int:
        return self.kv_pages if self.kv_pages is not None else self.max_slots * pages_needed(self.ctx)


@dataclass(frozen=True)
class StepUpdate:
    """What one step did for one request."""

    request_id: Any
    token_ids: tuple[int, ...] = ()   # tokens sampled this step (none mid-prefill)
    finish_reason: str | None = None  # set when the request finished this step
    error: str | None = None


@dataclass
class EngineStats:
    steps: int = 0                # steps that ran the model
    prompt_tokens: int = 0        # prompt tokens prefilled
    generated_tokens: int = 0
    live_rows: int = 0            # rows of real work over all steps
    padded_rows: int = 0          # rows added by shape padding
    finished: int = 0
    cancelled: int = 0
    failed: int = 0
    failed_steps: int = 0
    tree_rows: int = 0            # rows of draft trees verified
    replay_keys: set = field(default_factory=set)


class Engine:
    def __init__(self, model, tokenizer=None, config: EngineConfig | None = None, *, drafter=None,
                 draft_model=None, **overrides):
        """model: a luce.models.batch.Model; tokenizer (luce.tokenizer.Tokenizer) enables text,
        stop strings and end-of-generation tokens. Keyword overrides replace config fields.
        With config.spec enabled, `drafter` (luce.spec.drafters) replaces the one the config
        names and `draft_model` is an already loaded draft model (else config.spec.draft is
        loaded on the model's backend)."""
        self.config = config = replace(config or EngineConfig(), **overrides)
        self.model = model
        self.forward = GraphedForward(model, enabled=config.cuda_graphs)   # model.forward, graphed on GPUs
        self.spec = self._speculation(config, drafter, draft_model)
        self.tokenizer = tokenizer
        self.vocab = int(model.config.vocab)
        self.model_state = model.new_state(config.n_pages, config.max_slots)
        self.pool = PagePool(config.n_pages)
        self.states = StateSlots(self.model_state, config.max_snapshots)
        self.slots = SlotManager(self.pool, self.states, config.max_queue)
        self.txn = Transaction(self.slots, config.ctx)
        self.builder = StepBuilder(self.pool, pad=config.pad_steps)
        self.scheduler = Scheduler(config.token_budget, config.max_slots, PREFILL_ALIGN)
        self.requests: dict[Any, Request] = {}
        self.stats = EngineStats()
        self.fault_hook: Callable[[str, StepBatch], None] | None = None  # tests: raise to inject
        self._eos = tokenizer.eot_ids if tokenizer is not None else frozenset()
        self._numbers = itertools.count()

    # ---- requests -------------------------------------------------------------------------
    def add_request(self, prompt_ids: Sequence[int], params: SamplingParams | None = None,
                    request_id=None, prompt_text: str | None = None) -> Any:
        """Queue a request; returns its id. Raises ValueError for a bad prompt or one that
        can never fit, QueueFull when the queue is at capacity (nothing changes then)."""
        params = params if params is not None else SamplingParams()
        if not isinstance(params, SamplingParams):
            raise TypeError(f"params must be a SamplingParams, got {type(params).__name__}")
        prompt = [int(t) for t in prompt_ids]
        if not prompt:
            raise ValueError("a prompt needs at least one token")
        if not all(0 <= t < self.vocab for t in prompt):
            raise ValueError(f"prompt token ids must lie in [0, {self.vocab})")
        if len(prompt) >= self.config.ctx:
            raise ValueError(f"prompt of {len(prompt)} tokens leaves no room in the context of "
                             f"{self.config.ctx} tokens: shorten it or raise ctx")
        number = next(self._numbers)
        request_id = number if request_id is None else request_id
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        seed = params.seed if params.seed is not None else splitmix64((self.config.seed & MASK64) ^ splitmix64(number))
        extra = self.spec.reserve_tokens() if self.spec is not None else 0
        reserve = pages_needed(min(self.config.ctx, len(prompt) + params.max_tokens + extra))
        self.slots.submit(request_id, reserve)
        self.requests[request_id] = Request(request_id, prompt, params, seed, tokenizer=self.tokenizer,
                                            eos_ids=self._eos, ctx=self.config.ctx,
                                            prompt_text=prompt_text, order=number)
        return request_id

    def cancel(self, request_id) -> bool:
        """Stop a queued or running request (finish reason 'cancelled'); False if unknown or done."""
        request = self.requests.get(request_id)
        if request is None or request.finished:
            return False
        slot = self.slots.slot_of(request_id)
        self.slots.cancel(request_id)
        if slot is not None and self.spec is not None:
            self.spec.forget(slot, self.model_state)
        request.finish(FinishReason.CANCELLED)
        self.stats.cancelled += 1
        return True

    def has_unfinished(self) -> bool:
        return any(not r.finished for r in self.requests.values())

    def get(self, request_id) -> Request:
        return self.requests[request_id]

    def take_output(self, request_id) -> RequestOutput:
        """The output of a finished request, which the engine then forgets."""
        request = self.requests[request_id]
        if not request.finished:
            raise RuntimeError(f"request {request_id!r} has not finished")
        del self.requests[request_id]
        return request.output()

    # ---- one step ---------------------------------------------------------------------------
    def step(self) -> list[StepUpdate]:
        """Run one engine step; one update per request that advanced or finished."""
        for request_id, slot in self.slots.admit_all():
            request = self.requests[request_id]
            request.slot, request.phase = slot, PREFILL
            request.metrics["admitted_step"] = self.stats.steps
            if self.spec is not None:
                self.spec.forget(slot, self.model_state)
        running = [r for r in self.requests.values() if r.phase in (PREFILL, DECODE)]
        cohort = self.scheduler.schedule(running)
        if not cohort:
            return []
        try:
            if self.spec is not None:
                cohort = self.spec.upgrade(cohort, self.requests)
            layers = self.spec.feature_layers if self.spec is not None else ()
            step = self.builder.build(cohort, capture_layers=layers)
        except (PoolExhausted, ValueError) as e:
            return self._fail(cohort, f"the step could not be built: {e}")
        plan = self.txn.preflight(step, capture_state=self.config.capture_state)
        if isinstance(plan, Reject):
            return self._fail(cohort, f"preflight rejected the step: {plan.reason}")
        try:
            self._hook("before_forward", step)
            out = self.forward(step.forward, self.model_state)
            self._hook("after_forward", step)
            logits, choice = self._logits(step, out.logits)
            tokens = self._sample(step, logits, choice)
            kept = self._verify(step, logits, choice, out, tokens)
        except Exception as e:  # noqa: BLE001 - any runtime failure retires the cohort
            self.txn.abort(plan)
            return self._fail(cohort, f"{type(e).__name__}: {e}")
        self.txn.commit(plan, accepted=kept)
        self._record(step)
        return self._apply(step, tokens)

    def _speculation(self, config: EngineConfig, drafter, draft_model):
        if config.spec is None or not config.spec.enabled:
            return None
        from luce.engine.speculation import EngineSpeculation
        from luce.spec.config import make_drafter
        from luce.spec.speculator import Speculator

        if drafter is None:
            drafter = make_drafter(config.spec, self.model, config.max_slots, config.ctx, draft_model=draft_model)
        return EngineSpeculation(Speculator(config.spec, self.model, drafter, graphs=config.cuda_graphs),
                                 config.token_budget, config.ctx)

    def _verify(self, step: StepBatch, logits, choice, out, tokens: dict) -> dict[int, int]:
        """Speculation after the forward pass: accept every tree (its tokens join `tokens`),
        commit the accepted paths into the model state, keep the drafter's features.
        Returns tree slot -> rows kept, for the transaction."""
        if self.spec is None:
            return {}
        features = None
        if self.spec.feature_layers:
            from luce.models.dflash import features_from_captured

            backend = self.model.backend
            features = backend.to_numpy(features_from_captured(out.captured, self.spec.feature_layers, backend))
        self.spec.add_features(step, features)
        if not step.cohort.tree:
            return {}
        accepted = self.spec.verify(step, logits, choice, self._request_in)
        kept = self.spec.commit(step, accepted, self.model_state, self.pool, features)
        self.spec.stats.verify_steps += 1
        for chunk in step.cohort.tree:
            r, acc = self._request_in(chunk.slot), accepted[chunk.slot]
            tokens[r.request_id] = list(acc.tokens)
            m = r.metrics
            m["spec_verifies"] = m.get("spec_verifies", 0) + 1
            m["spec_drafted"] = m.get("spec_drafted", 0) + len(chunk.token_ids) - 1
            m["spec_accepted"] = m.get("spec_accepted", 0) + acc.n_accepted
        return kept

    def _hook(self, point: str, step: StepBatch) -> None:
        if self.fault_hook is not None:
            self.fault_hook(point, step)

    def _request_in(self, slot: int) -> Request:
        return self.requests[self.slots.table[slot].request_id]

    def _logits(self, step: StepBatch, logits) -> tuple[Any, Any]:
        """(host logits [L, V], None), or (None, choice [L]): the target's token for every
        logits row, drawn on the backend (argmax when all are greedy; the seeded sampler at
        each row's position when no request has penalties and the backend samples its
        top-k), so only token ids leave the device. Same tokens either way."""
        if logits.shape[0] != len(step.logits_slot):
            raise RuntimeError(f"the model returned {logits.shape[0]} logits rows, the step asked for "
                               f"{len(step.logits_slot)}")
        backend = self.model.backend
        requests = [self._request_in(slot) for slot in step.logits_slot.tolist()]
        if all(r.params.greedy and not r.params.has_penalties for r in requests):
            return None, backend.argmax(logits)
        if hasattr(backend, "sample") and all(backend_can_draw(r.params) for r in requests):
            p = [r.params for r in requests]
            return None, backend.sample(logits, [x.temperature for x in p], [max(x.top_k, 1) for x in p],
                                        [x.top_p for x in p], [x.min_p for x in p],
                                        [r.seed & MASK64 for r in requests], step.logits_position)
        return backend.to_numpy(logits), None

    def _sample(self, step: StepBatch, logits, choice) -> dict[Any, list[int]]:
        """request id -> [the token] of each prompt-tail or AR logits row (tree rows are
        accepted by _verify)."""
        tokens = {}
        for i, slot in enumerate(step.logits_slot.tolist()):
            if step.logits_kind[i] == ROW_TREE:
                continue
            r = self._request_in(slot)
            if choice is not None:
                tokens[r.request_id] = [int(choice[i])]
            else:
                tokens[r.request_id] = [sample_token(logits[i], r.params, r.seed, int(step.logits_position[i]),
                                                     r.prompt_ids, r.output_ids)]
        return tokens

    def _record(self, step: StepBatch) -> None:
        s = self.stats
        live = step.cohort.n_rows
        s.steps += 1
        s.live_rows += live
        s.padded_rows += step.forward.n_rows - live
        s.prompt_tokens += sum(len(c.token_ids) for c in step.cohort.prefill)
        s.tree_rows += sum(len(t.token_ids) for t in step.cohort.tree)
        s.replay_keys.add(step.replay_key)

    def _apply(self, step: StepBatch, tokens: dict[Any, list[int]]) -> list[StepUpdate]:
        """Hand each request its tokens of the step (in order, up to the one that finishes it)."""
        new: dict[Any, list[int]] = {}
        for chunk in step.cohort.prefill:
            r = self.requests[chunk.request_id]
            r.n_prefilled = chunk.start + len(chunk.token_ids)
            new[r.request_id] = []
            if chunk.completes_prompt:
                r.phase = DECODE
                r.metrics["first_token_step"] = self.stats.steps
        for item in step.cohort.items:
            r = self.requests[item.request_id]
            for token in tokens.get(item.request_id, ()):
                if r.finish_reason is not None:
                    break
                r.add_token(token)
                self.stats.generated_tokens += 1
                new.setdefault(r.request_id, []).append(token)
        for rid in new:
            r = self.requests[rid]
            if r.finished:
                self._retire(r)
                self.stats.finished += 1
        return [StepUpdate(rid, tuple(t), self.requests[rid].finish_reason) for rid, t in new.items()]

    def _retire(self, request: Request) -> None:
        if request.slot is not None and self.slots.slot_of(request.request_id) == request.slot:
            self.slots.retire(request.slot)
            if self.spec is not None:
                self.spec.forget(request.slot, self.model_state)
        request.phase = FINISHED
        request.metrics["finished_step"] = self.stats.steps

    def _fail(self, cohort: Cohort, message: str) -> list[StepUpdate]:
        """Retire every request of the cohort with an error; the rest of the engine goes on."""
        self.stats.failed_steps += 1
        for item in cohort.items:
            r = self.requests[item.request_id]
            r.finish(FinishReason.ERROR, error=message)
            self._retire(r)
            self.stats.failed += 1
        return [StepUpdate(item.request_id, (), FinishReason.ERROR, message) for item in cohort.items]

    # ---- convenience --------------------------------------------------------------------------
    def run(self, max_steps: int | None = None) -> int:
        """Step until nothing is unfinished (or max_steps); returns the steps taken."""
        n = 0
        while self.has_unfinished() and (max_steps is None or n < max_steps):
            self.step()
            n += 1
        return n

    def graph_counters(self) -> dict[str, int]:
        """Graph replay counters of the target's forward, its tree commits and the draft
        model's forward (summed)."""
        total = dict(self.forward.counters)
        speculator = getattr(self.spec, "speculator", None)
        drafter = getattr(speculator, "drafter", None)
        draft_forward = getattr(drafter, "forward", None) or getattr(getattr(drafter, "inner", None), "forward", None)
        for owner in (getattr(speculator, "committer", None), draft_forward):
            for name, n in getattr(owner, "counters", {}).items():
                total[name] = total.get(name, 0) + n
        return total

    def gauges(self) -> dict[str, int]:
        """Current occupancy: slots, queue, KV pages."""
        return dict(slots_total=self.config.max_slots, slots_busy=self.slots.n_live,
                    queue_depth=len(self.slots.queue), kv_pages_total=self.pool.n_pages,
                    kv_pages_used=self.pool.n_used)

    def check(self) -> None:
        """Every bookkeeping invariant (tests call this after each operation)."""
        self.pool.check()
        self.slots.check()
        self.states.check()
        for r in self.requests.values():
            live = r.phase in (PREFILL, DECODE)
            assert live == (self.slots.slot_of(r.request_id) is not None), f"request {r.request_id} slot mismatch"
            if live:
                kv = self.slots.table[r.slot].kv_len
                assert kv == (r.n_prefilled if r.phase == PREFILL else r.n_tokens - 1)
