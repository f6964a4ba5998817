"""Context and KV pool sizing (--ctx, --kv-memory) and the start-up line that reports them."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from luce.server.engine_core import ServeOptions, load_engine
from luce.server.kv_budget import kv_bytes_per_token, parse_kv_memory, plan_context
from luce.testing.tiny_models import make_dense

# 4 attention layers, 2 KV heads of 64: 4 * 2 * 2 * 64 * 4 bytes = 4 KiB per token, 64 KiB per page
CONFIG = SimpleNamespace(full_attention_layers=(0, 1, 2, 3), n_head_kv=2, head_dim=64, context_length=32768)
PAGE = 64 * 1024


def test_kv_bytes_per_token_counts_k_and_v_of_attention_layers_in_float32():
    assert kv_bytes_per_token(CONFIG) == 4096


@pytest.mark.parametrize("text,expected", [("0.8", ("fraction", 0.8)), ("1", ("fraction", 1.0)),
                                           ("512M", ("bytes", 512 * 2**20)), ("2G", ("bytes", 2 * 2**30)),
                                           ("1.5GiB", ("bytes", 1.5 * 2**30)), ("123456", ("bytes", 123456))])
def test_kv_memory_is_a_fraction_or_a_size(text, expected):
    assert parse_kv_memory(text) == expected


@pytest.mark.parametrize("text", ["0", "-1", "2x", "", "1.5", "lots"])
def test_bad_kv_memory_names_the_flag(text):
    with pytest.raises(ValueError, match="--kv-memory"):
        parse_kv_memory(text)


def test_ctx_defaults_to_the_model_when_memory_allows_and_pools_every_slot():
    plan = plan_context(CONFIG, ctx=None, max_slots=2, kv_memory="1", free_bytes=10 * 2**30)
    assert plan.ctx == 32768 and plan.kv_pages == 2 * 32768 // 16 and plan.kv_bytes == plan.kv_pages * PAGE


def test_ctx_shrinks_to_what_the_budget_holds():
    plan = plan_context(CONFIG, ctx=None, max_slots=4, kv_memory="64M", free_bytes=None)
    assert plan.kv_pages == 64 * 2**20 // PAGE == 1024 and plan.ctx == 1024 * 16 and plan.kv_tokens == 16384
    half = plan_context(CONFIG, ctx=None, max_slots=4, kv_memory="0.5", free_bytes=128 * 2**20)
    assert half == plan


def test_explicit_ctx_shares_a_smaller_pool_or_is_refused():
    plan = plan_context(CONFIG, ctx=8192, max_slots=8, kv_memory="64M", free_bytes=None)
    assert plan.ctx == 8192 and plan.kv_pages == 1024         # two full contexts; requests share the rest
    with pytest.raises(ValueError, match="lower --ctx or raise --kv-memory"):
        plan_context(CONFIG, ctx=32768, max_slots=1, kv_memory="64M", free_bytes=None)
    with pytest.raises(ValueError, match="exceeds the model's context length 32768"):
        plan_context(CONFIG, ctx=40000, max_slots=1, kv_memory="1", free_bytes=None)


def test_unknown_free_memory_keeps_the_asked_pool():
    plan = plan_context(CONFIG, ctx=None, max_slots=2, kv_memory="0.8", free_bytes=None)
    assert plan.ctx == 32768 and plan.kv_pages == 4096


def test_startup_line_reports_ctx_kv_tokens_and_slots(tmp_path):
    path = tmp_path / "tiny.gguf"
    make_dense(path, arch="qwen3", seed=3)
    lines = []
    engine, _, info = load_engine(ServeOptions(model=str(path), backend="numpy", max_slots=3, kv_memory="4M"),
                                  progress=False, say=lines.append)
    per_page = kv_bytes_per_token(engine.model.config) * 16
    pages = 4 * 2**20 // per_page
    assert engine.pool.n_pages == pages and info.n_ctx == min(engine.model.config.context_length, pages * 16)
    line = next(ln for ln in lines if "loaded" in ln)
    assert f"ctx {info.n_ctx} (model {engine.model.config.context_length})" in line
    assert f"KV {pages * 16} tokens" in line and "3 slots" in line
