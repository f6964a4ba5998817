"""Greedy argmax and top-k log-probs of the CUDA backend (mixed into CudaBackend): the
kernels of cuda/sampling.cu over logits [L, V] on the device, results copied to the host
(the one place a step waits for the GPU). Rows are launched in groups of 65,535 (the
kernels' grid limit); a row holding NaN is an error naming the rows, as on numpy."""
from __future__ import annotations

import numpy as np

from luce.ref.sampling import reject_nan_rows

MAX_ROWS_PER_LAUNCH = 65535


class SamplingOps:
    """Mixin of CudaBackend (uses its empty / to_numpy / _f32 / stream)."""

    def argmax(self, logits) -> np.ndarray:
        from luce import _cuda_sampling as ks

        logits = self._f32(logits)
        if logits.ndim != 2:
            raise ValueError(f"logits must be [L, V], got shape {logits.shape}")
        L, V = logits.shape
        ids = self.empty((L,), np.int64)
        for r0 in range(0, L, MAX_ROWS_PER_LAUNCH):
            r = min(MAX_ROWS_PER_LAUNCH, L - r0)
            ks.argmax(logits.ptr + 4 * r0 * V, ids.ptr + 8 * r0, r, V, stream=self.stream)
        out = self.to_numpy(ids)
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
        ids = self.empty((L,), np.int64)
        work = self.empty((-(-int(kr.workspace_bytes(min(L, MAX_ROWS_PER_LAUNCH), V)) // 8),), np.int64)
        as_i64 = lambda x, dtype: np.ascontiguousarray(np.asarray(x, dtype)).view(np.int64)  # noqa: E731 - same bytes
        args = [self.upload(a) for a in (
            as_i64(temperature, np.float64), top_k, as_i64(top_p, np.float64), as_i64(min_p, np.float64),
            as_i64(seed, np.uint64), np.asarray(position, np.int64))]
        for r0 in range(0, L, MAX_ROWS_PER_LAUNCH):
            r = min(MAX_ROWS_PER_LAUNCH, L - r0)
            t, k, p, m, s, pos = (a.ptr + a.dtype.itemsize * r0 for a in args)
            kr.sample_rng(logits.ptr + 4 * r0 * V, t, k, p, m, s, pos, ids.ptr + 8 * r0, work.ptr, work.nbytes,
                          r, V, stream=self.stream)
        out = self.to_numpy(ids)
        reject_nan_rows(out)
        return out
