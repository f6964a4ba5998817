"""Tool calls and reasoning through the official openai client, with the model's text scripted
(a tiny random model cannot be made to write a tool call): the server renders the prompt with
the Qwen-style templates, the fake engine says the scripted text, the server parses it."""
from __future__ import annotations

import json

import pytest

from luce.server.turn import BUDGET_CLOSE, ChatSettings
from tests.server.conftest import fake_server as _fake_server
from tests.server.conftest import openai_client
from tests.server.templates import QWEN25_TOOLS, QWEN35_TOOLS, tokenizer_with

openai = pytest.importorskip("openai")

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                   "required": ["city"]}}}
CLOCK = {"type": "function", "function": {"name": "now", "parameters": {"type": "object", "properties": {}}}}
ASK = [{"role": "user", "content": "Weather in Paris?"}]
HERMES_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n</tool_call>'
XML_CALL = "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n2\n" \
           "</parameter>\n</function>\n</tool_call>"


def fake_server(n_ctx=4096, **kw):
    return _fake_server(n_ctx=n_ctx, **kw)


def says(text):
    return lambda prompt_ids: text


def prompt_len(template, messages, tools=None, **kw):
    tok = tokenizer_with(template)
    return len(tok.encode(tok.apply_chat_template(messages, add_generation_prompt=True, tools=tools, **kw)))


def collect_stream(stream):
    calls, content, reasoning, finish = {}, "", "", []
    for chunk in stream:
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        content += delta.content or ""
        reasoning += getattr(delta, "reasoning_content", None) or ""
        for tc in delta.tool_calls or []:
            slot = calls.setdefault(tc.index, {"id": None, "name": "", "arguments": ""})
            slot["id"] = tc.id or slot["id"]
            slot["name"] += tc.function.name or ""
            slot["arguments"] += tc.function.arguments or ""
        if chunk.choices[0].finish_reason:
            finish.append(chunk.choices[0].finish_reason)
    return [calls[i] for i in sorted(calls)], content, reasoning, finish


@pytest.mark.parametrize("template,script", [(QWEN25_TOOLS, HERMES_CALL),
                                             (QWEN35_TOOLS, "Look it up.</think>\n\n" + XML_CALL)],
                         ids=["hermes", "qwen3-xml"])
