"""Graph replay on the CUDA backend (luce.models.graphed_forward, DESIGN.md section 4).

A replayed step must be the eager step: the engine with graphs on gives the same tokens as
with graphs off (hybrid and dense, C1/C3/C5 with staggered arrivals and prompts chunked
beside decoding, greedy and seeded sampling, speculation with tree verify and a graphed
draft model), while the counters show steps really replayed; and at the model level a
graph replayed over many steps of different tokens, positions and pages gives logits and
state pools bitwise equal to eager forwards on a twin state."""
from __future__ import annotations

import numpy as np
import pytest

from luce.engine import Engine, EngineConfig, SamplingParams
from luce.spec.config import SpecConfig

pytestmark = pytest.mark.gpu

rng = np.random.default_rng(8)
PROMPTS = [list(rng.integers(3, 400, n)) for n in (5, 17, 70, 3, 9)]
ARRIVALS = [0, 0, 3, 9, 20]
MAX_TOKENS = 60


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from luce.models import load_model
    from luce.ops import get_backend
    from luce.testing.tiny_models import make_dense, make_qwen35

    root = tmp_path_factory.mktemp("graphed")
    make_qwen35(root / "q35.gguf", seed=21, head_dim=64, ssm_state_size=64)
    make_dense(root / "q3.gguf", "qwen3", seed=22, head_dim=64)
    make_dense(root / "q3_draft.gguf", "qwen3", seed=23, n_layer=1, head_dim=64)
    backend = get_backend("cuda")
    return {name: load_model(root / f"{name}.gguf", backend) for name in ("q35", "q3", "q3_draft")}


def run(model, graphs: bool, concurrency: int, sampled: bool = False, spec=None, draft_model=None):
    engine = Engine(model, None, EngineConfig(max_slots=concurrency, ctx=256, token_budget=69, cuda_graphs=graphs,
                                              spec=spec), draft_model=draft_model)
    outputs = drive(engine, PROMPTS, ARRIVALS, lambda i: SamplingParams(max_tokens=MAX_TOKENS, **seeded(i, sampled)))
    assert all(o.finish_reason == "length" for o in outputs), [o.error for o in outputs]
    return tuple(tuple(o.token_ids) for o in outputs), engine


def seeded(i: int, sampled: bool) -> dict:
    """Request i's seeded sampling fields ({} when greedy)."""
    return dict(temperature=0.8, top_k=30, top_p=0.9, seed=100 + i) if sampled else {}


def drive(engine, prompts, arrivals, params_of, check: bool = False) -> list:
    """Add request i at step arrivals[i] with params_of(i), step until every one finished
    (engine.check() after each step when `check`); -> their RequestOutputs in order."""
    ids, step = {}, 0
    while len(ids) < len(prompts) or engine.has_unfinished():
        for i, arrival in enumerate(arrivals):
            if arrival <= step and i not in ids:
                ids[i] = engine.add_request([int(t) for t in prompts[i]], params_of(i))
        engine.step()
        if check:
            engine.check()
        step += 1
        assert step < 2000, "the engine stopped making progress"
    return [engine.take_output(ids[i]) for i in range(len(prompts))]


def assert_replayed(forward):
    c = forward.counters
    assert c["captures"] > 0 and c["replays"] > c["captures"], c
    assert c["failures"] == 0, list(forward.unsafe.values())


@pytest.mark.parametrize("name", ["q35", "q3"])
@pytest.mark.parametrize("concurrency", [1, 3, 5])
def test_graphed_engine_equals_eager(models, name, concurrency):
    eager, plain = run(models[name], False, concurrency)
    graphed, engine = run(models[name], True, concurrency)
    assert graphed == eager
    assert plain.forward.counters["replays"] == 0
    assert_replayed(engine.forward)


def test_graphed_sampling_equals_eager(models):
    eager, _ = run(models["q35"], False, 3, sampled=True)
    graphed, engine = run(models["q35"], True, 3, sampled=True)
    assert graphed == eager
    assert_replayed(engine.forward)


@pytest.mark.parametrize("target,mode,draft", [("q35", "chain", "q35"), ("q35", "specla", "q35"),
                                               ("q35", "ddtree", "q35"), ("q3", "chain", "q3_draft")])
