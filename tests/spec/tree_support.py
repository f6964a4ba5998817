"""Test shims for dense tree rows: what the batch owner's ForwardBatch.validate and the ops
owner's numpy attention will provide once they accept tree rows (luce.models.tree_rows).
Used only where the real classes still reject tree rows; remove when they accept them."""
from __future__ import annotations

import copy

import numpy as np

from luce.models.batch import ForwardBatch
from luce.models.tree_rows import validate_batch
from luce.ops.numpy_backend import NumpyBackend
from luce.ref.tree_attention import paged_attention_with_trees


class TreeBatch(ForwardBatch):
    """ForwardBatch whose validate accepts tree rows."""

    def validate(self):
        validate_batch(self)


class TreeRowsNumpyBackend(NumpyBackend):
    """The numpy backend with tree rows in attention."""

    supports_tree_rows = True

    def attention(self, q, kv, batch, scale, causal=True):
        return paged_attention_with_trees(np.asarray(q, np.float32), kv.k, kv.v, batch.qo_indptr, batch.kv_indptr,
                                          batch.kv_indices, batch.kv_last_page_len, batch.seq_slots,
                                          batch.tree_parents, scale, causal)


class TreeRowsModel:
    """A model on TreeRowsNumpyBackend whose forward takes tree batches."""

    def __init__(self, model):
        self.inner = copy.copy(model)
        self.inner.backend = TreeRowsNumpyBackend()

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def forward(self, batch, state):
        return self.inner.forward(TreeBatch(**vars(batch)), state)


def needs_shim(model) -> bool:
    """True while the model cannot run tree rows itself."""
    if getattr(model.config, "gdn_layers", ()):
        return False
    return not getattr(model.backend, "supports_tree_rows", False)
