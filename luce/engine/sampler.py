"""Sampling parameters (validated), penalties, and the deterministic host sampler.

A token at absolute position n is drawn with `uniform(seed, n)`, so the draw depends only on
(seed, n): identical alone, among other requests, and with or without speculation. The draw's
arithmetic (candidate order, det_exp, sequential sums) is luce/ref/sample_rng.py, which the
device sampler (cuda/sample_rng.cu) reproduces bitwise.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from luce.engine.constraint import Grammar
from luce.ref.sampling import log_softmax
from luce.ref.sample_rng import MASK64, TOPK_MAX, candidates, det_exp, draw, splitmix64, uniform  # noqa: F401


LOGPROBS_MAX = 20   # top_logprobs at most (OpenAI's limit)


class SamplingError(ValueError):
    """An invalid sampling parameter; `field` names it (the server reports it as a 400)."""

    def __init__(self, field_name: str, message: str):
        super().__init__(f"{field_name}: {message}")
        self.field = field_name


def _number(name, value, lo=None, hi=None, lo_open=False, integer=False):
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SamplingError(name, f"must be a number, got {type(value).__name__}")
    if integer and not float(value).is_integer():
        raise SamplingError(name, f"must be an integer, got {value!r}")
    if not math.isfinite(value):
        raise SamplingError(name, f"must be finite, got {value!r}")
    if lo is not None and (value <= lo if lo_open else value < lo):
        raise SamplingError(name, f"must be {'>' if lo_open else '>='} {lo}, got {value!r}")
    if hi is not None and value > hi:
        raise SamplingError(name, f"must be <= {hi}, got {value!r}")


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 256
    temperature: float = 0.0          # 0 = greedy
    top_k: int = 0                    # 0 or -1 = off
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0   # over prompt and output tokens (vLLM semantics)
    presence_penalty: float = 0.0     # over output tokens
    frequency_penalty: float = 0.0    # over output tokens
    seed: int | None = None           # None: the engine picks one at admission
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logit_bias: tuple[tuple[int, float], ...] = ()   # (token id, added to its logit), as OpenAI's
    grammar: Grammar | None = None    # the output must match it (luce.engine.constraint)
    logprobs: int | None = None       # None: none; k >= 0: each token's log-prob and the top k
    n: int = 1                        # sequences per prompt (luce.LLM; the engine runs one each)
    extra: dict = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self):
        _number("max_tokens", self.max_tokens, lo=1, integer=True)
        _number("temperature", self.temperature, lo=0, hi=100)
        _number("top_k", self.top_k, lo=-1, integer=True)
        _number("top_p", self.top_p, lo=0, hi=1, lo_open=True)
        _number("min_p", self.min_p, lo=0, hi=1)
        _number("repetition_penalty", self.repetition_penalty, lo=0, hi=10, lo_open=True)
        _number("presence_penalty", self.presence_penalty, lo=-2, hi=2)
        _number("frequency_penalty", self.frequency_penalty, lo=-2, hi=2)
        if self.seed is not None:
            _number("seed", self.seed, lo=-(1 << 63), hi=(1 << 64) - 1, integer=True)
        if isinstance(self.stop, (str, list)):   # one stop string, or a list, as vLLM accepts
            object.__setattr__(self, "stop", (self.stop,) if isinstance(self.stop, str) else tuple(self.stop))
        if not isinstance(self.stop, tuple) or not all(isinstance(s, str) and s for s in self.stop):
            raise SamplingError("stop", "must be a list of non-empty strings")
        if len(self.stop) > 16:
            raise SamplingError("stop", f"at most 16 stop strings, got {len(self.stop)}")
        if not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in self.stop_token_ids):
            raise SamplingError("stop_token_ids", "must be a list of non-negative integers")
        if isinstance(self.logit_bias, dict):
            object.__setattr__(self, "logit_bias", tuple(sorted((int(k), v) for k, v in self.logit_bias.items())))
        for token, bias in self.logit_bias:
            if isinstance(token, bool) or not isinstance(token, int) or token < 0:
                raise SamplingError("logit_bias", f"keys must be token ids (integers >= 0), got {token!r}")
            _number(f"logit_bias[{token}]", bias, lo=-100, hi=100)
        if self.grammar is not None and not isinstance(self.grammar, Grammar):
            raise SamplingError("grammar", f"must be a luce.engine.constraint.Grammar, got {type(self.grammar).__name__}")
        if self.logprobs is not None:
            _number("logprobs", self.logprobs, lo=0, hi=LOGPROBS_MAX, integer=True)
        _number("n", self.n, lo=1, hi=128, integer=True)
        # read for every row of every step (luce.engine.outcome.greedy): worked out once
        object.__setattr__(self, "device_greedy", self.greedy and not self.needs_host_logits)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def has_penalties(self) -> bool:
        return (self.repetition_penalty != 1.0 or self.presence_penalty != 0.0
                or self.frequency_penalty != 0.0)

    @property
    def needs_host_logits(self) -> bool:
        """The host sampler draws this request's tokens: penalties, a logit bias, a grammar
        mask, or log-probs to report (the step's logits come to the host)."""
        return self.has_penalties or bool(self.logit_bias) or self.grammar is not None or self.logprobs is not None


def apply_penalties(logits: np.ndarray, params: SamplingParams, prompt_ids, output_ids) -> np.ndarray:
    """logits [V] f32 -> penalized copy. Repetition over prompt+output, presence/frequency over output."""
    if not params.has_penalties:
        return logits
    out = logits.astype(np.float32, copy=True)
    vocab = out.shape[0]
    if params.repetition_penalty != 1.0:
        seen = np.unique(np.asarray(list(prompt_ids) + list(output_ids), dtype=np.int64))
        seen = seen[(seen >= 0) & (seen < vocab)]
        vals = out[seen]
        out[seen] = np.where(vals > 0, vals / params.repetition_penalty, vals * params.repetition_penalty)
    if output_ids and (params.presence_penalty or params.frequency_penalty):
        ids, counts = np.unique(np.asarray(output_ids, dtype=np.int64), return_counts=True)
        keep = (ids >= 0) & (ids < vocab)
        ids, counts = ids[keep], counts[keep]
        out[ids] -= np.float32(params.frequency_penalty) * counts.astype(np.float32)
        out[ids] -= np.float32(params.presence_penalty)
    return out


BACKEND_TOPK_MAX = TOPK_MAX  # the largest top-k backend.sample draws from


def backend_can_draw(params: SamplingParams) -> bool:
    """Whether backend.sample draws this request's tokens (luce/ref/sample_rng.py): without
    penalties, bias, grammar or log-probs a draw depends on the logits row, seed and position
    only; greedy, or a top-k the kernel keeps (1..BACKEND_TOPK_MAX)."""
    return not params.needs_host_logits and (params.greedy or 1 <= params.top_k <= BACKEND_TOPK_MAX)


def greedy_token(logits: np.ndarray) -> int:
    """argmax with ties broken to the lowest token id (np.argmax returns the first maximum)."""
    return int(np.argmax(logits))


def candidate_distribution(logits: np.ndarray, params: SamplingParams) -> tuple[np.ndarray, np.ndarray]:
    """Filtered distribution for a sampled draw: (ids [n] in draw order, probs [n] f64 summing
    to 1), luce.ref.sample_rng.candidates with the request's parameters."""
    return candidates(logits, params.temperature, params.top_k, params.top_p, params.min_p)


def apply_logit_bias(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """logits [V] -> a copy with each biased token's bias added (ids past the vocab ignored)."""
    if not params.logit_bias:
        return logits
    out = logits.astype(np.float32, copy=True)
    for token, bias in params.logit_bias:
        if token < out.shape[0]:
            out[token] += np.float32(bias)
    return out


def sample_token(logits: np.ndarray, params: SamplingParams, seed: int, position: int,
                 prompt_ids=(), output_ids=(), constraint=None) -> int:
    """The token at absolute `position` for one request: penalties, the logit bias, the
    grammar mask (constraint: luce.engine.constraint.TokenConstraint in the request's state
    before this token), then greedy or the (seed, position) draw (luce.ref.sample_rng.draw)."""
    logits = apply_logit_bias(apply_penalties(logits, params, prompt_ids, output_ids), params)
    if constraint is not None:
        logits = constraint.apply(logits)
    if params.greedy:
        return greedy_token(logits)
    return draw(logits, params.temperature, params.top_k, params.top_p, params.min_p, seed, position)


def token_logprobs(logits: np.ndarray, token: int, top: int) -> tuple[float, tuple[tuple[int, float], ...]]:
    """(log-prob of `token`, the `top` most likely (id, log-prob), best first, ties to the
    lower id) under the model's distribution: luce.ref.sampling.log_softmax of the raw logits
    row [V] (before penalties, bias, grammar and temperature, as vLLM's default)."""
    logp = log_softmax(np.asarray(logits)[None, :])[0]
    best = ()
    if top:
        top = min(top, logp.shape[0])
        cut = -np.partition(-logp, top - 1)[top - 1]       # the top-th largest value
        ids = np.flatnonzero(logp >= cut)                   # ascending ids: ties to the lower id
        ids = ids[np.argsort(-logp[ids], kind="stable")][:top]
        best = tuple((int(i), float(logp[i])) for i in ids)
    return float(logp[token]), best