def test_graphed_speculation_equals_eager(models, target, mode, draft):
    """Every step replays graphs once warm, tree verify steps and mixed steps [prefill][AR]
    [tree] included (every GDN tree mode runs on the device), and so do the tree commits and
    the draft model's passes; the tokens are those of plain eager decoding."""
    from luce.models.batch import SEG_PREFILL, SEG_TREE

    want, _ = run(models[target], False, 3)
    spec = SpecConfig(spec=mode, draft_kind="model", draft=draft, ddtree_budget=6, spec_top_k=2, chain_depth=4)
    got, engine = run(models[target], True, 3, spec=spec, draft_model=models[draft])
    assert got == want
    assert engine.forward.counters["failures"] == 0, list(engine.forward.unsafe.values())
    assert set(engine.graph_counters()["eager_reasons"]) <= {"first call of a key"}, engine.graph_counters()
    assert engine.spec.speculator.drafter.forward.counters["replays"] > 0
    assert_replayed(engine.forward)
    kinds = [{kind for kind, _ in key[0][0]} for key in engine.forward.graphs]
    assert any(SEG_TREE in k for k in kinds), "no verify step was captured"
    if target == "q35":  # the tree commit (KV moves, conv and GDN state of every slot), graphed
        assert_replayed(engine.committer)


@pytest.mark.parametrize("mode", ["specla", "ddtree"])
def test_mixed_prefill_and_tree_steps_replay(models, mode):
    """A 600-token prompt prefilled in 64-row chunks while two requests speculate: the
    steps [prefill][tree][tree] repeat their keys (segments bucketed, slots in the arena),
    are captured and replayed, and every request's tokens equal plain eager decoding."""
    from luce.models.batch import SEG_PREFILL, SEG_TREE

    model = models["q35"]
    rng = np.random.default_rng(12)
    prompts = [list(rng.integers(3, 400, 9)), list(rng.integers(3, 400, 12)), list(rng.integers(3, 400, 600))]

    def go(graphs, spec):
        engine = Engine(model, None, EngineConfig(max_slots=3, ctx=700, token_budget=128, cuda_graphs=graphs,
                                                  spec=spec), draft_model=model)
        ids = [engine.add_request(p, SamplingParams(max_tokens=240)) for p in prompts[:2]]
        for _ in range(3):
            engine.step()
        ids.append(engine.add_request(prompts[2], SamplingParams(max_tokens=8)))   # 10 chunks beside the trees
        engine.run()
        return [engine.take_output(i).token_ids for i in ids], engine

    want, _ = go(False, None)
    got, engine = go(True, SpecConfig(spec=mode, draft_kind="model", draft="q35", ddtree_budget=6, spec_top_k=2))
    assert got == want
    kinds = [{kind for kind, _ in key[0][0]} for key in engine.forward.graphs]
    assert any({SEG_PREFILL, SEG_TREE} <= k for k in kinds), "no mixed step was captured"
    assert engine.forward.counters["replays"] > 0 and engine.forward.counters["failures"] == 0


def test_replayed_logits_and_state_bitwise(models):
    """40 decode steps of 3 slots with fresh random tokens: logits, KV pages and GDN pools of
    GraphedForward equal eager forwards on a twin state bit for bit."""
    from luce.models.packer import SegmentSpec, build_batch
    from luce.models.graphed_forward import GraphedForward

    model = models["q35"]
    b = model.backend
    states = [model.new_state(max_pages=48, max_slots=4) for _ in range(2)]
    graphed = GraphedForward(model)
    pages = {slot: list(range(slot * 12, slot * 12 + 12)) for slot in (0, 1, 3)}
    start = {0: 0, 1: 30, 3: 7}
    tokens = np.random.default_rng(3)
    for slot in (0, 1, 3):  # prefill each slot (eager) to its start
        if start[slot]:
            batch = build_batch([SegmentSpec(slot, list(tokens.integers(0, 400, start[slot])), 0, pages[slot])],
                                pad_pages=True)
            for state, fwd in zip(states, (model.forward, graphed)):
                fwd(batch, state)
    for step in range(40):
        segs = [SegmentSpec(slot, [int(tokens.integers(0, 400))], start[slot] + step, pages[slot]) for slot in (0, 1, 3)]
        batch = build_batch(segs, pad_pages=True)   # page counts bucketed: the replay key repeats
        want = b.to_numpy(model.forward(batch, states[0]).logits)
        got = b.to_numpy(graphed(batch, states[1]).logits)
        np.testing.assert_array_equal(got, want)
    assert graphed.counters["replays"] >= 30, graphed.counters
    for il in states[0].recurrent.gdn_layers:
        for want, got in zip(states[0].recurrent.pools(il), states[1].recurrent.pools(il)):
            np.testing.assert_array_equal(b.to_numpy(got), b.to_numpy(want))
    for il, kv in states[0].kv.items():
        np.testing.assert_array_equal(b.to_numpy(states[1].kv[il].k), b.to_numpy(kv.k))


