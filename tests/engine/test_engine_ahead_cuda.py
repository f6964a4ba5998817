"""Steps ahead on the CUDA backend (luce.engine.ahead): decode steps launched before the previous
step's ids reach the host, fed on the device (cuda/step_ids.cu) inside their graphs, give the
tokens of the engine that waits for every step (hybrid and dense; greedy, and seeded sampling
drawn on the device; C1 and C4 with staggered arrivals, prompts chunked beside decoding, stop
tokens ending requests with their next row in flight), with graphs and eagerly; steps fed
or not replay one graph a topology; every launch overlapped with the kernel ahead or not (the
small models' default) gives the same tokens."""
from __future__ import annotations

import numpy as np
import pytest

from luce.engine import Engine, EngineConfig, SamplingParams
from luce.models.batch import SEG_AR
from tests.models.test_graphed_forward_cuda import drive, seeded

pytestmark = pytest.mark.gpu

rng = np.random.default_rng(18)
PROMPTS = [list(rng.integers(3, 400, n)) for n in (5, 17, 70, 3, 9, 130)]
ARRIVALS = [0, 0, 3, 9, 20, 21]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from luce.models import load_model
    from luce.ops import get_backend
    from luce.testing.tiny_models import make_dense, make_qwen35

    root = tmp_path_factory.mktemp("ahead")
    make_qwen35(root / "q35.gguf", seed=31, head_dim=64, ssm_state_size=64)
    make_dense(root / "q3.gguf", "qwen3", seed=32, head_dim=64)
    backend = get_backend("cuda")
    return {name: load_model(root / f"{name}.gguf", backend) for name in ("q35", "q3")}


def has_ar_rows(graph_key) -> bool:
    """Whether a graph's step has AR rows: its replay key's segments are (kind, rows) pairs
    (luce.models.packer)."""
    segments = graph_key[0][0]
    return any(kind == SEG_AR for kind, _ in segments)


def run(model, concurrency: int, async_steps, graphs: bool = True, stop=(), sampled: bool = False):
    engine = Engine(model, None, EngineConfig(max_slots=concurrency, ctx=256, token_budget=69, cuda_graphs=graphs,
                                              async_steps=async_steps))
    outputs = drive(engine, PROMPTS, ARRIVALS, check=True, params_of=lambda i: SamplingParams(
        max_tokens=40 + 7 * i, stop_token_ids=stop, **seeded(i, sampled)))
    assert all(o.error is None for o in outputs), [o.error for o in outputs]
    return tuple(tuple(o.token_ids) for o in outputs), engine


@pytest.mark.parametrize("name", ["q35", "q3"])
@pytest.mark.parametrize("concurrency", [1, 4])
def test_steps_ahead_give_the_waiting_engines_tokens(models, name, concurrency):
    waiting, plain = run(models[name], concurrency, async_steps=False)
    ahead, engine = run(models[name], concurrency, async_steps=None)
    assert not plain.ahead and engine.ahead
    assert ahead == waiting
    greedy = [key for key in engine.forward.cache.graphs if "greedy ids" in key]
    assert any("fed" in key for key in greedy)     # steps fed or not replay one graph
    for key in greedy:      # a graph feeds exactly when its step has AR rows (not a prompt chunk alone)
        assert ("fed" in key) == has_ar_rows(key), key
    assert engine.forward.counters["replays"] > 50, engine.forward.counters


@pytest.mark.parametrize("name", ["q35", "q3"])
def test_seeded_sampling_drawn_on_the_device_runs_ahead_alike(models, name):
    waiting, _ = run(models[name], 4, async_steps=False, sampled=True)
    ahead, engine = run(models[name], 4, async_steps=None, sampled=True)
    assert ahead == waiting
    assert [key for key in engine.forward.cache.graphs if "fed" in key] and engine.forward.counters["replays"] > 50


def test_stop_tokens_end_requests_with_their_next_row_in_flight(models):
    """Stop ids common enough that requests end early, with their next row already launched."""
    waiting, _ = run(models["q3"], 4, async_steps=False)
    stop = tuple(sorted({t for out in waiting for t in out[5:12]}))[:6]
    waiting, _ = run(models["q3"], 4, async_steps=False, stop=stop)
    ahead, _ = run(models["q3"], 4, async_steps=None, stop=stop)
    assert ahead == waiting and any(len(t) < 40 for t in waiting)


def test_eager_steps_ahead_feed_outside_graphs(models):
    waiting, _ = run(models["q35"], 3, async_steps=False, graphs=False)
    ahead, engine = run(models["q35"], 3, async_steps=True, graphs=False)
    assert engine.ahead and ahead == waiting


@pytest.mark.parametrize("name", ["q35", "q3"])
def test_overlapping_every_launch_changes_no_token(models, name):
    """Small models overlap every decode-chain launch with the kernel ahead (load_model sets it:
    luce_set_decode_overlap); their tokens are those of the launches with only the matmuls and
    the attention overlapped (a fresh engine each: graphs captured under each choice)."""
    from luce import _cuda
    from luce.ops import cuda_backend

    tokens = {}
    try:
        for every_kind in (False, True):
            _cuda.set_decode_overlap(every_kind)
            tokens[every_kind], _ = run(models[name], 4, async_steps=None, sampled=True)
    finally:
        _cuda.set_decode_overlap(cuda_backend.widest_model_hidden <= cuda_backend.SMALL_MODEL_HIDDEN)
    assert tokens[True] == tokens[False]
