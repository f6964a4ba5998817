"""Token ids carried between decode steps on the device (kernels: cuda/step_ids.cu).

A greedy decode step keeps each AR segment's argmax by slot (`keep_ids`); the next step,
launched before those ids reach the host, feeds its AR rows from them (`feed_ids`;
luce.engine.ahead). Segments as in luce.models.batch: qo_indptr [S+1] row offsets, ar_slots
[S] the slot of a segment that is one AR row, -1 otherwise."""
from __future__ import annotations

import numpy as np


def keep_ids(ids, logits_indices, qo_indptr, ar_slots, last_ids: np.ndarray) -> None:
    """ids [L] (the step's greedy id of each logits row logits_indices [L]) -> last_ids
    [max_slots] int32, in place: each AR segment's id at its slot."""
    rows = {int(r): i for i, r in reversed(list(enumerate(np.asarray(logits_indices).tolist())))}
    for s, slot in enumerate(np.asarray(ar_slots).tolist()):
        i = rows.get(int(qo_indptr[s])) if slot >= 0 else None
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
