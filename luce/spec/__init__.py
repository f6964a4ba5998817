"""Speculative decoding: draft trees, drafters, lossless acceptance (DESIGN.md section 7)."""
