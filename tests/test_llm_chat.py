"""luce.LLM.chat (templates, tools, parsed output), vLLM-shaped outputs, stop given as a string."""
from __future__ import annotations

import json

import pytest

from luce.engine.request import RequestOutput
from luce.engine.sampler import SamplingParams
from luce.llm import LLM
from luce.testing.tiny_models import make_qwen35
from tests.server.templates import QWEN25_TOOLS, tokenizer_with

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    path = tmp_path_factory.mktemp("chat") / "q35.gguf"
    make_qwen35(path, seed=4)
    return LLM(path, backend="numpy", max_slots=2, ctx=256, token_budget=2 + 64)


def test_chat_is_generate_over_the_templated_prompt(llm):
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    params = SamplingParams(max_tokens=6, ignore_eos=True)
    (out,) = llm.chat(msgs, params)
    ids = llm.tokenizer.encode(llm.tokenizer.apply_chat_template(msgs, add_generation_prompt=True))
    (ref,) = llm.generate([ids], params)
    assert out.token_ids == ref.token_ids and out.prompt_token_ids == ids
    assert out.outputs[0].text == out.text == ref.text and out.outputs[0].token_ids == out.token_ids
    assert isinstance(out, RequestOutput)
    two = llm.chat([msgs, [{"role": "user", "content": "again"}]], params)
    assert len(two) == 2 and two[0].token_ids == out.token_ids


def test_vllm_shaped_outputs_from_generate(llm):
    (out,) = llm.generate(["def f():"], SamplingParams(max_tokens=4, ignore_eos=True))
    first = out.outputs[0]
    assert (first.index, first.text, first.token_ids, first.finish_reason) == (0, out.text, out.token_ids, "length")


def test_stop_may_be_one_string(llm):
    assert SamplingParams(stop="ab").stop == ("ab",) == SamplingParams(stop=["ab"]).stop
    full = llm.generate(["hello"], SamplingParams(max_tokens=12, ignore_eos=True))[0].text
    stop = next((full[i:i + 2] for i in range(1, len(full) - 2) if "\ufffd" not in full[i:i + 2]
                 and full[i:i + 2].strip()), None)
    if stop is None:
        pytest.skip("the tiny model's text has no clean 2-character stop candidate")
    cut = llm.generate(["hello"], SamplingParams(max_tokens=12, ignore_eos=True, stop=stop))[0]
    assert cut.text == full[:full.index(stop)] and cut.finish_reason == "stop" and cut.stop_reason == stop


def test_chat_parses_tool_calls_and_reasoning(llm, monkeypatch):
    tok = tokenizer_with(QWEN25_TOOLS)
    monkeypatch.setattr(llm, "tokenizer", tok)
    said = '<think>use the tool</think><tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    seen = []

    def scripted(prompts, params=None):        # the tiny random model cannot write a call
        seen.extend(prompts)
        return [scripted_output(said)]

    monkeypatch.setattr(llm, "generate", scripted)
    msgs = [{"role": "user", "content": "weather?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "rain"}]
    (out,) = llm.chat(msgs, tools=[WEATHER])
    first = out.outputs[0]
    assert first.text == said and first.reasoning_content == "use the tool" and first.content == ""
    assert [(c.name, json.loads(c.arguments)) for c in first.tool_calls] == [("get_weather", {"city": "Oslo"})]
    prompt = tok.decode(seen[0])
    assert '{"name": "get_weather", "arguments": {"city": "Rome"}}' in prompt and "<tool_response>\nrain" in prompt
    with pytest.raises(ValueError, match="not valid JSON"):
        llm.chat([{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{"}}]}])


def scripted_output(text):
    from luce.llm import LLMOutput

    return LLMOutput.of(RequestOutput("r", [1], text, [1, 2], "stop"))
