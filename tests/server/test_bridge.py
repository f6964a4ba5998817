"""EngineBridge without HTTP: admission, engine failures, shutdown, stats snapshots."""
from __future__ import annotations

import asyncio

import pytest

from luce.engine.sampler import SamplingParams
from luce.server.bridge import EngineBridge, ModelInfo, QueueFullError
from tests.server.conftest import tiny_tokenizer
from tests.server.fake_core import SCRIPTS, FakeCore

INFO = ModelInfo(model_id="fake", path="fake.gguf", n_ctx=10_000, backend="fake", max_slots=2)


class FlakyCore(FakeCore):
    """Fails every step while `failing` is set; refuses prompts starting with token 0."""

    failing = False

    def step(self):
        if self.failing:
            self.failing = False
            raise RuntimeError("device lost")
        return super().step()

    def add_request(self, request_id, prompt_ids, params):
        if prompt_ids[0] == 0:
            raise ValueError("prompt starts with token 0")
        super().add_request(request_id, prompt_ids, params)


async def collect(handle):
    events = [e async for e in handle]
    return "".join(e.text for e in events), events[-1]


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 30))


def make(core=None, max_pending=4):
    tok = tiny_tokenizer()
    core = core or FakeCore(tok)
    return EngineBridge(core, tok, INFO, max_pending=max_pending, idle_wait_s=0.05).start(), core


def test_generates_the_script_and_frees_everything():
    bridge, core = make()
    prompt = [5, 6, 7]

    async def go():
        return await collect(bridge.submit(prompt, SamplingParams(max_tokens=1000), "r1"))

    text, last = run(go())
    bridge.close()
    assert text == SCRIPTS[sum(prompt) % len(SCRIPTS)] and last.finish_reason == "stop"
    assert bridge.n_live == 0 and core.finished == ["r1"]


def test_step_exception_fails_live_requests_and_the_bridge_goes_on():
    bridge, core = make(FlakyCore(tiny_tokenizer(), step_delay=0.01))

    async def go():
        h1 = bridge.submit([5], SamplingParams(max_tokens=1000), "a")
        h2 = bridge.submit([6], SamplingParams(max_tokens=1000), "b")
        await h1.__anext__()           # both running
        core.failing = True
        r1, r2 = await asyncio.gather(collect(h1), collect(h2))
        r3 = await collect(bridge.submit([7], SamplingParams(max_tokens=3), "c"))
        return r1, r2, r3

    (_, e1), (_, e2), (_, e3) = run(go())
    bridge.close()
    assert e1.finish_reason == e2.finish_reason == "error" and "device lost" in e1.error
    assert e3.finish_reason == "length" and bridge.n_live == 0


def test_engine_refusal_is_an_error_event():
    bridge, _ = make(FlakyCore(tiny_tokenizer()))

    async def go():
        return await collect(bridge.submit([0, 1], SamplingParams(max_tokens=3), "x"))

    _, last = run(go())
    bridge.close()
    assert last.finish_reason == "error" and "token 0" in last.error and bridge.n_live == 0


def test_queue_full_is_raised_at_submit_and_clears_when_requests_end():
    bridge, _ = make(FakeCore(tiny_tokenizer(), step_delay=0.01), max_pending=2)

    async def go():
        handles = [bridge.submit([i + 1], SamplingParams(max_tokens=1000), f"q{i}") for i in range(2)]
        with pytest.raises(QueueFullError):
            bridge.submit([9], SamplingParams(max_tokens=2), "q2")
        handles[0].cancel()
        extra = bridge.submit([9], SamplingParams(max_tokens=2), "q2")    # room again
        await asyncio.gather(collect(handles[1]), collect(extra))
        dup = bridge.submit([1], SamplingParams(max_tokens=2), "dup")
        with pytest.raises(ValueError):
            bridge.submit([1], SamplingParams(max_tokens=2), "dup")     # that id is live
        await collect(dup)
        assert bridge.n_live == 0

    run(go())
    bridge.close()


def test_close_fails_requests_still_running():
    bridge, _ = make(FakeCore(tiny_tokenizer(), step_delay=0.01, script_repeat=100))

    async def go():
        handle = bridge.submit([3], SamplingParams(max_tokens=5000), "long")
        await handle.__anext__()
        await asyncio.to_thread(bridge.close)
        return await collect(handle)

    _, last = run(go())
    assert last.finish_reason == "error" and "shutting down" in last.error and not bridge.running


def test_stats_snapshot_reports_engine_gauges_and_queue():
    bridge, core = make(FakeCore(tiny_tokenizer(), max_slots=1, step_delay=0.01, script_repeat=100))

    async def go():
        a = bridge.submit([3], SamplingParams(max_tokens=5000), "a")
        b = bridge.submit([4], SamplingParams(max_tokens=5000), "b")
        await a.__anext__()
        for _ in range(200):
            stats = bridge.stats()
            if stats.slots_busy == 1 and stats.queue_depth == 1:
                break
            await asyncio.sleep(0.01)
        a.cancel()
        b.cancel()
        return stats

    stats = run(go())
    bridge.close()
    assert (stats.slots_total, stats.slots_busy, stats.queue_depth) == (1, 1, 1)
    assert stats.kv_pages_used >= 1 and stats.kv_pages_free == stats.kv_pages_total - stats.kv_pages_used
