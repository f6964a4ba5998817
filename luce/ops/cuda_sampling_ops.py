"""Greedy argmax, sampling and top-k log-probs of the CUDA backend (mixed into CudaBackend):
the kernels of cuda/sampling.cu and cuda/sample_rng.cu over logits [L, V] on the device,
results copied to the host (the one place a step waits for the GPU). Rows are launched in
groups of 65,535 (the kernels' grid limit); a row holding NaN is an error naming the rows,
as on numpy.

`argmax_ids` leaves the ids on the device without waiting, so a captured forward can hold
the argmax (luce.models.graphed_forward, greedy_ids); `ids_to_host` brings ids back with one
copy into pinned host memory (`PinnedIds`) and one stream synchronisation. `argmax` is the
two; `sample` sends its six per-row parameters up in one upload."""
from __future__ import annotations

import ctypes

import numpy as np

from luce.ref.sampling import reject_nan_rows

MAX_ROWS_PER_LAUNCH = 65535


class PinnedIds:
    """Pinned host memory for int64 ids, reused call after call (grown when a call has more).
    `fetch` waits for the stream, so when it returns no copy into the buffer is queued and the
    next call may reuse it."""

    def __init__(self, backend):
        self.backend = backend
        self.capacity = 0
        self.host = None            # np.ndarray [capacity] int64 over the pinned memory
        self._address = 0           # runtime.malloc_host's

    def fetch(self, ids) -> np.ndarray:
        """Device ids [n] int64 -> a host copy the caller owns, after everything queued."""
        b, n = self.backend, ids.size
        if n == 0:
            b.synchronize()
            return np.zeros(0, np.int64)
        if n > self.capacity:
            self._grow(n)
        b.runtime.copy_d2h_async(self._address, ids.ptr, 8 * n, b.stream)
        b.synchronize()
        return self.host[:n].copy()

    def _grow(self, n: int) -> None:
        rt = self.backend.runtime
        capacity = max(n, 2 * self.capacity, 64)
        if self._address:
            self.backend.synchronize()          # no copy into the old buffer is still queued
            rt.free_host(self._address)
        self._address = rt.malloc_host(8 * capacity)
        self.host = np.ctypeslib.as_array((ctypes.c_int64 * capacity).from_address(self._address))
        self.capacity = capacity


class SamplingOps:
    """Mixin of CudaBackend (uses its empty / upload / to_numpy / _f32 / runtime / stream)."""

    def argmax(self, logits) -> np.ndarray:
        return self.ids_to_host(self.argmax_ids(logits))

    def argmax_ids(self, logits):
        """logits [L, V] -> [L] int64 device array of each row's argmax (lowest id on ties, -1
        on a row holding NaN), queued on the stream: nothing waits."""
        from luce import _cuda_sampling as ks

        logits = self._f32(logits)
        if logits.ndim != 2:
            raise ValueError(f"logits must be [L, V], got shape {logits.shape}")
        L, V = logits.shape
        ids = self.empty((L,), np.int64)
        for r0 in range(0, L, MAX_ROWS_PER_LAUNCH):
            r = min(MAX_ROWS_PER_LAUNCH, L - r0)
            ks.argmax(logits.ptr + 4 * r0 * V, ids.ptr + 8 * r0, r, V, stream=self.stream)
        return ids

    def ids_to_host(self, ids) -> np.ndarray:
        """Device ids [L] int64 (argmax_ids') -> host array, after the work queued before; a
        NaN row (-1) is an error naming the rows."""
        pinned = self.__dict__.get("_pinned_ids")
        if pinned is None:
            pinned = self.__dict__["_pinned_ids"] = PinnedIds(self)
        out = pinned.fetch(ids)
        reject_nan_rows(out)
        return out

    def top_k_logprobs(self, logits, k: int):
        from luce import _cuda_sampling as ks
        from luce.ref import sampling as ref_sampling

        logits = self._f32(logits)
        if logits.ndim != 2:
            raise ValueError(f"logits must be [L, V], got shape {logits.shape}")
        L, V = logits.shape
        if not 1 <= k <= V:
            raise ValueError(f"top_k_logprobs: k={k} not in 1..{V}")
        if k > ks.TOPK_MAX or L == 0:
            return ref_sampling.top_k_logprobs(self.to_numpy(logits), k)
        ids, lps = self.empty((L, k), np.int64), self.empty((L, k))
        for r0 in range(0, L, MAX_ROWS_PER_LAUNCH):
            r = min(MAX_ROWS_PER_LAUNCH, L - r0)
            ks.top_k_logprobs(logits.ptr + 4 * r0 * V, ids.ptr + 8 * r0 * k, lps.ptr + 4 * r0 * k, r, V, k,
                              stream=self.stream)
        host_ids = self.to_numpy(ids)
        reject_nan_rows(host_ids[:, 0])
        return host_ids, self.to_numpy(lps)

    def sample(self, logits, temperature, top_k, top_p, min_p, seed, position) -> np.ndarray:
        return self.ids_to_host(self.sample_ids(logits, temperature, top_k, top_p, min_p, seed, position))

    def sample_ids(self, logits, temperature, top_k, top_p, min_p, seed, position):
        """sample's draws left on the device ([L] int64, -1 on a NaN row), queued: nothing waits."""
        from luce import _cuda_sample_rng as kr

        logits = self._f32(logits)
        if logits.ndim != 2:
            raise ValueError(f"logits must be [L, V], got shape {logits.shape}")
        L, V = logits.shape
        top_k = np.asarray(top_k, dtype=np.int32)
        temperature = np.asarray(temperature, dtype=np.float64)
        sampled = temperature != 0.0
        if ((top_k < 1) | (top_k > kr.TOPK_MAX))[sampled].any():
            raise ValueError(f"device sampling takes 1 <= top_k <= {kr.TOPK_MAX} for sampled rows, got "
                             f"{sorted(set(top_k[sampled].tolist()))}: sample those rows on the host")
        ids = self.empty((L,), np.int64)
        if L == 0:
            return ids
        work = self.empty((-(-int(kr.workspace_bytes(min(L, MAX_ROWS_PER_LAUNCH), V)) // 8),), np.int64)
        # the six per-row parameters, one 8-byte row each, in one upload (top_k: int32 in its row's first half)
        params = np.zeros((6, L), np.int64)
        params[0].view(np.float64)[:] = temperature
        params[1].view(np.int32)[:L] = top_k
        params[2].view(np.float64)[:] = np.asarray(top_p, np.float64)
        params[3].view(np.float64)[:] = np.asarray(min_p, np.float64)
        params[4].view(np.uint64)[:] = np.asarray(seed, np.uint64)
        params[5] = np.asarray(position, np.int64)
        device = self.upload(params)
        for r0 in range(0, L, MAX_ROWS_PER_LAUNCH):
            r = min(MAX_ROWS_PER_LAUNCH, L - r0)
            t, p, m, s, pos = (device.ptr + 8 * (row * L + r0) for row in (0, 2, 3, 4, 5))
            k = device.ptr + 8 * L + 4 * r0
            kr.sample_rng(logits.ptr + 4 * r0 * V, t, k, p, m, s, pos, ids.ptr + 8 * r0, work.ptr, work.nbytes,
                          r, V, stream=self.stream)
        return ids
