"""Structured output for the server: `response_format` and forced tool calls as grammars
(luce.engine.constraint.Grammar), and `logit_bias`, each checked with a 400 naming the field.

- response_format {"type": "json_object"}: any JSON object; {"type": "json_schema",
  "json_schema": {"name", "schema", "strict"}}: JSON matching the schema (strict or not, the
  grammar enforces it: llguidance's JSON-schema subset, an unsupported keyword is a 400).
- tool_choice 'required' or a named function: the prompt ends with the start of a call
  (luce.server.tool_calls.forced_prefix) and the rest of the call is a Lark grammar whose
  arguments are the tool's JSON schema (Hermes), or its parameters (Qwen3 XML: string values
  are text without '<', others JSON by their schema); then the end of the turn.
"""
from __future__ import annotations

import json
import zlib

from luce.engine.constraint import JSON_OPTIONS, Grammar, GrammarError
from luce.server.errors import bad_request
from luce.server.tool_calls import CLOSE, HERMES, OPEN
from luce.server.validation import type_name

FORMATS = ("text", "json_object", "json_schema")


def checked(grammar: Grammar, param: str) -> Grammar:
    """The grammar, or a 400 naming `param` when llguidance cannot compile it."""
    from llguidance import LLMatcher

    try:
        error = LLMatcher.validate_grammar(grammar.llguidance_grammar())
    except (GrammarError, ValueError) as e:
        raise bad_request(f"cannot be used as a grammar: {e}", param=param) from None
    if error:
        raise bad_request(f"cannot be used as a grammar: {error.splitlines()[0][:300]}", param=param)
    return grammar


def response_format_grammar(value, param: str = "response_format") -> Grammar | None:
    """OpenAI's response_format -> a Grammar (None for text or absent)."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise bad_request(f"must be an object, got {type_name(value)}", param=param)
    kind = value.get("type")
    if kind not in FORMATS:
        raise bad_request(f"type must be one of {', '.join(FORMATS)}, got {str(kind)[:40]!r}", param=f"{param}.type")
    if kind == "text":
        return None
    if kind == "json_object":
        return Grammar("json_object")
    spec = value.get("json_schema")
    if not isinstance(spec, dict):
        raise bad_request("must be an object with name and schema", param=f"{param}.json_schema")
    schema = spec.get("schema", {"type": "object"})
    if not isinstance(schema, dict):
        raise bad_request(f"must be a JSON schema object, got {type_name(schema)}", param=f"{param}.json_schema.schema")
    return checked(Grammar.json_schema(schema), f"{param}.json_schema.schema")


def _lark_string(text: str) -> str:
    return json.dumps(text)


def _json_rule(schema: dict | None) -> str:
    schema = schema if isinstance(schema, dict) and schema else {"type": "object"}
    return "%json " + json.dumps({"x-guidance": JSON_OPTIONS, **schema})


def _hermes_call(name: str) -> str:
    opening = '{"name": ' + json.dumps(name) + ', "arguments": '
    return f'{_lark_string(opening)} args_{_rule_id(name)} {_lark_string("}" + chr(10) + CLOSE)}'


def _rule_id(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name).lower() + f"_{zlib.crc32(name.encode())}"


def _xml_params(name: str, schema) -> str:
    props = (schema or {}).get("properties") or {}
    required = set((schema or {}).get("required") or ())
    parts = []
    for key, prop in props.items():
        kinds = prop.get("type") if isinstance(prop, dict) else None
        value = "/[^<]*/" if kinds == "string" or kinds is None else _json_rule(prop)
        piece = f'({_lark_string(f"<parameter={key}>" + chr(10))} {value} {_lark_string(chr(10) + "</parameter>" + chr(10))})'
        parts.append(piece if key in required else piece + "?")
    return " ".join(parts) or '""'


def forced_call_grammar(fmt: str, tools: list[dict], name: str | None, parallel: bool) -> Grammar:
    """What follows forced_prefix(fmt, name): the rest of one call (named), or one or more
    calls of any of the tools (required; one when parallel is false)."""
    by_name = {t["function"]["name"]: t["function"].get("parameters") for t in tools}
    names = [name] if name else list(by_name)
    rules = []
    if fmt == HERMES:
        for n in names:
            rules.append(f"args_{_rule_id(n)}: {_json_rule(by_name[n])}")
        if name:
            start = f'start: args_{_rule_id(name)} {_lark_string("}" + chr(10) + CLOSE)}'
        else:
            rules.append("call: " + " | ".join(_hermes_call(n) for n in names))
            more = f' ("\\n{OPEN}\\n" call)*' if parallel else ""
            start = f"start: call{more}"
    else:
        tail = _lark_string("</function>\n" + CLOSE)
        if name:
            start = f"start: {_xml_params(name, by_name[name])} {tail}"
        else:
            rules.append("call: " + " | ".join(f'({_lark_string(n + ">" + chr(10))} {_xml_params(n, by_name[n])} {tail})'
                                               for n in names))
            more = f' ("\\n" {_lark_string(OPEN + chr(10) + "<function=")} call)*' if parallel else ""
            start = f"start: call{more}"
    return checked(Grammar("lark", "\n".join([start, *rules])), "tools")


def parse_logit_bias(value, vocab_size: int | None, param: str = "logit_bias") -> dict | None:
    """OpenAI's {"token id": bias in [-100, 100]} -> {int: float}."""
    if value is None or value == {}:
        return None
    if not isinstance(value, dict):
        raise bad_request(f"must be an object mapping token ids to biases, got {type_name(value)}", param=param)
    if len(value) > 1024:
        raise bad_request(f"at most 1024 entries, got {len(value)}", param=param)
    out = {}
    for key, bias in value.items():
        try:
            token = int(key)
        except (TypeError, ValueError):
            raise bad_request(f"key {str(key)[:20]!r} is not a token id", param=param) from None
        if token < 0 or (vocab_size is not None and token >= vocab_size):
            raise bad_request(f"token id {token} is outside the vocabulary (0..{(vocab_size or 1) - 1})", param=param)
        if isinstance(bias, bool) or not isinstance(bias, (int, float)) or not -100 <= bias <= 100:
            raise bad_request(f"bias for token {token} must be a number in [-100, 100], got {bias!r}", param=param)
        out[token] = float(bias)
    return out
