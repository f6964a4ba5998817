"""Models (dense qwen2/qwen3, hybrid qwen35, DFlash draft) and their step interface.

    model = load_model(path, backend="numpy")
    state = model.new_state(max_pages, max_slots)
    out = model.forward(batch, state)       # ForwardBatch -> ForwardOutput
"""
from luce.models.batch import (SEG_AR, SEG_PAD, SEG_PREFILL, SEG_TREE, ForwardBatch, ForwardOutput, Model,
                               validate_batch)
from luce.models.kv_cache import PAGE_SIZE, ModelState, PagedKV, bucket, pages_needed
from luce.models.loader import load_model, register_arch
from luce.models.packer import Packer, SegmentSpec, build_batch, generate_greedy

__all__ = [
    "SEG_AR", "SEG_PAD", "SEG_PREFILL", "SEG_TREE", "ForwardBatch", "ForwardOutput", "Model", "validate_batch",
    "PAGE_SIZE", "ModelState", "PagedKV", "bucket", "pages_needed", "load_model", "register_arch",
    "Packer", "SegmentSpec", "build_batch", "generate_greedy",
]
