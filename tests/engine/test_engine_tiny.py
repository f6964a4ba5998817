"""Acceptance on the tiny qwen35 (hybrid) and qwen3 (dense) models, numpy backend: every
request's output is byte-identical alone and among concurrent requests with staggered
arrivals, prompts of 1 to 1,100 tokens (across page and 64-token chunk boundaries, chunked
by a small token budget), a cancellation in the middle, greedy and seeded sampling.

Beyond tokens, the logits every request sees at every position are compared bit for bit
(recorded around the model's forward), so a rounding difference cannot hide behind argmax.
"Alone" is a one-slot engine with a budget that takes every prompt in one segment; greedy
requests are also checked against luce.models.generate_greedy, which involves no engine.
"""
import numpy as np
import pytest

from luce.engine import Engine, EngineConfig, FinishReason, SamplingParams
from luce.models import generate_greedy, load_model
from luce.testing.tiny_models import make_dense, make_qwen35
from luce.tokenizer import Tokenizer

LENGTHS = (1, 17, 64, 65, 300, 1100)
ARRIVALS = (0, 1, 1, 2, 3, 4)
CANCELLED = 3          # request index cancelled after its prompt and a few tokens
MAX_TOKENS = 6


@pytest.fixture(scope="module", params=["qwen35", "qwen3"])
def tiny(request, tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny") / f"{request.param}.gguf"
    if request.param == "qwen35":
        make_qwen35(path, seed=3)
    else:
        make_dense(path, arch="qwen3", seed=3)
    return load_model(path, "cpu"), Tokenizer.from_gguf(path)


def prompts_and_params():
    rng = np.random.default_rng(11)
    prompts = [rng.integers(0, 400, n).tolist() for n in LENGTHS]
    params = [SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True) if i % 2 == 0 else
              SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True, temperature=0.9, top_p=0.95, seed=100 + i)
              for i in range(len(prompts))]
    return prompts, params


class LogitsRecorder:
    """Wraps a model so that every logits row is kept under (request id, predicted position)."""

    def __init__(self, model, engine_ref):
        self.model, self.engine_ref = model, engine_ref
        self.config, self.backend = model.config, model.backend
        self.rows = {}

    def new_state(self, max_pages, max_slots):
        return self.model.new_state(max_pages, max_slots)

    def forward(self, batch, state):
        out = self.model.forward(batch, state)
        step, engine = self.engine_ref["step"], self.engine_ref["engine"]
        logits = self.backend.to_numpy(out.logits)
        for i, (slot, pos) in enumerate(zip(step.logits_slot.tolist(), step.logits_position.tolist())):
            if slot < 0:          # a logits row that gives no token (padding, a prompt chunk's inside)
                continue
            self.rows[(engine.slots.table[slot].request_id, pos)] = logits[i].tobytes()
        return out


def recording_engine(model, tokenizer, config):
    ref = {}
    recorder = LogitsRecorder(model, ref)
    engine = Engine(recorder, tokenizer, config)
    ref["engine"] = engine

    def keep_step(point, step):
        ref["step"] = step

    engine.fault_hook = keep_step
    return engine, recorder


def run_alone(model, tokenizer, prompt, params):
    """(output, {position: logits bytes}) of one request in a one-slot engine."""
    engine, recorder = recording_engine(model, tokenizer, EngineConfig(max_slots=1, ctx=2048, token_budget=2048))
    rid = engine.add_request(prompt, params)
    engine.run()
    return engine.take_output(rid), {pos: row for (r, pos), row in recorder.rows.items() if r == rid}


@pytest.fixture(scope="module")
def alone_runs(tiny):
    model, tokenizer = tiny
    prompts, params = prompts_and_params()
    alone, alone_logits = zip(*[run_alone(model, tokenizer, p, sp) for p, sp in zip(prompts, params)])
    for i in range(0, len(prompts), 2):   # greedy ones: the engine equals a plain model loop
        assert alone[i].token_ids == generate_greedy(model, prompts[i], MAX_TOKENS)
    return alone, alone_logits


