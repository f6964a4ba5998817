"""Greedy argmax, sampling and top-k log-probs of the CUDA backend (mixed into CudaBackend):
the kernels of cuda/sampling.cu and cuda/sample_rng.cu over logits [L, V] on the device,
results copied to the host (the one place a step waits for the GPU). Rows are launched in
groups of 65,535 (the kernels' grid limit); a row holding NaN is an error naming the rows,
as on numpy.

`argmax_ids` leaves the ids on the device without waiting, so a captured forward can hold
the argmax (luce.models.graphed_forward, greedy_ids); `ids_to_host` (luce.ops.cuda_ids_ops)
brings ids back through pinned host memory. `argmax` is the two; `sample` sends its six
per-row parameters up in one upload."""
from __future__ import annotations

import numpy as np

from luce.ref.sampling import reject_nan_rows

MAX_ROWS_PER_LAUNCH = 65535
TOP_K_ROWS_PER_LAUNCH = 1024   # bounds top-k's workspace (a row of 248,320 logits: 31 slices' lists)


class SamplingOps:
    """Mixin of CudaBackend (uses its empty / upload / to_numpy / _f32 / runtime / stream and
    IdsOps.ids_to_host)."""

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

    def top_k_logprobs(self, logits, k: int):
        return self.top_k_logprobs_wait(self.top_k_logprobs_start(logits, k))

    def top_k_logprobs_start(self, logits, k: int):
        """top_k_logprobs queued on the stream (-> a handle for top_k_logprobs_wait): a caller
        that launches more work before it needs the result does not wait here."""
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
        step = min(L, TOP_K_ROWS_PER_LAUNCH)
        work = self.empty((-(-int(ks.workspace_bytes(step, V, k)) // 8),), np.int64)
        for r0 in range(0, L, step):
            r = min(step, L - r0)
            ks.top_k_logprobs(logits.ptr + 4 * r0 * V, ids.ptr + 8 * r0 * k, lps.ptr + 4 * r0 * k, work.ptr,
                              work.nbytes, r, V, k, stream=self.stream)
        return ids, lps

    def top_k_logprobs_wait(self, handle) -> tuple[np.ndarray, np.ndarray]:
        """The host (ids [L, k] int64, logprobs [L, k] f32) of a top_k_logprobs_start."""
        ids, lps = handle
        if isinstance(ids, np.ndarray):
            return ids, lps
        host_ids, host_lps = np.empty(ids.shape, np.int64), np.empty(lps.shape, np.float32)
        if host_ids.size:      # both copies queued, one wait
            self.runtime.copy_d2h_async(host_ids.ctypes.data, ids.ptr, host_ids.nbytes, self.stream)
            self.runtime.copy_d2h_async(host_lps.ctypes.data, lps.ptr, host_lps.nbytes, self.stream)
        self.synchronize()
        reject_nan_rows(host_ids[:, 0])
        return host_ids, host_lps

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
