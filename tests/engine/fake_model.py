"""A fast stand-in for a luce model that checks what the engine hands it.

KV "pages" store token ids; a slot's "recurrent state" is the token sequence it has seen.
Every forward checks that prompt chunks start at multiples of 64 and, for each live segment, that the pages its CSR lists hold exactly
the slot's recurrent sequence followed by the segment's tokens: a slot that reads another
slot's pages, a reused slot that kept stale state, or a gap in positions all break that.
Logits of a row depend only on the token sequence up to it (crc32 -> normal draws), so a
request's expected output is computable without the engine (`reference_output`).
"""
from __future__ import annotations

import zlib
from types import SimpleNamespace

import numpy as np

from luce.engine.sampler import SamplingParams, sample_token
from luce.engine.scheduler import PREFILL_ALIGN
from luce.models.batch import ForwardOutput
from luce.models.kv_cache import PAGE_SIZE, ModelState

VOCAB = 48


def logits_for(seq) -> np.ndarray:
    """logits [V] f32 after the token sequence `seq`."""
    seed = zlib.crc32(np.asarray(seq, np.int64).tobytes())
    return np.random.default_rng(seed).standard_normal(VOCAB).astype(np.float32)


def reference_output(prompt, params: SamplingParams, seed: int, eos_ids=()) -> list[int]:
    """Tokens the engine must produce for `prompt` (max_tokens, stop ids and eos only)."""
    seq, out = list(prompt), []
    while len(out) < params.max_tokens:
        tok = sample_token(logits_for(seq), params, seed, len(seq), prompt, out)
        out.append(tok)
        seq.append(tok)
        if tok in params.stop_token_ids or (tok in eos_ids and not params.ignore_eos):
            break
    return out


class SequenceStore:
    """RecurrentStore: per slot, the token sequence seen so far (an int64 array)."""

    def __init__(self, max_slots: int):
        self.seq = [np.zeros(0, np.int64) for _ in range(max_slots)]

    def reset_slot(self, slot: int) -> None:
        self.seq[slot] = np.zeros(0, np.int64)

    def snapshot(self, slot: int):
        return self.seq[slot]

    def restore(self, slot: int, snap) -> None:
        self.seq[slot] = snap

    def checkpoint(self, slots) -> None:
        self.saved = {int(s): self.seq[s] for s in slots}   # only these: what the step's forward changes

    def rollback(self) -> None:
        for s, seq in self.saved.items():
            self.seq[s] = seq


class FakeKV:
    def __init__(self, n_pages: int):
        self.tokens = np.full((n_pages, PAGE_SIZE), -1, np.int64)


class FakeModel:
    def __init__(self, check_alignment: bool = True):
        self.check_alignment = check_alignment
        self.config = SimpleNamespace(vocab=VOCAB, context_length=1 << 20)
        self.backend = SimpleNamespace(to_numpy=np.asarray, argmax=lambda x: np.argmax(x, axis=1), name="fake")
        self.violations: list[str] = []
        self.forwards = 0

    def new_state(self, max_pages: int, max_slots: int) -> ModelState:
        return ModelState(max_pages, max_slots, kv={0: FakeKV(max_pages)}, recurrent=SequenceStore(max_slots))

    def forward(self, batch, state: ModelState) -> ForwardOutput:
        batch.validate()
        self.forwards += 1
        kv, store = state.kv[0].tokens, state.recurrent
        pages, offsets, _ = batch.row_kv_locations()
        live = pages >= 0
        kv[pages[live], offsets[live]] = batch.token_ids[live]
        row_seq = {}
        for s in range(batch.n_segments):
            slot = int(batch.seq_slots[s])
            r0, r1 = batch.segment_rows(s)
            if slot < 0:
                continue
            if self.check_alignment and r1 - r0 > 1 and batch.positions[r0] % PREFILL_ALIGN:
                self.violations.append(f"slot {slot}: prompt chunk starts at {batch.positions[r0]}, "
                                       f"not a multiple of {PREFILL_ALIGN}")
            stored = kv[batch.segment_pages(s)].reshape(-1)[:batch.kv_len(s)]
            expected = np.concatenate([store.seq[slot], batch.token_ids[r0:r1].astype(np.int64)])
            if not np.array_equal(stored, expected):
                self.violations.append(f"slot {slot}: pages hold {stored.tolist()[-8:]}, state+rows "
                                       f"{expected.tolist()[-8:]} (len {len(stored)} vs {len(expected)})")
            store.seq[slot] = expected
            for j, row in enumerate(range(r0, r1)):
                row_seq[row] = (slot, len(expected) - (r1 - r0) + j + 1)
        logits = []
        for row in batch.logits_indices.tolist():
            slot, n = row_seq[row]
            logits.append(logits_for(store.seq[slot][:n]))
        return ForwardOutput(np.asarray(logits, np.float32).reshape(-1, VOCAB))
