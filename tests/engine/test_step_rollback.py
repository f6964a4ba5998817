"""A fault at any point before commit of a mixed step [prefill chunk][AR rows][tree] (tiny
qwen35 + DFlash draft, numpy and cpu backends, SpecLA and per-node-state ddtree): every
domain (pages, slots, conv and GDN state, committed KV, the drafter's features and draft KV)
is bitwise as before the step, no request is retired, the step runs again and every output
is what plain decoding gives. The prefill and AR rows' forward advanced recurrent state in
place; the engine's checkpoint (ModelState.checkpoint) of those rows' slots, and of no other
slot, put it back. The cuda parameter (gpu marker) runs the same on the device."""
from __future__ import annotations

import hashlib

import numpy as np
import pytest

from luce.engine import Engine, EngineConfig, SamplingParams
from luce.spec.config import SpecConfig
from luce.spec.drafters import DFlashDrafter
from luce.spec.drafters.bench_drafters import AlwaysWrongDrafter
from tests.engine.faults import POINTS, domain_digests

DECODERS = [[5, 6, 7, 8, 5, 6, 7], [9, 10, 11, 12, 13], [21, 22, 23, 21, 22]]
LONG = [3 + (7 * i) % 90 for i in range(100)]       # arrives later: a 64-token chunk, then 36
MAX_TOKENS, CTX, SLOTS = 12, 160, 4
BUDGET = 64 + 3 + 5 + 1   # the chunk and 3 AR rows leave room for one tree of 6 nodes: [P][AR AR][T]


