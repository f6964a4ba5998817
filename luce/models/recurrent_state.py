"""Per-slot recurrent state of the qwen35 hybrid model (DESIGN.md section 3).

For every Gated DeltaNet layer and every slot: the conv window `conv [K-1, C] f32` (the
last K-1 inputs of the causal conv1d, oldest first) and the delta-rule state
`gdn [Hv, Dk, Dv] f32`. They live in one resident pool per layer and kind
(`pools(il)`: conv [slots, K-1, C], gdn [slots, Hv, Dk, Dv]) at fixed addresses, which the
one-launch decode ops update in place and a captured graph keeps; `conv(il, slot)` is a view
of a slot, `store` copies an op's result into it, a snapshot is a copy. The pools of every
layer are views of one array per kind ([layers, slots, ...]), so `checkpoint(slots)` saves the
state of a step's prefill and AR slots in one gather per kind (take_rows over rows
il * max_slots + slot; save buffers [layers * len(slots), ...]) and `rollback` scatters them
back (put_rows): the engine's undo of a step that failed after its forward advanced those
rows in place. Slots outside the step are never copied (`copied_bytes` counts what is).
A fresh or reset slot holds zeros, which is what transformers starts a sequence from.

Tree verify (speculation) leaves a slot's state as it is; what the commit needs comes back
from the forward (ForwardOutput.staged, one luce.ops.api.TreeStage per layer) and `commit`
advances every layer of every tree slot of the step along its accepted path, one launch per
op per layer (luce.models.commit).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np


def _nbytes(a) -> int:
    return math.prod(a.shape) * np.dtype(a.dtype).itemsize


@dataclass(frozen=True)
class SlotSnapshot:
    """One slot's recurrent state at a point in time: {layer: (conv, gdn)}."""

    layers: dict


