"""Engine: continuous batching over one model (DESIGN.md sections 2 and 9).

    engine = Engine(model, tokenizer, EngineConfig(max_slots=5, ctx=4096))
    rid = engine.add_request(prompt_ids, SamplingParams(max_tokens=32))
    while engine.has_unfinished():
        engine.step()
    out = engine.take_output(rid)          # RequestOutput

One step, one pass top to bottom: admit queued requests into free slots (state
re-initialised), `scheduler.schedule` (the cohort: prompt chunks under the token budget and
an AR row per decoding request), drafters propose (speculation: lanes that fit become draft
trees; draft state only), `StepBuilder.build` (rows, CSR, the replay key, padding),
`txn.preflight` (every check; a plan or a reason), the model's forward (durable state for
prefill and AR rows only; tree rows write scratch), acceptance (pure: sampled tokens and
each tree's accepted path), `txn.commit` (promotes the accepted paths and features, takes
the pages) and the outputs: tokens to their requests (luce.engine.output_stream, the one
stop rule) and finished requests retired. Greedy or seeded, the tokens are the same with
speculation on or off. A step of AR rows drawn on the device is committed as soon as it is launched
and the next one launched before its ids reach the host (luce.engine.ahead, where the backend
launches asynchronously): a call then hands out the tokens of the step launched by the call
before.

Failures: a step that fails before commit changes nothing: before a step with prefill or
AR rows (they advance recurrent state in place) the state of those rows' slots is
checkpointed (ModelState.checkpoint; other slots are not copied), and a failure after its
forward rolls it back; tree rows and KV rows past the committed lengths are scratch. The step is dropped and its cohort runs again
next step (a request whose steps failed `max_step_retries` times in a row ends with 'error',
naming the cause). Only a failed rollback (or commit, which checks everything before it
changes anything) retires the step's cohort. Cancellation
between steps frees the slot and its pages and touches nothing else. The engine never
imports a backend: it uses the model's (`model.backend`).
"""
from __future__ import annotations

import itertools
from dataclasses import replace
from typing import Any, Callable, Sequence

from luce.engine.ahead import InFlight, StepsAhead, ahead_enabled
from luce.engine.pages import PagePool
from luce.engine.engine_views import EngineViews
from luce.engine.engine_config import EngineConfig, EngineStats, StepUpdate, default_token_budget  # noqa: F401 (re-exported)
from luce.engine.prefix_cache import PrefixCache
from luce.engine.request import DECODE, FINISHED, PREFILL, FinishReason, Request, RequestOutput
from luce.engine.outcome import decide, greedy
from luce.engine.sampler import MASK64, SamplingParams, splitmix64
from luce.engine.scheduler import PREFILL_ALIGN, Scheduler
from luce.engine.slots import SlotManager
from luce.engine.speculation import draft_models
from luce.engine.state_slots import StateSlots
from luce.engine.step import Cohort, StepBatch, StepBuilder
from luce.engine.txn import Promotion, Reject, StepOutcome, Transaction
from luce.models.commit import GraphedCommit
from luce.models.device_work import host_work
from luce.models.graphed_forward import GraphedForward
from luce.models.kv_cache import pages_needed