def test_graphed_dflash_draft_equals_eager(models, tmp_path):
    """DFlash block passes (multi-row segments, no GDN layers) replay graphs; the target's
    features stay on the device from capture to the draft pass; the draft's proposals,
    hence the committed tokens, are the eager ones."""
    from luce.models import load_model
    from luce.testing.tiny_models import make_dflash_draft

    target = models["q35"]
    path = tmp_path / "dflash.gguf"
    make_dflash_draft(path, target.config, seed=15, block_size=4, target_layers=(0, 2), head_dim=64)
    draft = load_model(path, target.backend, target_model=target)
    spec = SpecConfig(spec="specla", draft_kind="dflash", draft="dflash", ddtree_budget=6, spec_top_k=2)
    want, _ = run(target, False, 3, spec=spec, draft_model=draft)
    got, engine = run(target, True, 3, spec=spec, draft_model=draft)
    assert got == want
    assert engine.spec.speculator.drafter.forward.counters["replays"] > 0, engine.graph_counters()


def test_graph_counters_in_metrics(models):
    """The engine's graph counters reach the Prometheus text of /metrics."""
    from luce.server.engine_core import LuceEngineCore
    from luce.server.metrics import ServerMetrics

    _, engine = run(models["q3"], True, 1)
    text = ServerMetrics().render(LuceEngineCore(engine).stats(), 0)
    counters = engine.graph_counters()
    assert counters["replays"] > 0
    for name in ("replays", "captures", "rebuilds"):
        assert f"luce_graph_{name}_total {counters[name]}" in text


@pytest.mark.parametrize("mode", ["ddtree", "specla"])
def test_tree_graphs_share_one_stage_scratch_per_layer(models, mode):
    """What a tree verify keeps for the commit (per-node GDN states for ddtree, factors for
    specla, and the conv inputs) is written to the backend's scratch of the layer, which
    every captured graph and eager step shares (at 27B one graph's copy of per-node states
    would be up to 18 GiB; and the commit's graph, which reads them at fixed addresses, keys
    on them): each tree graph's staged arrays lie in one of the scratch buffers the backend
    holds for it (the current one, or one it outgrew by doubling while an older graph still
    writes it), outside every graph's pool, the commits replay, and the tokens are those of
    plain eager decoding."""
    want, _ = run(models["q35"], False, 3)
    spec = SpecConfig(spec=mode, draft_kind="model", draft="q35", ddtree_budget=6, spec_top_k=2)
    got, engine = run(models["q35"], True, 3, spec=spec, draft_model=models["q35"])
    assert got == want
    starts: dict = {}
    for graph in engine.forward.graphs.values():
        for il, stage in (graph.output.staged or {}).items():
            kept = [stage.conv_inputs, stage.node_states if mode == "ddtree" else stage.factors.u]
            for array in kept:
                assert array.block.allocator is not graph.allocator
                starts.setdefault(il, set()).add(array.ptr)
    backend = models["q35"].backend
    held = {b.ptr for b in [*backend._stage_buffers.values(), *backend._stage_outgrown]}
    assert starts and all(s <= held for s in starts.values()), (starts, held)
    assert sum(1 for g in engine.forward.graphs.values() if g.output.staged) >= 2
    assert_replayed(engine.committer)


@pytest.mark.parametrize("name", ["q35", "q3"])
def test_replayed_step_launches_are_counted(models, name):
    """bench_decode's launches per step: the captured decode graph's nodes, counted by kind
    (luce.ops.launch_count); every layer launches at least its matmuls and attention."""
    from luce.benchmark.decode_bench import run_ar

    model = models[name]
    _, _, counters = run_ar(model, [PROMPTS[0]], 4)
    nodes = counters["nodes"]
    assert nodes["launches"] == nodes["kernels"] + nodes["memsets"] + nodes["memcpys"]
    assert nodes["kernels"] >= 3 * model.config.n_layer, nodes


def test_fused_gdn_chain_tokens_and_launches(models, monkeypatch):
    """A decode step's GDN chain in 2 launches (conv_gdn_norm, cuda/gdn_decode.cu) instead of the
    composition's 15 (4 gates, conv1d, 3 split copies, 2 l2norms and the q scale, 2 head
    gathers, the recurrent step, the gated norm): 13 launches fewer per GDN layer, the same
    tokens."""
    from luce.benchmark.decode_bench import run_ar
    from luce.ops.api import FusedOps
    from luce.ops.cuda_fused_ops import CudaFusedOps

    model = models["q35"]
    prompts = [PROMPTS[0], PROMPTS[3], PROMPTS[4]]
    fused_tokens, _, fused = run_ar(model, prompts, 6)
    monkeypatch.setattr(CudaFusedOps, "conv_gdn_norm", FusedOps.conv_gdn_norm)
    unfused_tokens, _, unfused = run_ar(model, prompts, 6)
    assert fused_tokens == unfused_tokens
    assert unfused["nodes"]["launches"] - fused["nodes"]["launches"] == 13 * len(model.config.gdn_layers)
