"""Token ids carried between forward calls on the device (kernels: cuda/step_ids.cu).

A greedy decode step keeps each AR segment's argmax by slot (`keep_ids`); the next step,
launched before those ids reach the host, feeds its AR rows from them (`feed_ids`;
luce.engine.ahead). A draft model's chain keeps the argmax of every segment's last row (its
catch-up may be a chain of tree rows or a prompt tail) and feeds the next depth's AR rows
from it (luce.spec.drafters.draft_model). Segments as in luce.models.batch: qo_indptr [S+1]
row offsets, ar_slots [S] the slot of a segment that is one AR row, -1 otherwise (keep_ids
takes any such slots array: seq_slots keeps every live segment)."""
from __future__ import annotations

import numpy as np


def keep_ids(ids, logits_indices, qo_indptr, slots, last_ids: np.ndarray) -> None:
    """ids [L] (the step's greedy id of each logits row logits_indices [L]) -> last_ids
    [max_slots] int32, in place: at each segment's slot (slots [S], -1: none; ar_slots or
    seq_slots), the id of its last row when that row has logits."""
    rows = {int(r): i for i, r in reversed(list(enumerate(np.asarray(logits_indices).tolist())))}
    for s, slot in enumerate(np.asarray(slots).tolist()):
        last = int(qo_indptr[s + 1]) - 1
        i = rows.get(last) if slot >= 0 and last >= int(qo_indptr[s]) else None
        if i is not None:
            last_ids[slot] = np.int32(ids[i])


def feed_ids(token_ids: np.ndarray, qo_indptr, ar_slots, last_ids, vocab: int) -> None:
    """token_ids [T] int32, in place: each AR segment's row takes the id its slot kept (0 when
    that is no token id: a diverged row's -1)."""
    for s, slot in enumerate(np.asarray(ar_slots).tolist()):
        if slot >= 0:
            v = int(last_ids[slot])
            token_ids[int(qo_indptr[s])] = v if 0 <= v < vocab else 0


def put_ids(token_ids, qo_indptr, ar_slots, last_ids: np.ndarray) -> None:
    """The host side of a step whose AR rows' ids are known on the host: last_ids[slot] =
    its row's token id, in place (then feed_ids gives them back: one graph for both)."""
    for s, slot in enumerate(np.asarray(ar_slots).tolist()):
        if slot >= 0:
            last_ids[slot] = token_ids[int(qo_indptr[s])]
