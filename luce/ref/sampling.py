"""Greedy and top-k references (kernel: cuda/sampling.cu).

Ties go to the lowest token id (DESIGN.md section 5 rule 5); NaN logits are an error."""
from __future__ import annotations

import numpy as np


def _check(logits: np.ndarray) -> np.ndarray:
    logits = np.asarray(logits)
    if logits.ndim != 2:
        raise ValueError(f"logits must be [L, V], got shape {logits.shape}")
    if np.isnan(logits).any():
        rows = np.nonzero(np.isnan(logits).any(axis=1))[0].tolist()
        raise ValueError(f"NaN in logits rows {rows[:8]}: the forward pass diverged")
    return logits


def reject_nan_rows(ids: np.ndarray) -> None:
    """Kernels mark a row holding NaN with id -1: name those rows in an error."""
    ids = np.asarray(ids)
    if ids.size and ids.min() < 0:
        bad = np.nonzero(ids < 0)[0]
        raise ValueError(f"NaN in logits rows {bad[:8].tolist()}: the forward pass diverged")


def argmax(logits: np.ndarray) -> np.ndarray:
    """logits [L, V] -> [L] int64: index of each row's maximum, lowest id on ties."""
    return np.argmax(_check(logits), axis=1).astype(np.int64)  # numpy returns the first max


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """logits [L, V] -> [L, V] float64 log-probabilities."""
    x = _check(logits).astype(np.float64)
    m = x.max(axis=1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=1, keepdims=True))


def top_k_logprobs(logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """logits [L, V] -> (ids [L, k] int64, logprobs [L, k] f32): the k most likely tokens of
    each row, best first, ties to the lowest id; log-softmax over the whole row."""
    logits = _check(logits)
    if not 1 <= k <= logits.shape[1]:
        raise ValueError(f"top_k_logprobs: k={k} not in 1..{logits.shape[1]}")
    lp = log_softmax(logits)
    # stable sort on the negated value keeps lower ids first among equal values
    ids = np.argsort(-lp, axis=1, kind="stable")[:, :k]
    return ids.astype(np.int64), np.take_along_axis(lp, ids, axis=1).astype(np.float32)
