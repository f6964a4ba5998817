"""A deterministic stand-in for the engine, implementing luce.server.bridge.EngineCore.

Each request's output is a script chosen by its prompt: the tokens of one of SCRIPTS
(picked by the prompt ids' sum), or of `script_fn(prompt_ids)` when given (tests that need a
model to say something exact: tool calls, think blocks), then an end-of-generation token. Running requests emit
`tokens_per_step` tokens per step (several simulate speculation); at most `max_slots` run at
once, the rest wait. A cancelled request leaves its slot at the next step. Prompts that
contain FAIL_TEXT make the request end with an engine error. Like the engine, the core applies
the one output rule (luce.engine.output_stream: stop ids, end of generation, stop strings,
max_tokens) and hands the server text it only renders.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from luce.engine.output_stream import OutputStream
from luce.server.bridge import EngineStats, StepOutput

SCRIPTS = (
    "def add(a, b):\n    return a + b\n",
    "The quick brown fox jumps over the lazy dog. The dog was not amused. END here.",
    "héllo wörld 🙂 and more text after the emoji",
    "print('hello')\nprint('world')\n" * 3,
)
FAIL_TEXT = "PLEASE-FAIL"


@dataclass
class _Running:
    request_id: str
    prompt_ids: list[int]
    params: object
    script: list[int]
    out: OutputStream
    emitted: int = 0


@dataclass
class FakeCore:
    tokenizer: object
    max_slots: int = 2
    tokens_per_step: int = 1
    step_delay: float = 0.0
    n_pages: int = 512
    script_repeat: int = 1
    script_fn: object = None                          # prompt ids -> the text to generate (instead of SCRIPTS)
    fail_ids: tuple = ()
    waiting: list = field(default_factory=list)
    running: dict = field(default_factory=dict)
    cancelled: list = field(default_factory=list)     # ids whose slot was freed by a cancel
    finished: list = field(default_factory=list)      # ids the core finished itself
    prompts: dict = field(default_factory=dict)       # request id -> prompt ids
    steps: int = 0

    def __post_init__(self):
        self._to_cancel: set[str] = set()
        self.fail_ids = tuple(self.tokenizer.encode(FAIL_TEXT))

    # --- EngineCore --------------------------------------------------------------------

    def add_request(self, request_id, prompt_ids, params) -> None:
        self.prompts[request_id] = list(prompt_ids)
        if self.script_fn is not None:
            text = self.script_fn(list(prompt_ids))
        else:
            text = SCRIPTS[sum(prompt_ids) % len(SCRIPTS)] * self.script_repeat
        script = self.tokenizer.encode(text) + [self.tokenizer.eos_id]
        stream = OutputStream(params, tokenizer=self.tokenizer, eos_ids=self.tokenizer.eot_ids)
        self.waiting.append(_Running(request_id, list(prompt_ids), params, script, stream))

    def cancel(self, request_id) -> None:
        self._to_cancel.add(request_id)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self._to_cancel)

    def step(self) -> list[StepOutput]:
        if self.step_delay:
            time.sleep(self.step_delay)
        self.steps += 1
        for rid in list(self._to_cancel):
            if self.running.pop(rid, None) is not None:
                self.cancelled.append(rid)
            before = len(self.waiting)
            self.waiting = [r for r in self.waiting if r.request_id != rid]
            if len(self.waiting) != before:
                self.cancelled.append(rid)
        self._to_cancel.clear()
        while self.waiting and len(self.running) < self.max_slots:
            req = self.waiting.pop(0)
            self.running[req.request_id] = req
        outputs = []
        for rid, req in list(self.running.items()):
            if _contains(req.prompt_ids, self.fail_ids):
                outputs.append(StepOutput(rid, (), "error", "injected failure"))
                del self.running[rid]
                continue
            take = req.script[req.emitted: req.emitted + self.tokens_per_step]
            taken = req.out.add_many(take)
            req.emitted += len(take)
            if not req.out.finished and req.emitted >= len(req.script):   # ignore_eos: keep repeating
                req.script = req.script + req.script
            reason = req.out.finish_reason
            stop = req.out.stop_reason if isinstance(req.out.stop_reason, str) else None
            outputs.append(StepOutput(rid, tuple(taken), reason, text=req.out.take_delta(), stop_string=stop))
            if reason is not None:
                del self.running[rid]
                self.finished.append(rid)
        return outputs

    def stats(self) -> EngineStats:
        used = sum(-(-(len(r.prompt_ids) + r.emitted) // 16) for r in self.running.values())
        return EngineStats(slots_total=self.max_slots, slots_busy=len(self.running),
                           queue_depth=len(self.waiting), kv_pages_total=self.n_pages,
                           kv_pages_used=used, steps=self.steps,
                           slots=tuple((r.request_id, len(r.prompt_ids) + r.emitted) for r in self.running.values())
                           + (None,) * (self.max_slots - len(self.running)))


def _contains(seq, sub) -> bool:
    n = len(sub)
    return n > 0 and any(tuple(seq[i:i + n]) == tuple(sub) for i in range(len(seq) - n + 1))


def script_for(tokenizer, prompt_ids, repeat: int = 1) -> str:
    """The text FakeCore generates for `prompt_ids` (for expectations in tests)."""
    return SCRIPTS[sum(prompt_ids) % len(SCRIPTS)] * repeat
