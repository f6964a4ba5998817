"""Sampling parameters (validated) and the deterministic host sampler.

A token at absolute position n is drawn with `rng.uniform(seed, n)`, so the draw depends only on
(seed, n): identical alone, among other requests, and with or without speculation. The candidate
order is (logit descending, token id ascending), so ties and cumulative sums are reproducible.
The float64 maths after the candidate order uses only IEEE-rounded +, -, *, / , rint and ldexp
in a fixed order (`det_exp`, sequential sums), so the device sampler (cuda/sample_rng.cu)
draws bitwise the same tokens.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from luce.engine.rng import uniform


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

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def has_penalties(self) -> bool:
        return (self.repetition_penalty != 1.0 or self.presence_penalty != 0.0
                or self.frequency_penalty != 0.0)


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


# exp(x) for x <= 0 by Cody-Waite reduction and a degree-13 Taylor polynomial: within 2 ulp
# of exp, and reproducible bit for bit wherever +, -, *, rint and ldexp round as IEEE says
# (numpy on the host; __dadd_rn/__dmul_rn on the device, never fused).
LN2_HI = 6.93147180369123816490e-01   # 32 significant bits: k * LN2_HI is exact for |k| < 2^21
LN2_LO = 1.90821492927058770002e-10
INV_LN2 = 1.44269504088896338700e+00
EXP_COEFFS = tuple(1.0 / math.factorial(n) for n in range(13, -1, -1))   # 1/13!, ..., 1/1!, 1
EXP_FLOOR = -700.0                    # det_exp is 0 below (and at -inf)


def det_exp(x) -> np.ndarray:
    """x [n] float64, every x <= 0 -> exp(x) [n] float64, deterministic (see above)."""
    x = np.asarray(x, dtype=np.float64)
    xc = np.maximum(x, EXP_FLOOR)
    k = np.rint(xc * INV_LN2)
    r = (xc - k * LN2_HI) - k * LN2_LO
    p = np.full_like(r, EXP_COEFFS[0])
    for c in EXP_COEFFS[1:]:
        p = p * r + c
    return np.where(x < EXP_FLOOR, 0.0, np.ldexp(p, k.astype(np.int32)))


BACKEND_TOPK_MAX = 64  # = LUCE_SAMPLE_TOPK_MAX: the largest top-k backend.sample draws from


def backend_can_draw(params: SamplingParams) -> bool:
    """Whether backend.sample draws this request's tokens (luce/ref/sample_rng.py): without
    penalties a draw depends on the logits row, seed and position only; greedy, or a top-k
    the kernel keeps (1..BACKEND_TOPK_MAX)."""
    return not params.has_penalties and (params.greedy or 1 <= params.top_k <= BACKEND_TOPK_MAX)


def greedy_token(logits: np.ndarray) -> int:
    """argmax with ties broken to the lowest token id (np.argmax returns the first maximum)."""
    return int(np.argmax(logits))


def candidate_distribution(logits: np.ndarray, params: SamplingParams) -> tuple[np.ndarray, np.ndarray]:
    """Filtered distribution for a sampled draw: (ids [n] in draw order, probs [n] f64 summing to 1).

    Order is logit descending then id ascending; temperature, top-k, top-p and min-p applied.
    Sums are sequential (np.cumsum), exponentials `det_exp`: the device sampler's order."""
    scaled = logits.astype(np.float64) / params.temperature
    order = np.lexsort((np.arange(scaled.shape[0]), -scaled))
    if params.top_k > 0:
        order = order[: params.top_k]
    vals = scaled[order]
    probs = det_exp(vals - vals[0])
    probs = probs / np.cumsum(probs)[-1]
    if params.top_p < 1.0:
        cut = int(np.searchsorted(np.cumsum(probs), params.top_p, side="left")) + 1
        order, probs = order[:cut], probs[:cut]
    if params.min_p > 0.0:
        keep = probs >= params.min_p * probs[0]
        order, probs = order[keep], probs[keep]
    return order, probs / np.cumsum(probs)[-1]


def sample_token(logits: np.ndarray, params: SamplingParams, seed: int, position: int,
                 prompt_ids=(), output_ids=()) -> int:
    """The token at absolute `position` for one request: greedy or a (seed, position) draw."""
    logits = apply_penalties(logits, params, prompt_ids, output_ids)
    if params.greedy:
        return greedy_token(logits)
    ids, probs = candidate_distribution(logits, params)
    u = uniform(seed, position)
    idx = int(np.searchsorted(np.cumsum(probs), u, side="right"))
    return int(ids[min(idx, len(ids) - 1)])