@pytest.mark.parametrize("max_slots", [2, 5])
def test_each_request_alone_equals_among_others(tiny, alone_runs, max_slots):
    model, tokenizer = tiny
    prompts, params = prompts_and_params()
    alone, alone_logits = alone_runs
    config = EngineConfig(max_slots=max_slots, ctx=2048, token_budget=max_slots + 64 + 30)
    engine, recorder = recording_engine(model, tokenizer, config)
    ids, step, max_live = {}, 0, 0
    while len(ids) < len(prompts) or engine.has_unfinished():
        for i, t in enumerate(ARRIVALS):
            if t == step:
                ids[i] = engine.add_request(prompts[i], params[i])
        victim = engine.requests.get(ids.get(CANCELLED))
        if victim is not None and not victim.finished and len(victim.output_ids) == 2:
            assert engine.cancel(ids[CANCELLED])
        engine.step()
        engine.check()
        max_live = max(max_live, engine.slots.n_live)
        step += 1
    outs = [engine.take_output(ids[i]) for i in range(len(prompts))]
    assert engine.pool.n_used == 0
    assert engine.stats.steps > max(ARRIVALS) and len(engine.stats.replay_keys) > 3
    assert max_live == max_slots                      # every slot was busy at some step
    for i, (out, ref) in enumerate(zip(outs, alone)):
        if i == CANCELLED:
            assert out.finish_reason == FinishReason.CANCELLED
            assert out.token_ids == ref.token_ids[:2]
        else:
            assert out.finish_reason == FinishReason.LENGTH
            assert out.token_ids == ref.token_ids, f"request {i} ({LENGTHS[i]} tokens) differs"
            assert out.text == ref.text
        mine = {pos: row for (r, pos), row in recorder.rows.items() if r == ids[i]}
        assert mine and all(mine[pos] == alone_logits[i][pos] for pos in mine), f"request {i} logits differ"


def test_padding_does_not_change_outputs(tiny):
    """Replay-key padding adds rows to a step; live rows must not notice (batch invariance)."""
    model, tokenizer = tiny
    prompts, params = prompts_and_params()
    outs = []
    for pad in (True, False):
        engine = Engine(model, tokenizer, EngineConfig(max_slots=3, ctx=512, token_budget=3 + 64, pad_steps=pad))
        ids = [engine.add_request(p, sp) for p, sp in zip(prompts[:4], params[:4])]
        engine.run()
        outs.append([engine.take_output(r).token_ids for r in ids])
        assert (engine.stats.padded_rows > 0) == pad
    assert outs[0] == outs[1]


def test_reused_slot_after_fault_matches_fresh_engine(tiny):
    model, tokenizer = tiny
    prompts, params = prompts_and_params()
    engine, recorder = recording_engine(model, tokenizer, EngineConfig(max_slots=2, ctx=512, token_budget=2 + 64))
    keep_step, armed = engine.fault_hook, []

    def fault(point, step):
        keep_step(point, step)
        if point == "after_forward" and armed:
            raise RuntimeError("device fell over")

    engine.fault_hook = fault
    a = engine.add_request(prompts[2], params[2])
    engine.step()
    engine.step()
    armed.append(True)
    for _ in range(engine.config.max_step_retries):  # a's state was written, the step failed: rolled back
        assert engine.step() == [] and not engine.get(a).finished
    engine.step()                                   # failed once more: a ends with the cause
    assert engine.get(a).finish_reason == FinishReason.ERROR and "device fell over" in engine.get(a).error
    armed.clear()
    b = engine.add_request(prompts[1], params[1])    # lands in a's slot
    engine.run()
    out, logits = run_alone(model, tokenizer, prompts[1], params[1])
    assert engine.take_output(b).token_ids == out.token_ids
    assert {pos: row for (r, pos), row in recorder.rows.items() if r == b} == logits


def test_token_budget_default_follows_the_backend(tiny):
    """No token_budget named: 512 rows a step on the CPU; on a GPU backend 2,048 where the prompt
    rows' attention workspace at the engine's context fits 1/16 of the free memory, else 1,024,
    else 512; always room for every slot's AR row beside a 64-row prompt chunk."""
    from luce.engine.engine_config import default_token_budget

    big = dict(ctx=4096, n_head=24, head_dim=256, free_bytes=100 << 30)
    ws2048 = 2048 * 24 * 4 * 258 * 4                        # 27B heads at 4,096 keys (4 splits): 203 MB
    assert (default_token_budget("cuda", 5, **big), default_token_budget("hip", 5, **big)) == (2048, 2048)
    assert default_token_budget("cuda", 5, **{**big, "free_bytes": 16 * ws2048}) == 2048
    assert default_token_budget("cuda", 5, **{**big, "free_bytes": 16 * ws2048 - 1}) == 1024
    assert default_token_budget("cuda", 5, **{**big, "free_bytes": 8 * ws2048 - 1}) == 512
    assert default_token_budget("cuda", 5, **{**big, "free_bytes": None}) == 512
    longer = {**big, "ctx": 4097, "free_bytes": 16 * ws2048}  # a fifth split: 2,048 rows no longer fit
    assert default_token_budget("cuda", 5, **longer) == 1024
    assert default_token_budget("cuda", 5, **{**longer, "free_bytes": 16 * ws2048 * 5 // 4}) == 2048
    assert (default_token_budget("cpu", 5, **big), default_token_budget("numpy", 5)) == (512, 512)
    assert default_token_budget("cpu", 600) == 664 and default_token_budget("cuda", 2000, **big) == 2064
    model, tokenizer = tiny
    engine = Engine(model, tokenizer, EngineConfig(max_slots=2, ctx=512))
    assert engine.config.token_budget == engine.scheduler.token_budget == 512
    assert Engine(model, tokenizer, EngineConfig(max_slots=2, ctx=512, token_budget=100)).config.token_budget == 100
