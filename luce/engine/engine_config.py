"""The engine's configuration, its per-step update to callers and its counters (luce.engine.engine)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from luce.models.kv_cache import pages_needed
from luce.spec.config import SpecConfig


GPU_TOKEN_BUDGETS = (2048, 1024)   # GPU backends: the largest that fits (default_token_budget)
CPU_TOKEN_BUDGET = 512


def default_token_budget(backend_name: str, max_slots: int, *, ctx: int = 0, n_head: int = 0, head_dim: int = 0,
                         free_bytes: int | None = None) -> int:
    """Rows a step holds when the caller names none.

    On a GPU, 2,048 where it fits: prompt chunks of that size keep the tensor-core GEMMs full (27B
    prefill of 4,096 tokens on an H200: 3,802 tok/s against 3,016 at 512; llama-server's logical
    batch is 2,048 too), and a step that holds one is longer for the requests decoding beside it.
    "Fits": the prompt rows' attention workspace at `ctx` keys (rows x n_head x ceil(ctx / 1,024)
    key splits x (head_dim + 2) f32: luce_attention_workspace_bytes, cuda/attention.cu; 203 MB
    for 2,048 rows of the 27B at 4,096 keys, 1.6 GB at 32K) within 1/16 of the device memory
    free at start (`free_bytes`); else 1,024, else 512. (A device where the tensor-core prompt
    kernel does not fit sends prompt rows to the per-row kernel, an entry per 256 keys: 4x
    that, still within 1/4.) On the CPU (or memory unknown), 512: the chunk's activations cost
    memory and its speed does not depend on the chunk size. At least max_slots + 64 either way."""
    base = CPU_TOKEN_BUDGET
    if backend_name in ("cuda", "hip") and free_bytes is not None:
        for rows in GPU_TOKEN_BUDGETS:
            if rows * n_head * -(-ctx // 1024) * (head_dim + 2) * 4 * 16 <= free_bytes:
                base = rows
                break
    return max(base, max_slots + 64)


@dataclass(frozen=True)
class EngineConfig:
    max_slots: int = 5            # requests decoding together
    ctx: int = 4096               # tokens per sequence (prompt + output)
    token_budget: int | None = None  # live rows per step (AR rows + prompt chunks); None: default_token_budget
    kv_pages: int | None = None   # KV pages in the pool; default max_slots * pages(ctx)
    max_queue: int = 1024         # requests waiting for a slot before add_request refuses
    pad_steps: bool = True        # pad shapes to replay-key buckets
    cuda_graphs: bool = True      # replay captured graphs for every step (backends that can)
    async_steps: bool | None = None  # decode steps drawn on the device launched before the last step's
                                  # ids reach the host (luce.engine.ahead); None: where the backend
                                  # launches asynchronously with graphs on; True: wherever it can
    seed: int = 0                 # requests without a seed get one drawn from (seed, submission number)
    max_step_retries: int = 2     # steps dropped in a row (nothing changed) before a request errors
    spec_during_prefill: bool = True  # speculate while prompts prefill (False: those steps decode AR rows)
    spec: SpecConfig | None = None  # speculative decoding (None or spec='off': plain decoding)
    prefix_cache: bool = False    # share prompt KV pages and recurrent snapshots across requests
    cache_memory: int = 4 << 30   # bytes the prefix cache may hold (pages it references + snapshots)
    snapshot_interval: int = 1024  # hybrid models: a snapshot every this many prompt tokens too (multiple of 64; 0: none)

    def __post_init__(self):
        for name in ("max_slots", "ctx", "token_budget"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"EngineConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.kv_pages is not None and self.kv_pages < 1:
            raise ValueError(f"EngineConfig.kv_pages must be >= 1, got {self.kv_pages}")
        if self.snapshot_interval < 0 or self.snapshot_interval % 64:
            raise ValueError(f"EngineConfig.snapshot_interval must be a multiple of 64 (0: none), got {self.snapshot_interval}")
        if self.cache_memory < 0:
            raise ValueError(f"EngineConfig.cache_memory must be >= 0 bytes, got {self.cache_memory}")
        if self.max_step_retries < 0:
            raise ValueError(f"EngineConfig.max_step_retries must be >= 0, got {self.max_step_retries}")

    @property
    def n_pages(self) -> int:
        return self.kv_pages if self.kv_pages is not None else self.max_slots * pages_needed(self.ctx)


@dataclass(frozen=True)
class StepUpdate:
    """What one step did for one request."""

    request_id: Any
    token_ids: tuple[int, ...] = ()   # tokens emitted this step (none mid-prefill), up to the finishing one
    finish_reason: str | None = None  # set when the request finished this step
    error: str | None = None
    text: str = ""                    # text that can no longer change (stop strings held back, then cut)
    stop_reason: str | int | None = None
    logprobs: tuple = ()              # TokenLogprob of each token_ids entry (when the request asked)


@dataclass
class EngineStats:
    steps: int = 0                # steps that ran the model and committed
    prompt_tokens: int = 0        # prompt tokens prefilled
    cached_prompt_tokens: int = 0  # prompt tokens served from the prefix cache (not prefilled)
    generated_tokens: int = 0
    live_rows: int = 0            # rows of real work over all steps
    padded_rows: int = 0          # rows added by shape padding
    finished: int = 0
    cancelled: int = 0
    failed: int = 0
    failed_steps: int = 0         # steps whose cohort was retired
    dropped_steps: int = 0        # steps that failed before any durable change and ran again
    tree_rows: int = 0            # rows of draft trees verified
    replay_keys: set = field(default_factory=set)
