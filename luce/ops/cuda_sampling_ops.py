"""Greedy argmax, sampling and top-k log-probs of the CUDA backend (mixed into CudaBackend):
the kernels of cuda/sampling.cu and cuda/sample_rng.cu over logits [L, V] on the device,
results copied to the host (the one place a step waits for the GPU). Rows are launched in
groups of 65,535 (the kernels' grid limit); a row holding NaN is an error naming the rows,
as on numpy.

A decode step calls argmax (or sample) once: the ids land in a device buffer kept for the
next call and come back with one copy into pinned host memory (`IdsBuffer`) and one stream
synchronisation; sample's per-row parameters go up in one upload."""
from __future__ import annotations

import ctypes

import numpy as np

from luce.ref.sampling import reject_nan_rows

MAX_ROWS_PER_LAUNCH = 65535


class IdsBuffer:
    """int64 ids [n] on the device and in pinned host memory, reused call after call (grown
    when a call has more rows). `fetch` waits for the stream, so when it returns nothing queued
    still reads or writes either buffer and the next call may reuse them."""

    def __init__(self, backend):
        self.backend = backend
        self.capacity = 0
        self.device = None          # CudaArray [capacity] int64
        self.host = None            # np.ndarray [capacity] int64 over pinned memory
        self._pinned = 0            # its address (runtime.malloc_host)

    def device_ids(self, n: int):
        """The device buffer's first n ids (CudaArray [n] int64)."""
        from luce.ops.cuda_array import CudaArray

        if n > self.capacity:
            self._grow(n)
        return CudaArray(self.device.block, self.device.ptr, (n,), np.int64, self.backend)

    def fetch(self, n: int) -> np.ndarray:
        """The first n ids on the host (a copy the caller owns), after everything queued."""
        b = self.backend
        if n:
            b.runtime.copy_d2h_async(self._pinned, self.device.ptr, 8 * n, b.stream)
        b.synchronize()
        return self.host[:n].copy()

    def _grow(self, n: int) -> None:
        rt = self.backend.runtime
        capacity = max(n, 2 * self.capacity, 64)
        if self._pinned:
            self.backend.synchronize()          # no copy into the old buffer is still queued
            rt.free_host(self._pinned)
        self._pinned = rt.malloc_host(8 * capacity)
        self.host = np.ctypeslib.as_array((ctypes.c_int64 * capacity).from_address(self._pinned))
        self.device = self.backend.empty((capacity,), np.int64)
        self.capacity = capacity


class SamplingOps:
    """Mixin of CudaBackend (uses its empty / upload / to_numpy / _f32 / runtime / stream)."""

    @property
    def _ids(self) -> IdsBuffer:
        ids = self.__dict__.get("_ids_buffer")
        if ids is None:
            ids = self.__dict__["_ids_buffer"] = IdsBuffer(self)
        return ids

    def argmax(self, logits) -> np.ndarray:
        from luce import _cuda_sampling as ks

        logits = self._f32(logits)
        if logits.ndim != 2:
            raise ValueError(f"logits must be [L, V], got shape {logits.shape}")
        L, V = logits.shape
        ids = self._ids.device_ids(L)
        for r0 in range(0, L, MAX_ROWS_PER_LAUNCH):
            r = min(MAX_ROWS_PER_LAUNCH, L - r0)
            ks.argmax(logits.ptr + 4 * r0 * V, ids.ptr + 8 * r0, r, V, stream=self.stream)
        out = self._ids.fetch(L)
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
        if L == 0:
            return np.zeros(0, np.int64)
        ids = self._ids.device_ids(L)
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
        out = self._ids.fetch(L)
        reject_nan_rows(out)
        return out
