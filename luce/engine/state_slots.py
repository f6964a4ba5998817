"""Per-slot recurrent state ownership (conv window and GDN state of every GDN layer).

The arrays live in the model's state (`ModelState.recurrent`, e.g.
luce.models.recurrent_state.RecurrentState: conv `[K-1, C]` and GDN `[Hv, Dk, Dv]` f32 per
layer and slot); this class adds what the engine needs around them:
- an owner per slot (the request id whose sequence the state holds), so a step can check that
  every live row reads only state its request owns;
- re-initialisation on assignment: a reused slot starts from zeros, never from the previous
  request's state.
Slot -1 is the padding row: no state, never owned, never assigned. Dense models have no
recurrent store; owners still work.
"""
from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

PADDING_SLOT = -1


class StateSlots:
    def __init__(self, model_state):
        """`model_state`: a luce.models.kv_cache.ModelState (its `recurrent` may be None)."""
        self.model_state = model_state
        self.max_slots = int(model_state.max_slots)
        self.owner: list[Any] = [None] * self.max_slots

    @property
    def recurrent(self):
        return self.model_state.recurrent

    def _check_slot(self, slot: int) -> None:
        if slot == PADDING_SLOT:
            raise IndexError("slot -1 is the padding row: it has no recurrent state")
        if not 0 <= slot < self.max_slots:
            raise IndexError(f"slot {slot} out of range [0, {self.max_slots})")

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

    def digest(self) -> str:
        """Hash of the owners and every slot's state bytes: equal iff unchanged."""
        h = hashlib.sha256(repr(self.owner).encode())
        store = self.recurrent
        if store is not None and hasattr(store, "snapshot"):
            for slot in range(self.max_slots):
                _hash_tree(h, store.snapshot(slot))
        return h.hexdigest()


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