@pytest.fixture(scope="module", params=["numpy", "cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def pair(request, tmp_path_factory):
    from luce.models import load_model
    from luce.testing.tiny_models import make_dflash_draft, make_qwen35

    root = tmp_path_factory.mktemp("rollback")
    dims = {"head_dim": 64, "ssm_state_size": 64} if request.param == "cuda" else {}   # the CUDA kernels' sizes
    q35 = make_qwen35(root / "t.gguf", seed=41, **dims)
    make_dflash_draft(root / "d.gguf", q35, seed=42, block_size=4, target_layers=(0, 2),
                      **({"head_dim": 64} if dims else {}))
    target = load_model(root / "t.gguf", request.param)
    return target, load_model(root / "d.gguf", request.param, target_model=target)


def run(target, draft, mode, want=None, fault=None, after_step=None, slots=SLOTS):
    """Outputs of the workload ([decoders], then LONG after two steps); want: the plain
    outputs (the drafter drafts wrong tokens after them: one token per verify); fault(engine,
    point, step) is the engine's fault hook, after_step(engine, updates) sees every step's updates."""
    spec = None
    drafter = None
    if mode != "off":
        truth = [list(p) + list(o) for p, o in zip(DECODERS + [LONG], want)]
        drafter = AlwaysWrongDrafter(truth, target.config.vocab, inner=DFlashDrafter(draft, slots, CTX))
        spec = SpecConfig(spec=mode, draft_kind="model", draft="wrong", ddtree_budget=5, spec_top_k=2)
    engine = Engine(target, None, EngineConfig(max_slots=slots, ctx=CTX, token_budget=BUDGET, spec=spec),
                    drafter=drafter)
    if fault is not None:
        engine.fault_hook = lambda point, step: fault(engine, point, step)
    params = SamplingParams(max_tokens=MAX_TOKENS)
    ids = [engine.add_request(p, params) for p in DECODERS]
    steps = 0
    while engine.has_unfinished():
        if steps == 2:
            ids.append(engine.add_request(LONG, params))
        updates = engine.step()
        engine.check()
        if after_step is not None:
            after_step(engine, updates)
        steps += 1
    return [engine.take_output(i) for i in ids], engine


@pytest.mark.parametrize("mode", ["specla", "ddtree"])
@pytest.mark.parametrize("point", POINTS)
def test_fault_in_a_mixed_step_changes_nothing_and_the_step_runs_again(pair, mode, point):
    target, draft = pair
    want = [o.token_ids for o in run(target, draft, "off")[0]]
    seen: dict = {"faults": 0}

    def fault(engine, at, step):
        c = step.cohort
        if at == "before_forward":
            seen["before"] = domain_digests(engine)
        if at == point and c.prefill and c.decode and c.tree and seen["faults"] < 2:
            seen["faults"] += 1          # twice in a row: max_step_retries (2) is not exceeded
            seen["shape"] = (len(c.prefill), len(c.decode), len(c.tree))
            raise RuntimeError("injected")

    def after_step(engine, updates):
        if seen["faults"] > seen.get("checked", 0):
            seen["checked"] = seen["faults"]
            assert updates == [] and domain_digests(engine) == seen["before"]

    outs, engine = run(target, draft, mode, want, fault, after_step)
    assert seen["checked"] == 2
    assert seen["faults"] == 2 and seen["shape"] == (1, 2, 1)
    assert engine.stats.dropped_steps == 2 and engine.stats.failed == 0 and engine.stats.failed_steps == 0
    assert [o.finish_reason for o in outs] == ["length"] * 4
    assert [o.token_ids for o in outs] == want


def test_a_step_failing_every_retry_ends_its_requests_with_the_cause(pair):
    """A mixed step that faults every time: after max_step_retries its requests end with
    'error' naming the fault, with no token lost (the tokens before it are theirs) and state
    rolled back each time; requests not in that step finish normally."""
    target, draft = pair
    want = [o.token_ids for o in run(target, draft, "off")[0]]

    def fault(engine, at, step):
        if at == "after_forward" and step.cohort.prefill and step.cohort.tree:
            raise RuntimeError("device out of memory (injected)")

    outs, engine = run(target, draft, "ddtree", want, fault)
    errors = [o for o in outs if o.finish_reason == "error"]
    assert errors and all("device out of memory (injected)" in o.error for o in errors)
    assert engine.stats.dropped_steps == 3 and engine.stats.failed_steps == 1   # the third gave up
    for o, w in zip(outs, want):
        assert o.token_ids == w[:len(o.token_ids)]
        assert o.finish_reason == "error" or o.token_ids == w


def slot_digests(engine) -> list[str]:
    """Digest of every slot's recurrent state (conv and GDN, every GDN layer)."""
    rs, to_host = engine.model_state.recurrent, engine.model.backend.to_numpy
    out = []
    for slot in range(rs.max_slots):
        h = hashlib.sha256()
        for il in rs.gdn_layers:
            h.update(to_host(rs.conv(il, slot)).tobytes())
            h.update(to_host(rs.gdn(il, slot)).tobytes())
        out.append(h.hexdigest())
    return out


@pytest.mark.parametrize("mode", ["specla", "ddtree"])
def test_the_checkpoint_saves_only_the_prefill_and_ar_slots_and_rollback_restores_every_slot(pair, mode):
    """A fault after the forward of a mixed step [prefill][AR AR][tree] with a fifth, idle
    slot: the forward advanced the prefill and AR slots, the rollback put every slot's state
    back bitwise, and the checkpoint copied those slots' rows only (the tree slot and the
    idle slot never: save buffers of len(durable slots) rows per GDN layer)."""
    target, draft = pair
    want = [o.token_ids for o in run(target, draft, "off")[0]]
    seen: dict = {}

    def fault(engine, at, step):
        c = step.cohort
        mixed = c.prefill and c.decode and c.tree and "shape" not in seen
        if at == "before_forward" and mixed:
            seen["before"], seen["copied"] = slot_digests(engine), engine.model_state.recurrent.copied_bytes
        if at == "after_forward" and mixed:
            seen["shape"] = (len(c.prefill), len(c.decode), len(c.tree))
            seen["durable"], seen["tree"] = set(step.durable_slots), {t.slot for t in c.tree}
            seen["forward"] = slot_digests(engine)
            seen["saved"] = set(engine.model_state.recurrent.saved_slots)
            seen["checkpoint_bytes"] = engine.model_state.recurrent.copied_bytes - seen["copied"]
            raise RuntimeError("injected")

    def after_step(engine, updates):
        if "shape" in seen and "after" not in seen:
            seen["after"] = slot_digests(engine)
            seen["rollback_bytes"] = (engine.model_state.recurrent.copied_bytes - seen["copied"]
                                      - seen["checkpoint_bytes"])

    outs, engine = run(target, draft, mode, want, fault, after_step, slots=SLOTS + 1)
    assert seen["shape"] == (1, 2, 1) and len(seen["durable"]) == 3
    assert seen["saved"] == seen["durable"]
    rs = engine.model_state.recurrent
    per_slot = 4 * len(rs.gdn_layers) * (int(np.prod(rs.conv_shape)) + int(np.prod(rs.gdn_shape)))
    assert seen["checkpoint_bytes"] == seen["rollback_bytes"] == 3 * per_slot   # not 5 slots' worth
    changed = {s for s, (a, b) in enumerate(zip(seen["before"], seen["forward"])) if a != b}
    assert changed == seen["durable"]          # the forward advanced exactly the prefill and AR slots
    assert seen["after"] == seen["before"]      # every slot bitwise as before, the tree slot and the idle one too
    assert not seen["tree"] & seen["saved"]
    assert [o.token_ids for o in outs] == want
