"""Tool-call and reasoning parsing on fixed model outputs, whole and streamed in every split."""
from __future__ import annotations

import json

import pytest

from luce.server.assistant_output import AssistantOutput, ReasoningSplitter
from luce.server.tool_calls import (HERMES, QWEN_XML, ToolCallExtractor, forced_prefix, parse_block,
                                    template_format)
from tests.server.templates import QWEN25_TOOLS, QWEN35_TOOLS

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
    "city": {"type": "string"}, "days": {"type": "integer"}, "metric": {"type": "boolean"},
    "scale": {"type": "number"}, "tags": {"type": "array"}, "zip": {"type": "string"}}}}},
    {"type": "function", "function": {"name": "now", "parameters": {"type": "object", "properties": {}}}}]

HERMES_TWO = ('Let me check.\n\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n'
              '</tool_call>\n<tool_call>\n{"name": "now", "arguments": {}}\n</tool_call>')
XML_ONE = ("<tool_call>\n<function=get_weather>\n<parameter=city>\nNew York\n</parameter>\n<parameter=days>\n3\n"
           "</parameter>\n<parameter=metric>\ntrue\n</parameter>\n<parameter=scale>\n1.5\n</parameter>\n"
           "<parameter=tags>\n[\"a\", \"b\"]\n</parameter>\n<parameter=zip>\n02134\n</parameter>\n</function>\n"
           "</tool_call>")


def run(text: str, step: int, fmt=HERMES):
    ext = ToolCallExtractor(TOOLS, fmt)
    out = []
    for i in range(0, len(text), step):
        out += ext.push(text[i:i + step])
    out += ext.finish()
    content = "".join(v for k, v in out if k == "content")
    calls = [(v.name, json.loads(v.arguments)) for k, v in out if k == "tool_call"]
    return content, calls


@pytest.mark.parametrize("step", [1, 2, 5, 17, 10_000])
def test_hermes_calls_and_the_text_before_them(step):
    content, calls = run(HERMES_TWO, step)
    assert content == "Let me check."
    assert calls == [("get_weather", {"city": "Paris", "days": 2}), ("now", {})]


@pytest.mark.parametrize("step", [1, 3, 10_000])
def test_qwen_xml_call_values_follow_the_schema(step):
    content, calls = run(XML_ONE, step, QWEN_XML)
    assert content == ""
    assert calls == [("get_weather", {"city": "New York", "days": 3, "metric": True, "scale": 1.5,
                                      "tags": ["a", "b"], "zip": "02134"})]


def test_xml_multiline_string_value_and_a_bare_function_block():
    text = "<function=get_weather>\n<parameter=city>\nline one\nline two\n</parameter>\n</function>"
    assert run(text, 4, QWEN_XML) == ("", [("get_weather", {"city": "line one\nline two"})])


def test_a_block_that_is_no_call_stays_text():
    text = "see <tool_call>not json</tool_call> ok"
    assert run(text, 3) == ("see <tool_call>not json</tool_call> ok", [])


def test_an_unclosed_block_at_the_end_is_parsed_or_kept_as_text():
    assert run('<tool_call>\n{"name": "now", "arguments": {}}', 2) == ("", [("now", {})])
    assert run('<tool_call>\n{"name": "now", "argu', 2) == ('<tool_call>\n{"name": "now", "argu', [])


def test_plain_text_and_a_partial_tag_at_the_end_pass_through_unchanged():
    assert run("a < b and <tool", 1) == ("a < b and <tool", [])
    assert run("trailing space \n", 1) == ("trailing space \n", [])


def test_arguments_given_as_a_json_string_or_parameters_key():
    assert parse_block('{"name": "f", "arguments": "{\\"x\\": 1}"}', {}) == [("f", {"x": 1})]
    assert parse_block('{"name": "f", "parameters": {"x": 1}}', {}) == [("f", {"x": 1})]
    assert parse_block('{"name": "", "arguments": {}}', {}) is None
    assert parse_block('{"name": "f", "arguments": [1]}', {}) is None


def test_formats_are_read_from_the_template_and_forced_prefixes_start_a_call():
    assert template_format(QWEN25_TOOLS) == HERMES and template_format(QWEN35_TOOLS) == QWEN_XML
    assert template_format("{{ messages }}") is None
    assert forced_prefix(HERMES, "now") == '<tool_call>\n{"name": "now", "arguments": '
    assert forced_prefix(QWEN_XML, "now") == "<tool_call>\n<function=now>\n"
    prefix = forced_prefix(HERMES, "now")
    assert run(prefix + '{}}\n</tool_call>', 1) == ("", [("now", {})])


def split(text: str, step: int, in_reasoning=False):
    s = ReasoningSplitter(in_reasoning)
    out = []
    for i in range(0, len(text), step):
        out += s.push(text[i:i + step])
    out += s.finish()
    return "".join(t for k, t in out if k == "reasoning"), "".join(t for k, t in out if k == "content")


@pytest.mark.parametrize("step", [1, 2, 7, 1000])
def test_think_block_opened_by_the_model(step):
    assert split("<think>\nweigh it\n</think>\n\nThe answer.", step) == ("\nweigh it\n", "The answer.")


@pytest.mark.parametrize("step", [1, 4, 1000])
def test_think_block_opened_by_the_prompt(step):
    assert split("weigh it</think>\n\nDone", step, in_reasoning=True) == ("weigh it", "Done")
    assert split("still thinking", step, in_reasoning=True) == ("still thinking", "")


def test_think_tags_later_in_the_text_are_content():
    assert split("Hello <think>x</think>", 1) == ("", "Hello <think>x</think>")
    assert split("<thin", 1) == ("", "<thin")


def test_tool_calls_inside_reasoning_are_not_parsed():
    out = AssistantOutput(reasoning=True, tools=TOOLS, fmt=HERMES)
    text = ('<think>maybe <tool_call>{"name": "now", "arguments": {}}</tool_call></think>'
            '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>')
    deltas = [d for i in range(0, len(text), 3) for d in out.push(text[i:i + 3])] + out.finish()
    assert "".join(d.text for d in deltas if d.kind == "reasoning") == \
        'maybe <tool_call>{"name": "now", "arguments": {}}</tool_call>'
    assert [(c.name, c.input) for c in out.calls] == [("get_weather", {"city": "Oslo"})]
    assert out.content == ""


def test_reasoning_off_keeps_the_tags_in_the_content():
    out = AssistantOutput(reasoning=False)
    deltas = out.push("<think>x</think>y") + out.finish()
    assert "".join(d.text for d in deltas) == "<think>x</think>y" and out.reasoning == ""
