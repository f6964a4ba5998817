"""Models (dense qwen2/qwen3, hybrid qwen35, DFlash draft) and their step interface.

    model = load_model(path, backend="numpy")
    state = model.new_state(max_pages, max_slots)
    out = model.forward(batch, state)       # ForwardBatch -> ForwardOutput
"""
from luce.models.batch import (ForwardBatch, ForwardOutput, Model, SegmentSpec, build_batch,
                               generate_greedy)
from luce.models.kv_cache import PAGE_SIZE, ModelState, PagedKV, pages_needed, single_sequence_csr
from luce.models.loader import load_model, register_arch

__all__ = [
    "ForwardBatch", "ForwardOutput", "Model", "SegmentSpec", "build_batch", "generate_greedy",
    "PAGE_SIZE", "ModelState", "PagedKV", "pages_needed", "single_sequence_csr",
    "load_model", "register_arch",
]