class RecurrentState:
    """conv and GDN state of `gdn_layers` for `max_slots` slots (luce.models.kv_cache.RecurrentStore)."""

    def __init__(self, backend, gdn_layers: Sequence[int], max_slots: int,
                 conv_shape: tuple[int, int], gdn_shape: tuple[int, int, int]):
        if max_slots <= 0:
            raise ValueError(f"RecurrentState needs at least one slot, got max_slots={max_slots}")
        self.backend = backend
        self.gdn_layers = tuple(gdn_layers)
        self.max_slots = max_slots
        self.conv_shape = tuple(conv_shape)   # (K-1, C)
        self.gdn_shape = tuple(gdn_shape)     # (Hv, Dk, Dv)
        n = len(self.gdn_layers)
        self._all = (backend.zeros((n, max_slots, *self.conv_shape)), backend.zeros((n, max_slots, *self.gdn_shape)))
        self._conv: dict[int, Any] = {il: self._all[0][i] for i, il in enumerate(self.gdn_layers)}
        self._gdn: dict[int, Any] = {il: self._all[1][i] for i, il in enumerate(self.gdn_layers)}
        # the pools as rows [layers * slots, K-1 * C] and [layers * slots, Hv * Dk * Dv] (row il * slots + slot)
        self._flat = tuple(a.reshape(n * max_slots, math.prod(shape))
                           for a, shape in zip(self._all, (self.conv_shape, self.gdn_shape)))
        self._saved = None            # (slots given, sorted slots, rows, (conv, gdn) save buffers, bytes) of the last checkpoint
        # sorted slots -> their rows of every layer (a step's slots repeat step after step; the
        # rows depend only on them and the pools' fixed layout, so an entry never goes stale)
        self._rows: dict[tuple[int, ...], np.ndarray] = {}
        self.copied_bytes = 0         # bytes copied by checkpoints and rollbacks

    def _check(self, layer: int, slot: int) -> None:
        if layer not in self._conv:
            raise KeyError(f"layer {layer} is not a Gated DeltaNet layer (those are {self.gdn_layers})")
        if not 0 <= slot < self.max_slots:
            raise IndexError(f"slot {slot} out of range [0, {self.max_slots}); padding rows "
                             "(slot -1) have no recurrent state")

    def conv(self, layer: int, slot: int):
        """Conv window [K-1, C] of (layer, slot)."""
        self._check(layer, slot)
        return self._conv[layer][slot]

    def gdn(self, layer: int, slot: int):
        """Delta-rule state [Hv, Dk, Dv] of (layer, slot)."""
        self._check(layer, slot)
        return self._gdn[layer][slot]

    def pools(self, layer: int):
        """(conv [slots, K-1, C], gdn [slots, Hv, Dk, Dv]) of a GDN layer, updated in place."""
        self._check(layer, 0)
        return self._conv[layer], self._gdn[layer]

    def store(self, layer: int, slot: int, conv, gdn) -> None:
        """Write the arrays an op returned into (layer, slot)'s state."""
        self._check(layer, slot)
        if tuple(conv.shape) != self.conv_shape or tuple(gdn.shape) != self.gdn_shape:
            raise ValueError(f"state shapes {tuple(conv.shape)}, {tuple(gdn.shape)} != "
                             f"expected {self.conv_shape}, {self.gdn_shape}")
        self.backend.copy_into(self._conv[layer][slot], conv)
        self.backend.copy_into(self._gdn[layer][slot], gdn)

    def reset_slot(self, slot: int) -> None:
        """Zero every layer's state of `slot` (a new sequence starts there)."""
        if not 0 <= slot < self.max_slots:
            raise IndexError(f"slot {slot} out of range [0, {self.max_slots})")
        for il in self.gdn_layers:
            self.backend.copy_into(self._conv[il][slot], self.backend.zeros(self.conv_shape))
            self.backend.copy_into(self._gdn[il][slot], self.backend.zeros(self.gdn_shape))

    def snapshot(self, slot: int) -> SlotSnapshot:
        """A copy of the slot's current state."""
        if not 0 <= slot < self.max_slots:
            raise IndexError(f"slot {slot} out of range [0, {self.max_slots})")
        return SlotSnapshot({il: (self.backend.asarray(self._conv[il][slot]), self.backend.asarray(self._gdn[il][slot]))
                             for il in self.gdn_layers})

    def restore(self, slot: int, snap: SlotSnapshot) -> None:
        """Put a snapshot (of any slot) back into `slot`."""
        if set(snap.layers) != set(self.gdn_layers):
            raise ValueError(f"snapshot covers layers {sorted(snap.layers)}, this model has {list(self.gdn_layers)}")
        for il, (conv, gdn) in snap.layers.items():
            self.store(il, slot, conv, gdn)

    def checkpoint(self, slots: Sequence[int]) -> None:
        """Save the state of `slots` (a step's prefill and AR slots: all its forward changes in
        place), one gather per kind into save buffers [layers * len(slots), ...]; `rollback`
        puts exactly those rows back. Other slots are never copied. The slots of the last
        checkpoint again (a steady decode's) reuse its buffers and rows."""
        slots, saved = tuple(slots), self._saved
        if saved is None or saved[0] != slots:
            key = tuple(sorted({int(s) for s in slots}))
            rows = self._rows.get(key)
            if rows is None:
                for s in key:
                    if not 0 <= s < self.max_slots:
                        raise IndexError(f"checkpoint: slot {s} out of range [0, {self.max_slots})")
                n = len(self.gdn_layers)
                rows = (np.arange(n)[:, None] * self.max_slots + np.asarray(key, np.int64)[None, :]).reshape(-1)
                rows.flags.writeable = False
                self._rows[key] = rows
            self._saved = None        # the last buffers go back before new ones are taken
            buffers = tuple(self.backend.take_rows(flat, rows) for flat in self._flat)
            saved = self._saved = (slots, key, rows, buffers, sum(_nbytes(a) for a in buffers))
        else:
            _, _, rows, buffers, _ = saved
            for flat, buffer in zip(self._flat, buffers):
                self.backend.take_rows(flat, rows, out=buffer)
        self.copied_bytes += saved[4]

    @property
    def saved_slots(self) -> tuple[int, ...]:
        """The slots the last checkpoint saved."""
        return () if self._saved is None else self._saved[1]

    def rollback(self) -> None:
        """Put back the state of the slots of the last checkpoint (bitwise)."""
        if self._saved is None:
            raise RuntimeError("rollback without a checkpoint")
        _, _, rows, buffers, nbytes = self._saved
        for flat, rows_saved in zip(self._flat, buffers):
            self.backend.put_rows(flat, rows, rows_saved)
        self.copied_bytes += nbytes

    # ---- tree commit ------------------------------------------------------------------------
    def commit(self, staged: dict, commit) -> None:
        """Advance every GDN layer of the slots of `commit` (luce.models.commit.TreeCommit)
        along their accepted paths; staged: {layer: TreeStage} of the verify step."""
        missing = [il for il in self.gdn_layers if il not in staged]
        if missing:
            raise ValueError(f"tree commit: the verify step staged no tree data for GDN layers {missing}")
        for il in self.gdn_layers:
            self.backend.tree_commit(self._conv[il], self._gdn[il], staged[il], commit)
