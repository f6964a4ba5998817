"""luce: a speculative-decoding LLM inference runtime for hybrid and dense Qwen models."""
__version__ = "0.1.0"