def test_tool_call_round_trip(template, script):
    with fake_server(chat_template=template, script_fn=says(script)) as s:
        client = openai_client(s)
        r = client.chat.completions.create(model="m", messages=ASK, tools=[WEATHER, CLOCK])
        choice = r.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.content is None
        (call,) = choice.message.tool_calls
        assert call.type == "function" and call.function.name == "get_weather" and call.id.startswith("call_")
        assert json.loads(call.function.arguments) == {"city": "Paris", "days": 2}
        assert r.usage.prompt_tokens == prompt_len(template, ASK, [WEATHER, CLOCK])
        # the result goes back: the assistant's call and the tool message reach the template
        history = ASK + [choice.message.model_dump(exclude_none=True),
                         {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"}]
        r2 = client.chat.completions.create(model="m", messages=history, tools=[WEATHER, CLOCK])
        said = {"role": "assistant", "content": "", "tool_calls": [
            {"id": call.id, "type": "function", "function": {"name": "get_weather",
                                                             "arguments": {"city": "Paris", "days": 2}}}]}
        if template is QWEN35_TOOLS:          # the reasoning goes back too, as Qwen3.5's template shows it
            assert choice.message.reasoning_content == "Look it up."
            said["reasoning_content"] = "Look it up."
        expected = ASK + [said, {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"}]
        assert r2.usage.prompt_tokens == prompt_len(template, expected, [WEATHER, CLOCK])
        prompt = tokenizer_with(template).decode(s.core.prompts[r2.id])
        assert "<tool_response>\nsunny, 21 C\n</tool_response>" in prompt and "Paris" in prompt


@pytest.mark.parametrize("template,script", [(QWEN25_TOOLS, "Checking.\n" + HERMES_CALL),
                                             (QWEN35_TOOLS, "I need the weather.\n</think>\n\n" + XML_CALL)],
                         ids=["hermes", "qwen3-xml"])
def test_tool_call_streamed_as_deltas(template, script):
    with fake_server(chat_template=template, script_fn=says(script)) as s:
        stream = openai_client(s).chat.completions.create(model="m", messages=ASK, tools=[WEATHER], stream=True)
        calls, content, reasoning, finish = collect_stream(stream)
        assert finish == ["tool_calls"]
        assert [(c["name"], json.loads(c["arguments"])) for c in calls] == [("get_weather", {"city": "Paris",
                                                                                             "days": 2})]
        assert calls[0]["id"].startswith("call_")
        if template is QWEN25_TOOLS:
            assert (content, reasoning) == ("Checking.", "")
        else:                                # the generation prompt opened the think block
            assert (content, reasoning) == ("", "I need the weather.\n")


def test_tool_choice_none_renders_no_tools_and_parses_nothing():
    with fake_server(chat_template=QWEN25_TOOLS, script_fn=says(HERMES_CALL)) as s:
        r = openai_client(s).chat.completions.create(model="m", messages=ASK, tools=[WEATHER], tool_choice="none")
        assert r.choices[0].message.content == HERMES_CALL and r.choices[0].message.tool_calls is None
        assert r.choices[0].finish_reason == "stop" and r.usage.prompt_tokens == prompt_len(QWEN25_TOOLS, ASK)


def test_tool_choice_required_and_named_start_the_call_in_the_prompt():
    rest = '{"name": "now", "arguments": {}}\n</tool_call>'
    with fake_server(chat_template=QWEN25_TOOLS, script_fn=says(rest)) as s:
        r = openai_client(s).chat.completions.create(model="m", messages=ASK, tools=[WEATHER, CLOCK],
                                                     tool_choice="required")
        assert [c.function.name for c in r.choices[0].message.tool_calls] == ["now"]
        prompt = tokenizer_with(QWEN25_TOOLS).decode(s.core.prompts[r.id])
        assert prompt.endswith("<|im_start|>assistant\n<tool_call>\n")
    with fake_server(chat_template=QWEN25_TOOLS, script_fn=says('{"city": "Rome"}}\n</tool_call>')) as s:
        r = openai_client(s).chat.completions.create(
            model="m", messages=ASK, tools=[WEATHER, CLOCK],
            tool_choice={"type": "function", "function": {"name": "get_weather"}})
        (call,) = r.choices[0].message.tool_calls
        assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Rome"}


def test_tool_choice_required_without_a_call_is_an_error_that_says_why():
    """The grammar forces the call; a turn cut before it closes (here: the fake core, which
    ignores grammars, ends at once) has none, and the error says what cut it. A think block
    the template opens is closed first: a forced call is not thought about."""
    with fake_server(chat_template=QWEN35_TOOLS, script_fn=says("")) as s:
        client = openai_client(s)
        with pytest.raises(openai.InternalServerError) as e:
            client.chat.completions.create(model="m", messages=ASK, tools=[WEATHER], tool_choice="required")
        assert "tool_choice" in e.value.message and "max_tokens" in e.value.message
        (prompt,) = s.core.prompts.values()
        assert tokenizer_with(QWEN35_TOOLS).decode(prompt).endswith("</think>\n\n<tool_call>\n<function=")
        with pytest.raises(openai.APIError) as e2:
            list(client.chat.completions.create(model="m", messages=ASK, tools=[WEATHER], tool_choice="required",
                                                stream=True))
        assert "tool_choice" in str(e2.value)


def test_parallel_tool_calls_false_keeps_the_first_call():
    two = HERMES_CALL + '\n<tool_call>\n{"name": "now", "arguments": {}}\n</tool_call>'
    with fake_server(chat_template=QWEN25_TOOLS, script_fn=says(two)) as s:
        client = openai_client(s)
        both = client.chat.completions.create(model="m", messages=ASK, tools=[WEATHER, CLOCK])
        assert [c.function.name for c in both.choices[0].message.tool_calls] == ["get_weather", "now"]
        one = client.chat.completions.create(model="m", messages=ASK, tools=[WEATHER, CLOCK],
                                             parallel_tool_calls=False)
        assert [c.function.name for c in one.choices[0].message.tool_calls] == ["get_weather"]
        calls, _, _, _ = collect_stream(client.chat.completions.create(
            model="m", messages=ASK, tools=[WEATHER, CLOCK], parallel_tool_calls=False, stream=True))
        assert [c["name"] for c in calls] == ["get_weather"]


@pytest.mark.parametrize("stream", [False, True])
def test_reasoning_is_split_from_the_content(stream):
    with fake_server(chat_template=QWEN25_TOOLS, script_fn=says("<think>\n2 and 2</think>\n\nFour.")) as s:
        client = openai_client(s)
        if stream:
            _, content, reasoning, finish = collect_stream(client.chat.completions.create(
                model="m", messages=ASK, stream=True))
            assert finish == ["stop"]
        else:
            message = client.chat.completions.create(model="m", messages=ASK).choices[0].message
            content, reasoning = message.content, message.reasoning_content
        assert (reasoning, content) == ("\n2 and 2", "Four.")
        raw = client.chat.completions.create(model="m", messages=ASK, extra_body={"reasoning_format": "none"})
        assert raw.choices[0].message.content == "<think>\n2 and 2</think>\n\nFour."


def test_chat_template_kwargs_reach_the_template():
    with fake_server(chat_template=QWEN35_TOOLS, script_fn=says("Hi.")) as s:
        r = openai_client(s).chat.completions.create(
            model="m", messages=ASK, extra_body={"chat_template_kwargs": {"enable_thinking": False}})
        assert r.choices[0].message.content == "Hi."
        assert r.usage.prompt_tokens == prompt_len(QWEN35_TOOLS, ASK, enable_thinking=False)
        assert tokenizer_with(QWEN35_TOOLS).decode(s.core.prompts[r.id]).endswith("<think>\n\n</think>\n\n")


def test_reasoning_budget_closes_the_think_block_and_generation_goes_on():
    tok = tokenizer_with(QWEN35_TOOLS)
    thinking = "step " * 40

    def model(prompt_ids):
        return "The answer is 4." if tok.decode(prompt_ids).endswith(BUDGET_CLOSE) else thinking + "</think>Late."

    with fake_server(chat_template=QWEN35_TOOLS, script_fn=model,
                     chat=ChatSettings(reasoning_budget=6)) as s:
        r = openai_client(s).chat.completions.create(model="m", messages=ASK)
        message = r.choices[0].message
        first_six = tok.encode(thinking)[:6]
        assert message.reasoning_content == tok.decode(first_six) + "\n"
        assert message.content == "The answer is 4." and r.choices[0].finish_reason == "stop"
        assert r.usage.completion_tokens == 6 + len(tok.encode("The answer is 4.")) + 1
        first, second = s.core.prompts.values()
        assert second == first + first_six + tok.encode(BUDGET_CLOSE)


def test_reasoning_budget_zero_turns_thinking_off():
    with fake_server(chat_template=QWEN35_TOOLS, script_fn=says("Hi."), chat=ChatSettings(reasoning_budget=0)) as s:
        r = openai_client(s).chat.completions.create(model="m", messages=ASK)
        assert r.usage.prompt_tokens == prompt_len(QWEN35_TOOLS, ASK, enable_thinking=False)
        assert r.choices[0].message.content == "Hi."
