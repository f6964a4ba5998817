"""Token ids between decode steps on the CUDA backend (mixed into CudaBackend): what lets the
engine launch a greedy decode step before the previous step's ids reach the host
(luce.engine.ahead).

`keep_ids` (inside the previous step's graph, after its argmax) stores each AR segment's id
at its slot of an engine-wide device array; `feed_ids` (the first launch of the next step's
graph) writes them into that step's token ids in its metadata arena (cuda/step_ids.cu); a step
whose ids the host has puts them there first (`put_ids`), so it replays the same graph. The
host learns a step's ids with `ids_start` (a copy into pinned memory and an event, queued
right after the step) and `ids_wait` (that event only: steps queued after it keep running);
`ids_to_host` is the two, for a caller that waits at once."""
from __future__ import annotations

import ctypes

import numpy as np

from luce.ops import cuda_step_meta
from luce.ref.sampling import reject_nan_rows


class PinnedIds:
    """Pinned int64 buffers for ids copied to the host, each with an event, handed out in turn:
    a copy may be queued into one while an earlier one is still to be read (a step ahead's);
    a buffer is reused once its event has completed. Freed with the object (a larger set
    replaces it only after the stream has drained; a handle keeps its set alive)."""

    RING = 4

    def __init__(self, backend, capacity: int):
        rt = backend.runtime
        self.backend, self.capacity = backend, capacity
        self.base = rt.malloc_host(8 * capacity * self.RING)
        self.host = np.ctypeslib.as_array((ctypes.c_int64 * (capacity * self.RING)).from_address(self.base))
        self.events = [rt.event_create() for _ in range(self.RING)]
        self.pending = [False] * self.RING
        self.next = 0

    def __del__(self):
        try:
            self.backend.runtime.free_host(self.base)
        except Exception:  # noqa: BLE001 - the runtime may be gone at exit
            pass

    def start(self, ids) -> tuple:
        b, i = self.backend, self.next
        self.next = (i + 1) % self.RING
        if self.pending[i]:
            b.runtime.event_synchronize(self.events[i])
        n = ids.size
        if n:
            b.runtime.copy_d2h_async(self.base + 8 * i * self.capacity, ids.ptr, 8 * n, b.stream)
        b.runtime.event_record(self.events[i], b.stream)
        self.pending[i] = True
        return self, i, n

    def wait(self, handle: tuple) -> np.ndarray:
        _, i, n = handle
        self.backend.runtime.event_synchronize(self.events[i])
        self.pending[i] = False
        return self.host[i * self.capacity:i * self.capacity + n].copy()


class IdsOps:
    """Mixin of CudaBackend (uses its runtime, stream, zeros)."""

    def ids_store(self, n_slots: int):
        """The engine-wide array keep_ids writes and feed_ids reads: [n_slots] int32, zeros."""
        return self.zeros((n_slots,), np.int32)

    def keep_ids(self, ids, batch, last_ids, every_segment: bool = False) -> None:
        """ids [L] int64 (the step's argmax, on the device) -> last_ids[slot] of each AR segment
        (every_segment: the id of each live segment's last row)."""
        from luce import _cuda_step_ids as k

        meta = cuda_step_meta.meta_of(self, batch)
        slots = meta.ptr("seq_slots" if every_segment else "ar_slots")
        k.keep_ids(ids.ptr, meta.ptr("logits_indices"), meta.ptr("qo_indptr"), slots, last_ids.ptr,
                   int(ids.size), batch.n_segments, stream=self.stream)

    def put_ids(self, batch, last_ids) -> None:
        """last_ids[slot] = the host token id of each AR row (one upload, queued), for a step
        whose ids the host has: its graph's feed_ids then gives them back."""
        from luce.ref.step_ids import put_ids

        host = np.zeros(last_ids.shape[0], np.int32)
        put_ids(batch.token_ids, batch.qo_indptr, batch.ar_slots, host)
        self.staging.upload(last_ids.ptr, host)

    def feed_ids(self, batch, last_ids, vocab: int) -> None:
        """The batch's AR rows take their slots' kept ids (its arena's token ids)."""
        from luce import _cuda_step_ids as k

        meta = cuda_step_meta.meta_of(self, batch)
        k.feed_ids(meta.ptr("token_ids"), meta.ptr("qo_indptr"), meta.ptr("ar_slots"), last_ids.ptr,
                   batch.n_segments, vocab, stream=self.stream)

    def ids_start(self, ids):
        """Queue the copy of device ids [L] int64 to the host, after the work queued before;
        -> a handle for ids_wait."""
        pinned = self.__dict__.get("_pinned_ids")
        if pinned is None or ids.size > pinned.capacity:
            if pinned is not None:
                self.synchronize()                 # no copy into the old set is still queued
            pinned = self.__dict__["_pinned_ids"] = PinnedIds(self, max(int(ids.size), 64))
        return pinned.start(ids)

    def ids_wait(self, handle) -> np.ndarray:
        """The host ids of an ids_start, once that copy has run (later work may still run)."""
        return handle[0].wait(handle)

    def ids_to_host(self, ids) -> np.ndarray:
        """Device ids [L] int64 (argmax_ids', sample_ids') -> host array, after the work queued
        before; a NaN row (-1) is an error naming the rows."""
        out = self.ids_wait(self.ids_start(ids))
        reject_nan_rows(out)
        return out
