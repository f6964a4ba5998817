"""The Anthropic Messages API through the official anthropic client (what Claude Code speaks),
over the scripted fake engine with a Qwen3.5-style template (XML tool calls, think blocks)."""
from __future__ import annotations

import json

import pytest

from tests.server import rawhttp
from tests.server.conftest import fake_server
from tests.server.templates import QWEN25_TOOLS, QWEN35_TOOLS, tokenizer_with

anthropic = pytest.importorskip("anthropic")

TOOLS = [{"name": "read_file", "description": "Read a file",
          "input_schema": {"type": "object", "properties": {"path": {"type": "string"}, "lines": {"type": "integer"}},
                           "required": ["path"]}}]
CALL = "I will read it.</think>\n\n<tool_call>\n<function=read_file>\n<parameter=path>\nsetup.py\n</parameter>\n" \
       "<parameter=lines>\n20\n</parameter>\n</function>\n</tool_call>"
ASK = [{"role": "user", "content": "What is in setup.py?"}]


def client(server, key="unused"):
    return anthropic.Anthropic(base_url=server.url, api_key=key, max_retries=0, timeout=30)


def server(script, template=QWEN35_TOOLS, **kw):
    return fake_server(n_ctx=4096, chat_template=template, script_fn=lambda ids: script, **kw)


def rendered(messages, tools=None, **kw):
    tok = tokenizer_with(QWEN35_TOOLS)
    return len(tok.encode(tok.apply_chat_template(messages, add_generation_prompt=True, tools=tools, **kw)))


def test_messages_tool_use_round_trip():
    with server(CALL) as s:
        c = client(s)
        m = c.messages.create(model="luce", max_tokens=200, system="You are terse.", messages=ASK, tools=TOOLS)
        assert m.stop_reason == "tool_use" and m.role == "assistant"
        kinds = [b.type for b in m.content]
        assert kinds == ["thinking", "tool_use"]
        assert m.content[0].thinking == "I will read it."
        use = m.content[1]
        assert use.name == "read_file" and use.input == {"path": "setup.py", "lines": 20} and use.id.startswith("toolu_")
        openai_tools = [{"type": "function", "function": {"name": "read_file", "description": "Read a file",
                                                          "parameters": TOOLS[0]["input_schema"]}}]
        system = [{"role": "system", "content": "You are terse."}]
        assert m.usage.input_tokens == rendered(system + ASK, openai_tools)
        assert m.usage.output_tokens == len(tokenizer_with(QWEN35_TOOLS).encode(CALL)) + 1
        # the tool result goes back as a tool_result block
        history = ASK + [{"role": "assistant", "content": [b.model_dump() for b in m.content]},
                         {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                                       "content": [{"type": "text", "text": "setup(name='x')"}]}]}]
        m2 = c.messages.create(model="luce", max_tokens=200, system="You are terse.", messages=history, tools=TOOLS)
        expected = system + ASK + [
            {"role": "assistant", "content": "", "reasoning_content": "I will read it.",
             "tool_calls": [{"id": use.id, "type": "function",
                             "function": {"name": "read_file", "arguments": {"path": "setup.py", "lines": 20}}}]},
            {"role": "tool", "tool_call_id": use.id, "content": "setup(name='x')"}]
        assert m2.usage.input_tokens == rendered(expected, openai_tools)
        counted = c.messages.count_tokens(model="luce", system="You are terse.", messages=history, tools=TOOLS)
        assert counted.input_tokens == m2.usage.input_tokens


def test_messages_stream_events_and_final_message():
    with server(CALL) as s:
        with client(s).messages.stream(model="luce", max_tokens=200, messages=ASK, tools=TOOLS) as stream:
            events = [e.type for e in stream]
            final = stream.get_final_message()
        assert events[0] == "message_start" and events[-1] == "message_stop"
        assert events.count("content_block_start") == 2 == events.count("content_block_stop")
        assert "message_delta" in events
        assert final.stop_reason == "tool_use"
        assert [b.type for b in final.content] == ["thinking", "tool_use"]
        assert final.content[1].input == {"path": "setup.py", "lines": 20}


def test_raw_stream_has_named_events_with_ping_and_usage():
    with server("Hi there.</think>Hello!") as s:
        body = {"model": "luce", "max_tokens": 50, "messages": ASK, "stream": True}
        resp = rawhttp.call(s.url, "POST", "/v1/messages", body)
        lines = resp.body.decode().split("\n")
        names = [ln[len("event: "):] for ln in lines if ln.startswith("event: ")]
        assert names[:2] == ["message_start", "ping"]
        assert names[-2:] == ["message_delta", "message_stop"]
        data = [json.loads(ln[6:]) for ln in lines if ln.startswith("data: ")]
        assert [d["type"] for d in data] == names
        delta = next(d for d in data if d["type"] == "message_delta")
        assert delta["delta"]["stop_reason"] == "end_turn" and delta["usage"]["output_tokens"] > 0
        texts = [d["delta"] for d in data if d["type"] == "content_block_delta"]
        assert "".join(t.get("text", "") for t in texts) == "Hello!"
        assert "".join(t.get("thinking", "") for t in texts) == "Hi there."


def test_text_answer_stop_reasons_and_thinking_disabled():
    with server("Plain answer. STOP here", template=QWEN25_TOOLS) as s:
        c = client(s)
        m = c.messages.create(model="luce", max_tokens=100, messages=ASK)
        assert [b.type for b in m.content] == ["text"] and m.content[0].text == "Plain answer. STOP here"
        assert m.stop_reason == "end_turn"
        m = c.messages.create(model="luce", max_tokens=100, messages=ASK, stop_sequences=["STOP"])
        assert m.content[0].text == "Plain answer. " and m.stop_reason == "stop_sequence" and m.stop_sequence == "STOP"
        m = c.messages.create(model="luce", max_tokens=3, messages=ASK)
        assert m.stop_reason == "max_tokens" and m.usage.output_tokens == 3
    with server("Hi.") as s:
        m = client(s).messages.create(model="luce", max_tokens=20, messages=ASK, thinking={"type": "disabled"})
        assert m.usage.input_tokens == rendered(ASK, enable_thinking=False) and m.content[0].text == "Hi."


def test_x_api_key_auth_and_anthropic_error_shape():
    with server("Hi.", template=QWEN25_TOOLS, api_key="sekrit") as s:
        with pytest.raises(anthropic.AuthenticationError) as e:
            client(s, key="wrong").messages.create(model="luce", max_tokens=5, messages=ASK)
        assert e.value.status_code == 401 and e.value.body["type"] == "error"
        assert e.value.body["error"]["type"] == "authentication_error"
        assert client(s, key="sekrit").messages.create(model="luce", max_tokens=5, messages=ASK).content[0].text == "Hi."
        with pytest.raises(anthropic.BadRequestError) as e:
            client(s, key="sekrit").messages.create(model="luce", max_tokens=5, messages=[
                {"role": "user", "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                                          "data": "AA=="}}]}])
        assert "'image' is not supported" in e.value.body["error"]["message"]
        resp = rawhttp.call(s.url, "POST", "/v1/messages", {"messages": ASK}, {"x-api-key": "sekrit"})
        assert resp.status == 400 and resp.json() == {"type": "error", "error": {
            "type": "invalid_request_error", "message": "max_tokens: is required"}}
