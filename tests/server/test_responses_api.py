"""The OpenAI Responses API (/v1/responses) through the official openai client, scripted output."""
from __future__ import annotations

import json

import pytest

from tests.server.conftest import fake_server, openai_client
from tests.server.templates import QWEN25_TOOLS, QWEN35_TOOLS, tokenizer_with

openai = pytest.importorskip("openai")

TOOL = {"type": "function", "name": "shell", "description": "Run a command",
        "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}}
CALL = '<tool_call>\n{"name": "shell", "arguments": {"cmd": "ls"}}\n</tool_call>'


def server(script, template=QWEN25_TOOLS):
    return fake_server(n_ctx=4096, chat_template=template, script_fn=lambda ids: script)


def test_text_answer_with_instructions():
    with server("Hello from luce.") as s:
        r = openai_client(s).responses.create(model="m", instructions="Be kind.", input="hi")
        assert r.status == "completed" and r.output_text == "Hello from luce."
        tok = tokenizer_with(QWEN25_TOOLS)
        msgs = [{"role": "system", "content": "Be kind."}, {"role": "user", "content": "hi"}]
        assert r.usage.input_tokens == len(tok.encode(tok.apply_chat_template(msgs)))
        assert r.usage.output_tokens == len(tok.encode("Hello from luce.")) + 1
        short = openai_client(s).responses.create(model="m", input="hi", max_output_tokens=2)
        assert short.status == "incomplete" and short.incomplete_details.reason == "max_output_tokens"


def test_function_call_round_trip():
    with server(CALL) as s:
        client = openai_client(s)
        r = client.responses.create(model="m", input="list files", tools=[TOOL])
        (call,) = [o for o in r.output if o.type == "function_call"]
        assert call.name == "shell" and json.loads(call.arguments) == {"cmd": "ls"}
        follow = client.responses.create(model="m", tools=[TOOL], input=[
            {"role": "user", "content": "list files"},
            {"type": "function_call", "call_id": call.call_id, "name": "shell", "arguments": call.arguments},
            {"type": "function_call_output", "call_id": call.call_id, "output": "a.txt b.txt"}])
        prompt = tokenizer_with(QWEN25_TOOLS).decode(s.core.prompts[follow.id])
        assert "<tool_response>\na.txt b.txt\n</tool_response>" in prompt and '"cmd": "ls"' in prompt


def test_stream_events_reasoning_then_call():
    with server("Run ls.</think>\n\n<tool_call>\n<function=shell>\n<parameter=cmd>\nls\n</parameter>\n</function>"
                "\n</tool_call>", template=QWEN35_TOOLS) as s:
        events = list(openai_client(s).responses.create(model="m", input="list files", tools=[TOOL], stream=True))
        kinds = [e.type for e in events]
        assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
        assert [e.sequence_number for e in events] == list(range(len(events)))
        assert "response.reasoning_text.delta" in kinds and "response.function_call_arguments.done" in kinds
        final = events[-1].response
        assert [o.type for o in final.output] == ["reasoning", "function_call"]
        assert final.output[0].content[0].text == "Run ls." and json.loads(final.output[1].arguments) == {"cmd": "ls"}


def test_unsupported_fields_say_so():
    with server("x") as s:
        client = openai_client(s)
        with pytest.raises(openai.BadRequestError) as e:
            client.responses.create(model="m", input="hi", previous_response_id="resp_1")
        assert "whole conversation" in e.value.message
        with pytest.raises(openai.BadRequestError) as e:
            client.responses.create(model="m", input="hi", tools=[{"type": "web_search"}])
        assert "only function tools" in e.value.message