class Engine(StepsAhead, EngineViews):
    def __init__(self, model, tokenizer=None, config: EngineConfig | None = None, *, drafter=None,
                 draft_model=None, **overrides):
        """model: a luce.models.batch.Model; tokenizer (luce.tokenizer.Tokenizer) enables text,
        stop strings and end-of-generation tokens. Keyword overrides replace config fields.
        With config.spec enabled, `drafter` (luce.spec.drafters) replaces the one the config
        names and `draft_model` is an already loaded draft model (else config.spec.draft is
        loaded on the model's backend). Raises ValueError, naming why, when the model (or the
        drafter's) would run ops on the host of a device backend."""
        config = replace(config or EngineConfig(), **overrides)
        if config.token_budget is None:
            config = replace(config, token_budget=self._default_token_budget(model, config))
        self.config = config
        self.model = model
        self.forward = GraphedForward(model, enabled=config.cuda_graphs)   # model.forward, graphed on GPUs
        self.committer = GraphedCommit(model.backend, enabled=config.cuda_graphs)
        self.spec = self._speculation(config, drafter, draft_model)
        self.ahead = ahead_enabled(config, model.backend, self.forward, self.spec)
        if self.ahead:
            self.forward.keep_ids_for(config.max_slots)
        if self.spec is not None:      # plain decoding is then timed on steps run ahead
            self.spec.policy.steps_ahead(self.ahead)
        self._refuse_host_work()
        self.tokenizer = tokenizer
        self.vocab = int(model.config.vocab)
        self.model_state = model.new_state(config.n_pages, config.max_slots)
        self.pool = PagePool(config.n_pages)
        self.states = StateSlots(self.model_state)
        self.slots = SlotManager(self.pool, self.states, config.max_queue)
        self.cache, self.cache_off_reason = self._prefix_cache(config)
        self.txn = Transaction(self.slots, config.ctx, promote=self._promote, vocab=self.vocab,
                               feature_layers=self.spec.feature_layers if self.spec is not None else (),
                               check=self._check_promotion, cache=self.cache)
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
        request = Request(request_id, prompt, params, seed, tokenizer=self.tokenizer, eos_ids=self._eos,
                          ctx=self.config.ctx, prompt_text=prompt_text, order=number, vocab=self.vocab)
        self.slots.submit(request_id, reserve)
        self.requests[request_id] = request
        return request_id

    def cancel(self, request_id) -> bool:
        """Stop a queued or running request (finish reason 'cancelled'); False if unknown or done."""
        request = self.requests.get(request_id)
        if request is None or request.finished:
            return False
        slot = self.slots.slot_of(request_id)
        self.slots.cancel(request_id)
        if slot is not None and self.spec is not None:
            self.spec.forget(slot)
        if slot is not None and self.cache is not None:
            self.cache.forget(slot)
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
        if self.in_flight is not None:     # launched ahead by the last call (luce.engine.ahead)
            return self._step_in_flight()
        if self.spec is not None:
            self.spec.begin_step()
        for request_id, slot in self.slots.admit_all():
            request = self.requests[request_id]
            request.slot, request.phase = slot, PREFILL
            request.metrics["admitted_step"] = self.stats.steps
            if self.spec is not None:
                self.spec.forget(slot)
            if self.cache is not None:
                self._attach(request, slot)
        if self.cache is not None:
            self.cache.make_room()
        running = [r for r in self.requests.values() if r.phase in (PREFILL, DECODE)]
        cohort = self.scheduler.schedule(running)
        if not cohort:
            return []
        step = None
        try:
            if self.spec is not None:
                cohort = self.spec.propose(cohort, self.requests)
            layers = self.spec.feature_layers if self.spec is not None else ()
            step = self.builder.build(cohort, capture_layers=layers)
            plan = self.txn.preflight(step)
            if isinstance(plan, Reject):
                raise RuntimeError(f"preflight rejected the step: {plan.reason}")
            self._hook("before_forward", step)
        except Exception as e:  # noqa: BLE001 - nothing durable has changed
            return self._drop(cohort, f"{type(e).__name__}: {e}")
        try:
            if step.durable:   # prefill / AR rows advance their slots' recurrent state in place
                self.model_state.checkpoint(step.durable_slots)
        except Exception as e:  # noqa: BLE001 - a checkpoint only writes its own save buffers
            return self._drop(cohort, f"checkpoint failed: {type(e).__name__}: {e}")
        ahead = self.ahead_eligible(step)
        try:
            out = self.forward(step.forward, self.model_state,
                               greedy_ids=greedy([self.requests[item.request_id].params for item in step.cohort.items]))
            if ahead:    # its ids stay on the device for the next step (luce.engine.ahead)
                outcome, in_flight = StepOutcome(out), InFlight(step, self._ids_in_flight(step, out))
            else:
                self._hook("after_forward", step)
                outcome = decide(step, out, self.model.backend, self._request_in, self.spec)
                self._hook("after_accept", step)
        except Exception as e:  # noqa: BLE001
            if isinstance(e, MemoryError):   # the device ran out: the graphs' pools go back before the retry
                for owner in (self.forward, self.committer):
                    owner.cache.make_room()
            return self._undo(step, cohort, f"{type(e).__name__}: {e}")
        try:
            self.txn.commit(plan, outcome)
        except Exception as e:  # noqa: BLE001 - never expected: commit checks before it changes anything
            return self._fail(cohort, f"commit failed: {type(e).__name__}: {e}")
        if ahead:
            return self._run_ahead(in_flight, steady=False)
        self._record(step, outcome)
        updates = self._apply(step.cohort, outcome.tokens, outcome.logprobs)
        if self.spec is not None:
            self.spec.end_step(step)
        return updates

    def _prefix_cache(self, config: EngineConfig):
        """(PrefixCache or None, why it is off)."""
        if not config.prefix_cache:
            return None, "off (prefix_cache=False)"
        if self.spec is not None and self.spec.feature_layers:
            return None, "off: the DFlash drafter needs target features of every position, which it does not hold"
        cache = PrefixCache(self.pool, self.slots, self.model_state, self.model.backend, config.cache_memory,
                            config.snapshot_interval)
        cache.fault = lambda point: self._hook(point, None)   # tests inject faults inside the cache
        return cache, None

    def _attach(self, request: Request, slot: int) -> None:
        """A freshly admitted request takes its prompt's cached prefix (pages, state)."""
        n = self.cache.attach(slot, request.prompt_ids)
        request.n_prefilled = n
        request.prefill_stops = self.cache.cursors[slot].stops
        request.metrics["cached_tokens"] = n
        self.stats.cached_prompt_tokens += n

    @staticmethod
    def _default_token_budget(model, config: EngineConfig) -> int:
        """default_token_budget for the model's backend, heads and the engine's context."""
        runtime, c = getattr(model.backend, "runtime", None), model.config
        try:
            free = int(runtime.mem_get_info()[0]) if runtime is not None else None
        except Exception:  # noqa: BLE001 - memory unknown: the small default
            free = None
        return default_token_budget(model.backend.name, config.max_slots, ctx=config.ctx,
                                    n_head=int(getattr(c, "n_head", 0)), head_dim=int(getattr(c, "head_dim", 0)),
                                    free_bytes=free)

    def _speculation(self, config: EngineConfig, drafter, draft_model):
        if config.spec is None or not config.spec.enabled:
            return None
        from luce.engine.speculation import EngineSpeculation
        from luce.spec.config import make_drafter
        from luce.spec.speculator import Speculator

        if drafter is None:
            drafter = make_drafter(config.spec, self.model, config.max_slots, config.ctx, draft_model=draft_model)
        caches: list = []      # the graph caches, looked up once (twice a step: the per-step cost counts)

        def warmups() -> int:
            if not caches:
                caches.extend(c for c in (getattr(o, "cache", None) for o in self._graph_owners()) if c is not None)
            return sum(c.warmups for c in caches)
        return EngineSpeculation(Speculator(config.spec, self.model, drafter), config.token_budget, config.ctx,
                                 during_prefill=config.spec_during_prefill, warmups=warmups)

    def _refuse_host_work(self) -> None:
        reasons = host_work(self.model)
        drafter = getattr(getattr(self.spec, "speculator", None), "drafter", None)
        for model in {id(m): m for m in draft_models(drafter)}.values():
            reasons += [f"draft: {r}" for r in host_work(model)]
        if reasons:
            raise ValueError(f"the {getattr(self.model.backend, 'name', 'device')} backend would run these on the "
                             f"host: {'; '.join(reasons)}; use a model these kernels take, or --backend cpu")

    def _hook(self, point: str, step: StepBatch) -> None:
        if self.fault_hook is not None:
            self.fault_hook(point, step)

    def _request_in(self, slot: int) -> Request:
        return self.requests[self.slots.table[slot].request_id]

    # ---- commit and outputs ------------------------------------------------------------------
    def _promote(self, promotion: Promotion, output) -> None:
        """The device side of txn.commit: the accepted paths into KV, conv and GDN state (one
        model-level call, graphed), then the committed rows' features to the drafter."""
        self.committer(self.model_state, output.staged, promotion.trees)
        if self.spec is not None and promotion.feature_segments:
            self.spec.promote_features(output, promotion.feature_rows, promotion.feature_segments)

    def _check_promotion(self, promotion: Promotion) -> None:
        if self.spec is not None and promotion.feature_segments:
            self.spec.check_features(promotion.feature_segments)

    def _record(self, step: StepBatch, outcome: StepOutcome) -> None:
        s, cohort = self.stats, step.cohort
        prompt = sum([len(c.token_ids) for c in cohort.prefill]) if cohort.prefill else 0
        tree = sum([len(t.token_ids) for t in cohort.tree]) if cohort.tree else 0
        live = prompt + len(cohort.decode) + tree
        s.steps += 1
        s.live_rows += live
        s.padded_rows += step.forward.n_rows - live
        s.prompt_tokens += prompt
        s.tree_rows += tree
        s.replay_keys.add(step.replay_key)
        if self.spec is not None:
            self.spec.record(step, outcome.accepted, self._request_in)
        if cohort.tree:
            accepted = outcome.accepted
            for chunk in cohort.tree:
                m, acc = self.requests[chunk.request_id].metrics, accepted[chunk.slot]
                m["spec_verifies"] = m.get("spec_verifies", 0) + 1
                m["spec_drafted"] = m.get("spec_drafted", 0) + len(chunk.token_ids) - 1
                m["spec_accepted"] = m.get("spec_accepted", 0) + acc.n_accepted

    def _apply(self, cohort: Cohort, tokens: dict[Any, list[int]], logprobs: dict | None = None) -> list[StepUpdate]:
        """Hand each request its tokens of the step (in order, up to the one that finishes it)."""
        for chunk in cohort.prefill:
            r = self.requests[chunk.request_id]
            r.n_prefilled = chunk.start + len(chunk.token_ids)
            if chunk.completes_prompt:
                r.phase = DECODE
                r.metrics["first_token_step"] = self.stats.steps
        updates = []
        for item in cohort.items:     # one per request: its prompt chunk, AR row or tree
            r = self.requests[item.request_id]
            r.metrics.pop("step_failures", None)
            taken = r.add_tokens(tokens.get(r.request_id, ()), logprobs.get(r.request_id, ()) if logprobs else ())
            self.stats.generated_tokens += len(taken)
            if r.finished:
                self._retire(r)
                self.stats.finished += 1
            lp = tuple(r.logprobs[len(r.logprobs) - len(taken):]) if r.logprobs is not None and taken else ()
            updates.append(StepUpdate(r.request_id, tuple(taken), r.finish_reason, text=r.take_delta(),
                                      stop_reason=r.stop_reason, logprobs=lp))
        return updates

    def _retire(self, request: Request) -> None:
        if request.slot is not None and self.slots.slot_of(request.request_id) == request.slot:
            self.slots.retire(request.slot)
            if self.spec is not None:
                self.spec.forget(request.slot)
            if self.cache is not None:
                self.cache.forget(request.slot)
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
        return [StepUpdate(item.request_id, (), FinishReason.ERROR, message, text=self.requests[item.request_id].take_delta())
                for item in cohort.items]

    def _undo(self, step: StepBatch, cohort: Cohort, message: str) -> list[StepUpdate]:
        """A step failed after its forward: put back the recurrent state its prefill and AR
        rows advanced (everything else it wrote is scratch), then drop it. Only if that
        rollback fails too is the cohort retired."""
        if step.durable:
            try:
                self.model_state.rollback()
            except Exception as e:  # noqa: BLE001
                return self._fail(cohort, f"{message}; rollback failed: {type(e).__name__}: {e}")
        return self._drop(cohort, message)

    def _drop(self, cohort: Cohort, message: str) -> list[StepUpdate]:
        """A step that changed nothing failed: its requests run again next step, unless they
        failed max_step_retries times in a row (then they end with the error)."""
        self.stats.dropped_steps += 1
        given_up = []
        for item in cohort.items:
            m = self.requests[item.request_id].metrics
            m["step_failures"] = m.get("step_failures", 0) + 1
            if m["step_failures"] > self.config.max_step_retries:
                given_up.append(item)
        return self._fail(Cohort(decode=given_up), message) if given_up else []

    # ---- convenience --------------------------------------------------------------------------
    def run(self, max_steps: int | None = None) -> int:
        """Step until nothing is unfinished (or max_steps); returns the steps taken."""
        n = 0
        while self.has_unfinished() and (max_steps is None or n < max_steps):
            self.step()
            n += 1
        return n
