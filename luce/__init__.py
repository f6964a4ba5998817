"""luce: a speculative-decoding LLM inference runtime for hybrid and dense Qwen models.

    from luce import LLM, SamplingParams       # loaded on first use
"""
__version__ = "0.1.0"

_LAZY = {"LLM": "luce.llm", "SamplingParams": "luce.engine.sampler", "RequestOutput": "luce.engine.request"}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'luce' has no attribute {name!r}")
