"""Output digests: the benchmark's correctness record of every run.

Each complete output gets sha256(text as UTF-8). Outputs are keyed by what must determine
them under greedy decoding, f"{prompt id}|max_tokens={M}", not by concurrency or arrival
time: luce promises the same bytes alone or among other requests, so every request with one
key must give one digest. An incomplete request (error, no output) counts as the digest
"INCOMPLETE:<first 80 chars of the error>".

A run's output set is the set of distinct (key, digest) pairs; its digest is sha256 of the
sorted lines f"{key}\t{digest}\n". Two runs produced the same outputs iff their output-set
digests are equal (for the keys both ran; a different benchmark configuration gives
different keys, and so a different set).
"""
from __future__ import annotations

import hashlib
from typing import Iterable

from luce.benchmark.records import RequestRecord


def text_digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def record_digest(record: RequestRecord) -> str:
    if not record.ok:
        return "INCOMPLETE:" + (record.error or "no output")[:80]
    return text_digest(record.text)


def output_set(records: Iterable[RequestRecord]) -> dict[str, list[str]]:
    """key -> sorted distinct digests seen for it (one per key in a consistent run)."""
    seen: dict[str, set[str]] = {}
    for record in records:
        seen.setdefault(record.key, set()).add(record_digest(record))
    return {key: sorted(digests) for key, digests in sorted(seen.items())}


def output_set_digest(outputs: dict[str, list[str]]) -> str:
    lines = sorted(f"{key}\t{digest}\n" for key, digests in outputs.items() for digest in digests)
    return hashlib.sha256("".join(lines).encode("utf-8")).hexdigest()


def inconsistent_keys(outputs: dict[str, list[str]]) -> list[str]:
    """Keys with more than one distinct output: the output depended on what ran beside it."""
    return [key for key, digests in outputs.items() if len(digests) > 1]


def differing_keys(a: dict[str, list[str]], b: dict[str, list[str]]) -> list[str]:
    """Keys whose digests differ between two output sets (or that only one of them has)."""
    return sorted(key for key in set(a) | set(b) if a.get(key) != b.get(key))


def summarize_outputs(records: Iterable[RequestRecord]) -> dict:
    """{"set_digest", "outputs", "inconsistent_keys", "incomplete"} for a run's report."""
    records = list(records)
    outputs = output_set(records)
    return {
        "set_digest": output_set_digest(outputs),
        "outputs": outputs,
        "inconsistent_keys": inconsistent_keys(outputs),
        "incomplete": sum(1 for r in records if not r.ok),
    }
