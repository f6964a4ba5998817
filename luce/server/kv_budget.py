"""How long a context and how large a KV pool the server starts with.

`--kv-memory` caps the KV pool: a fraction of the memory free after the weights are loaded
(device memory on a GPU backend, available host memory otherwise), or a byte size ("12G",
"512M", "1073741824"). The context defaults to the model's length, bounded by what the pool
holds (one request may use the whole pool); an explicit `--ctx` must fit both. The pool holds
max_slots full contexts when the budget allows, else fewer: requests then share its pages and
wait for them at admission (the engine's page reservation).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

PAGE_TOKENS = 16             # luce.models.kv_cache.PAGE_SIZE
KV_BYTES_PER_VALUE = 4       # the paged KV cache is float32
DEFAULT_KV_MEMORY = "0.8"
DEFAULT_CACHE_MEMORY = "4G"   # the prefix cache's budget (luce-serve --cache-memory)
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B?|B)?\s*$", re.I)


def parse_kv_memory(text: str) -> tuple[str, float]:
    """('fraction', f) for 0 < f <= 1, or ('bytes', n); ValueError naming the flag otherwise."""
    text = str(text).strip()
    try:
        value = float(text)
    except ValueError:
        value = None
    if value is not None and 0 < value <= 1:
        return "fraction", value
    match = _SIZE.match(text)
    bare_fraction = match is not None and match.group(2) is None and not match.group(1).isdigit()
    if match is None or bare_fraction or float(match.group(1)) <= 0:
        raise ValueError(f"--kv-memory {text!r}: give a fraction of free memory (0 < f <= 1, e.g. 0.8) or a size "
                         "(e.g. 12G, 512M, or bytes)")
    unit = (match.group(2) or "B").upper().rstrip("B").rstrip("I")
    scale = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}[unit]
    return "bytes", float(match.group(1)) * scale


def parse_cache_memory(text) -> int:
    """--cache-memory: a size (4G, 512M, or bytes; 0 keeps nothing) -> bytes; ValueError otherwise."""
    match = _SIZE.match(str(text))
    if match is None:
        raise ValueError(f"--cache-memory {text!r}: give a size (e.g. 4G, 512M, or bytes; 0 caches nothing)")
    unit = (match.group(2) or "B").upper().rstrip("B").rstrip("I")
    return int(float(match.group(1)) * {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}[unit])


def kv_bytes_per_token(config) -> int:
    """K and V of every attention layer for one token."""
    return len(config.full_attention_layers) * 2 * config.n_head_kv * config.head_dim * KV_BYTES_PER_VALUE


def free_memory_bytes(backend_name: str) -> int | None:
    """Free device memory (cuda, hip) or available host memory; None when it cannot be read."""
    try:
        if backend_name in ("cuda", "hip"):
            from luce.ops.gpu_runtime import get_runtime

            return get_runtime(backend_name).mem_get_info()[0]
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except Exception:  # noqa: BLE001 - no figure: the caller falls back to the model's context
        return None
    return None


@dataclass(frozen=True)
class ContextPlan:
    ctx: int                 # tokens per request (prompt + output)
    kv_pages: int            # pages in the pool
    model_ctx: int           # the model's own context length
    kv_bytes: int            # the pool's size

    @property
    def kv_tokens(self) -> int:
        return self.kv_pages * PAGE_TOKENS


def _pages(tokens: int) -> int:
    return -(-tokens // PAGE_TOKENS)


def plan_context(config, *, ctx: int | None, max_slots: int, kv_memory: str = DEFAULT_KV_MEMORY,
                 free_bytes: int | None) -> ContextPlan:
    """Choose ctx and the pool; ValueError with the flags to change when they cannot fit."""
    model_ctx = int(getattr(config, "context_length", 0) or 0) or 4096
    if ctx is not None and ctx > model_ctx:
        raise ValueError(f"--ctx {ctx} exceeds the model's context length {model_ctx}")
    per_page = kv_bytes_per_token(config) * PAGE_TOKENS
    kind, amount = parse_kv_memory(kv_memory)
    if kind == "fraction":
        budget = None if free_bytes is None else int(free_bytes * amount)
    else:
        budget = int(amount)
    wanted = ctx if ctx is not None else model_ctx
    full = max_slots * _pages(wanted)
    if budget is None:           # memory unknown: the pool the request asks for
        return ContextPlan(wanted, full, model_ctx, full * per_page)
    budget_pages = budget // per_page if per_page else full
    if ctx is not None and budget_pages < _pages(ctx):
        raise ValueError(f"--ctx {ctx} needs {_pages(ctx) * per_page / 2**20:.0f} MiB of KV cache but --kv-memory "
                         f"{kv_memory} allows {budget / 2**20:.0f} MiB: lower --ctx or raise --kv-memory")
    if budget_pages < _pages(2):
        raise ValueError(f"--kv-memory {kv_memory} allows {budget / 2**20:.1f} MiB, less than one KV page "
                         f"({per_page / 2**20:.2f} MiB): raise it")
    if ctx is None:
        wanted = min(model_ctx, budget_pages * PAGE_TOKENS)
        full = max_slots * _pages(wanted)
    pages = min(full, budget_pages)
    return ContextPlan(wanted, pages, model_ctx, pages * per_page)
