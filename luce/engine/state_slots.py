"""Per-slot recurrent state (conv window and GDN state of every GDN layer) and its snapshots.

The arrays live in the model's state (`ModelState.recurrent`, e.g.
luce.models.recurrent_state.RecurrentState: conv `[K-1, C]` and GDN `[Hv, Dk, Dv]` f32 per
layer and slot); this class adds what the engine needs around them:
- an owner per slot (the request id whose sequence the state holds), so a step can check that
  every live row reads only state its request owns;
- re-initialisation on assignment: a reused slot starts from zeros, never from the previous
  request's state;
- a snapshot table of fixed capacity (`max_snapshots` entries, ids 0..max_snapshots-1), the
  prefix cache's and rollback's storage; each entry remembers its source slot and the
  sequence length it was taken at.
Slot -1 is the padding row: no state, never owned, never assigned.
Dense models have no recurrent store; owners and snapshot bookkeeping still work (a snapshot
then holds no arrays).
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import numpy as np

PADDING_SLOT = -1


class SnapshotTableFull(RuntimeError):
    """Every snapshot entry is in use; nothing was changed."""


@dataclass(frozen=True)
class SnapshotEntry:
    source_slot: int      # the slot it was taken from
    owner: Any            # the request id that owned the slot then
    length: int           # tokens of that sequence the state covers
    state: Any            # the store's snapshot object (None for dense models)


class StateSlots:
    def __init__(self, model_state, max_snapshots: int = 0):
        """`model_state`: a luce.models.kv_cache.ModelState (its `recurrent` may be None)."""
        if max_snapshots < 0:
            raise ValueError(f"max_snapshots must be >= 0, got {max_snapshots}")
        self.model_state = model_state
        self.max_slots = int(model_state.max_slots)
        self.owner: list[Any] = [None] * self.max_slots
        self.snapshots: list[SnapshotEntry | None] = [None] * max_snapshots

    @property
    def recurrent(self):
        return self.model_state.recurrent

    def _check_slot(self, slot: int) -> None:
        if slot == PADDING_SLOT:
            raise IndexError("slot -1 is the padding row: it has no recurrent state")
        if not 0 <= slot < self.max_slots:
            raise IndexError(f"slot {slot} out of range [0, {self.max_slots})")

    # ---- ownership ------------------------------------------------------------------------
    def assign(self, slot: int, owner) -> None:
        """Give `slot` to `owner` with freshly zeroed state (whatever it held before)."""
        self._check_slot(slot)
        if owner is None:
            raise ValueError("a slot's owner cannot be None")
        if self.owner[slot] is not None:
            raise RuntimeError(f"slot {slot} is still owned by {self.owner[slot]!r}; release it first")
        self.model_state.reset_slot(slot)
        self.owner[slot] = owner

    def release(self, slot: int) -> None:
        """Forget the owner. The arrays are left as they are and zeroed on the next assign."""
        self._check_slot(slot)
        self.owner[slot] = None

    def owns(self, slot: int, owner) -> bool:
        return 0 <= slot < self.max_slots and owner is not None and self.owner[slot] == owner

    # ---- snapshots ------------------------------------------------------------------------
    def capture(self, slot: int):
        """The slot's current state as an untracked snapshot object (a pure read)."""
        self._check_slot(slot)
        store = self.recurrent
        return None if store is None else _store_call(store, "snapshot", slot)

    def put(self, slot: int, state) -> None:
        """Write a captured state back into `slot` (rollback)."""
        self._check_slot(slot)
        if self.recurrent is not None:
            _store_call(self.recurrent, "restore", slot, state)

    def save(self, slot: int, length: int) -> int:
        """Store `slot`'s state (covering `length` tokens) in the first free entry; its id."""
        self._check_slot(slot)
        if self.owner[slot] is None:
            raise RuntimeError(f"slot {slot} is not owned: there is no sequence to snapshot")
        for sid, entry in enumerate(self.snapshots):
            if entry is None:
                self.snapshots[sid] = SnapshotEntry(slot, self.owner[slot], int(length), self.capture(slot))
                return sid
        raise SnapshotTableFull(f"all {len(self.snapshots)} snapshot entries are in use; drop one or "
                                "raise max_snapshots")

    def entry(self, sid: int) -> SnapshotEntry:
        if not 0 <= sid < len(self.snapshots) or self.snapshots[sid] is None:
            raise KeyError(f"snapshot {sid} does not exist (table of {len(self.snapshots)} entries)")
        return self.snapshots[sid]

    def restore(self, slot: int, sid: int) -> int:
        """Put snapshot `sid` into `slot` (owned); returns the length it covers."""
        entry = self.entry(sid)
        self._check_slot(slot)
        if self.owner[slot] is None:
            raise RuntimeError(f"slot {slot} is not owned: assign it before restoring a snapshot")
        self.put(slot, entry.state)
        return entry.length

    def drop(self, sid: int) -> None:
        self.entry(sid)
        self.snapshots[sid] = None

    # ---- checks -----------------------------------------------------------------------------
    def digest(self) -> str:
        """Hash of owners, snapshot table and every slot's state bytes: equal iff unchanged."""
        h = hashlib.sha256(repr((self.owner, [None if e is None else (e.source_slot, e.owner, e.length)
                                              for e in self.snapshots])).encode())
        store = self.recurrent
        if store is not None:
            for slot in range(self.max_slots):
                _hash_tree(h, _store_call(store, "snapshot", slot))
        for e in self.snapshots:
            if e is not None:
                _hash_tree(h, e.state)
        return h.hexdigest()

    def check(self) -> None:
        n = len(self.snapshots)
        for sid, e in enumerate(self.snapshots):
            assert 0 <= sid < n
            if e is not None:
                assert 0 <= e.source_slot < self.max_slots, f"snapshot {sid} from slot {e.source_slot}"
                assert e.length >= 0


def _store_call(store, name: str, *args):
    fn = getattr(store, name, None)
    if fn is None:
        raise TypeError(f"{type(store).__name__} has no {name}(): StateSlots needs a recurrent store "
                        "with snapshot(slot) and restore(slot, snap)")
    return fn(*args)


def _hash_tree(h, obj) -> None:
    """Feed every array reachable from obj (dicts, tuples, lists, dataclass-like .layers) into h."""
    if obj is None:
        h.update(b"N")
    elif isinstance(obj, np.ndarray):
        h.update(str(obj.shape).encode() + np.ascontiguousarray(obj).tobytes())
    elif isinstance(obj, dict):
        for key in sorted(obj):
            h.update(repr(key).encode())
            _hash_tree(h, obj[key])
    elif isinstance(obj, (list, tuple)):
        for item in obj:
            _hash_tree(h, item)
    elif hasattr(obj, "layers"):
        _hash_tree(h, obj.layers)
    else:
        to_numpy = getattr(obj, "to_numpy", None)
        h.update(np.asarray(to_numpy() if to_numpy else obj).tobytes())
