"""What a step decided, after the forward pass: every prompt tail's and AR row's token and
each tree's accepted path (DESIGN.md section 2 step 6). Pure: it reads the logits and
changes no state; the transaction's commit then makes it durable. A step none of whose rows
gives a token reads nothing back (nor waits for the device).

The target's token for every logits row is drawn on the backend when it can (argmax when
all are greedy: `greedy`, the engine then has the forward's graph compute it, greedy_ids;
the seeded sampler at each row's position when no request has penalties
and the backend samples its top-k: `device_draw`), so only token ids leave the device; otherwise the
logits come to the host and the engine sampler draws. Same tokens either way. A request
with a grammar, a logit bias or log-probs (SamplingParams.needs_host_logits) brings its
step's logits to the host: the mask and bias apply there (luce.engine.constraint), and each
emitted token's log-prob is the log_softmax of the target's row that chose it (for a tree,
the verified node's row).
"""
from __future__ import annotations

from typing import Any, Callable

from luce.engine.request import TokenLogprob
from luce.engine.sampler import MASK64, SamplingParams, backend_can_draw, sample_token, token_logprobs
from luce.engine.step import ROW_TREE, StepBatch
from luce.engine.txn import StepOutcome

_PAD_PARAMS = SamplingParams(max_tokens=1)   # logits rows that give no token: greedy, no penalties


def decide(step: StepBatch, out, backend, request_of: Callable[[int], Any], spec=None) -> StepOutcome:
    """The step's outcome from its ForwardOutput `out`; request_of(slot) -> Request; spec:
    luce.engine.speculation.EngineSpeculation (trees' acceptance)."""
    requests = [request_of(slot) if slot >= 0 else None for slot in step.logits_slot.tolist()]   # per logits row
    if not step.cohort.tree and all(r is None for r in requests):
        # No row gives a token (prompt chunks short of their prompt's end): nothing to read back,
        # so the host goes on to the next step while the device runs this one.
        return StepOutcome(out)
    logits, choice = row_choices(step, out, backend, requests)
    tokens, rows = {}, {}
    chosen = choice.tolist() if choice is not None else None
    for i, (r, kind) in enumerate(zip(requests, step.logits_kind.tolist())):
        if r is None or kind == ROW_TREE:
            continue
        rows[r.request_id] = [i]
        tokens[r.request_id] = [chosen[i]] if chosen is not None else \
            [sample_token(logits[i], r.params, r.seed, int(step.logits_position[i]), r.prompt_ids, r.output_ids,
                          r.constraint)]
    paths, accepted = {}, {}
    if step.cohort.tree:
        accepted = spec.accept(step, logits, choice, request_of)
        node_rows = tree_rows(step)
        for chunk in step.cohort.tree:
            tokens[chunk.request_id] = list(accepted[chunk.slot].tokens)
            paths[chunk.slot] = accepted[chunk.slot].path
            rows[chunk.request_id] = [node_rows[chunk.slot][node] for node in accepted[chunk.slot].path]
    return StepOutcome(out, paths, tokens, accepted, logprobs=_logprobs(logits, tokens, rows, requests))


def tree_rows(step: StepBatch) -> dict[int, list[int]]:
    """slot -> the logits rows of its tree's nodes, in node order."""
    rows: dict[int, list[int]] = {}
    for i, slot in enumerate(step.logits_slot.tolist()):
        if slot >= 0 and step.logits_kind[i] == ROW_TREE:
            rows.setdefault(slot, []).append(i)
    return rows


def _logprobs(logits, tokens: dict, rows: dict, requests) -> dict:
    """request id -> [TokenLogprob] for the requests that asked: the j-th emitted token was
    chosen from logits row rows[id][j] (an AR row, or the j-th node of the accepted path);
    requests: the Request of each logits row (None: padding)."""
    out = {}
    for r in requests:
        if r is None or r.params.logprobs is None or r.request_id in out or r.request_id not in tokens:
            continue
        out[r.request_id] = [TokenLogprob(t, *token_logprobs(logits[row], t, r.params.logprobs))
                             for t, row in zip(tokens[r.request_id], rows[r.request_id])]
    return out


def greedy(params) -> bool:
    """Do these requests' tokens come from the argmax of their logits rows on the backend?"""
    return all([p.device_greedy for p in params])


def row_choices(step: StepBatch, out, backend, requests) -> tuple[Any, Any]:
    """(host logits [L, V], None), or (None, choice [L]): the target's token for every
    logits row drawn on the backend (greedy: the forward's greedy_ids when it made them);
    requests: the Request of each logits row (None: padding)."""
    logits = out.logits
    if logits.shape[0] != len(step.logits_slot):
        raise RuntimeError(f"the model returned {logits.shape[0]} logits rows, the step asked for "
                           f"{len(step.logits_slot)}")
    params = [r.params if r is not None else _PAD_PARAMS for r in requests]
    if greedy(params):
        ids = getattr(out, "greedy_ids", None)
        return None, backend.argmax(logits) if ids is None else backend.ids_to_host(ids)
    if hasattr(backend, "sample") and all(backend_can_draw(p) for p in params):
        return None, backend.ids_to_host(device_draw(step, logits, backend, requests))
    return backend.to_numpy(logits), None


def device_draw(step: StepBatch, logits, backend, requests):
    """The seeded draw of every logits row on the backend (backend.sample_ids: each row's
    sampling parameters, seed and predicted position), left on the device, nothing waited
    for; requests: the Request of each logits row (None: padding), every one backend_can_draw."""
    params = [r.params if r is not None else _PAD_PARAMS for r in requests]
    seeds = [r.seed & MASK64 if r is not None else 0 for r in requests]
    return backend.sample_ids(logits, [p.temperature for p in params], [max(p.top_k, 1) for p in params],
                              [p.top_p for p in params], [p.min_p for p in params], seeds, step.logits_position)
