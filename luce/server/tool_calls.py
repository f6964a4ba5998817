"""The model's tool-call text -> OpenAI tool calls, incrementally (streaming and not).

Two formats, both inside `<tool_call>...</tool_call>`, told apart by the block's content:
- Hermes (Qwen2.5, Qwen3): `<tool_call>\\n{"name": "f", "arguments": {...}}\\n</tool_call>`
- Qwen3-Coder / Qwen3.5 XML: `<tool_call>\\n<function=f>\\n<parameter=x>\\nvalue\\n</parameter>\\n
  </function>\\n</tool_call>`; a bare `<function=f>...</function>` is read too. Parameter values are
  text; they become JSON values by the tool's schema (integer, number, boolean, object, array,
  null), strings otherwise.

`ToolCallExtractor.push(text)` returns what is certain now: ("content", text) and
("tool_call", ToolCall) items. Text that could be the start of a tag is held back; a block is
parsed when it closes (or at the end, if the model stopped inside it). A block that does not
parse stays text. Whitespace before a call is not content.
"""
from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass

HERMES, QWEN_XML = "hermes", "qwen3_xml"
OPEN, CLOSE = "<tool_call>", "</tool_call>"
BARE_OPEN, BARE_CLOSE = "<function=", "</function>"

_FUNCTION = re.compile(r"<function=([^>\n]+)>(.*?)(?:</function>|\Z)", re.S)
_PARAMETER = re.compile(r"<parameter=([^>\n]+)>(.*?)(?:</parameter>|(?=<parameter=)|\Z)", re.S)


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str          # a JSON object as text (OpenAI's `function.arguments`)

    @property
    def input(self) -> dict:
        return json.loads(self.arguments)


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


def template_format(chat_template: str | None) -> str | None:
    """The tool-call format a chat template teaches the model, or None if it shows none."""
    if not chat_template:
        return None
    if "<function=" in chat_template:
        return QWEN_XML
    if "<tool_call>" in chat_template:
        return HERMES
    return None


def forced_prefix(fmt: str, name: str | None) -> str:
    """Text that starts a call (of `name`, if given): appended to the prompt for
    tool_choice 'required' or a named function (prompting; grammar-forced decoding comes later)."""
    if fmt == QWEN_XML:
        return f"{OPEN}\n{BARE_OPEN}{name}>\n" if name else f"{OPEN}\n{BARE_OPEN}"
    return f'{OPEN}\n{{"name": "{name}", "arguments": ' if name else f"{OPEN}\n"


# ---------------------------------------------------------------------------- one block

def _schema_types(tools_by_name: dict, function: str, parameter: str) -> set[str]:
    schema = (tools_by_name.get(function) or {}).get("parameters") or {}
    prop = (schema.get("properties") or {}).get(parameter) or {}
    kinds = prop.get("type", "string")
    kinds = set(kinds) if isinstance(kinds, list) else {kinds}
    for alt in prop.get("anyOf") or prop.get("oneOf") or ():
        if isinstance(alt, dict) and isinstance(alt.get("type"), str):
            kinds.add(alt["type"])
    return {k for k in kinds if isinstance(k, str)}


def _xml_value(text: str, kinds: set[str]):
    if text.startswith("\n"):
        text = text[1:]
    if text.endswith("\n"):
        text = text[:-1]
    stripped = text.strip()
    if "null" in kinds and stripped == "null":
        return None
    if "string" in kinds or not kinds:
        return text
    if kinds & {"integer", "number"}:
        try:
            return int(stripped) if "integer" in kinds and re.fullmatch(r"-?\d+", stripped) else float(stripped)
        except ValueError:
            pass
    if "boolean" in kinds and stripped.lower() in ("true", "false"):
        return stripped.lower() == "true"
    if kinds & {"object", "array"}:
        try:
            return json.loads(stripped)
        except ValueError:
            pass
    return text


def parse_block(block: str, tools_by_name: dict) -> list[tuple[str, dict]] | None:
    """(name, arguments) of each call in the text between the tags, or None if it is no call."""
    body = block.strip()
    if body.startswith(BARE_OPEN):
        calls = []
        for fmatch in _FUNCTION.finditer(body):
            name = fmatch.group(1).strip()
            args = {}
            for pmatch in _PARAMETER.finditer(fmatch.group(2)):
                key = pmatch.group(1).strip()
                args[key] = _xml_value(pmatch.group(2), _schema_types(tools_by_name, name, key))
            calls.append((name, args))
        return calls or None
    try:
        obj = json.loads(body)
    except ValueError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except ValueError:
            return None
    if not isinstance(args, dict):
        return None
    return [(obj["name"], args)]


# ---------------------------------------------------------------------------- streaming

def partial_suffix(text: str, tags: tuple[str, ...]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of one of `tags`."""
    best = 0
    for tag in tags:
        for k in range(min(len(tag) - 1, len(text)), best, -1):
            if text.endswith(tag[:k]):
                best = k
                break
    return best


class ToolCallExtractor:
    def __init__(self, tools: list[dict], fmt: str | None = HERMES):
        self.tools_by_name = {t["function"]["name"]: t["function"] for t in tools if "function" in t}
        self.pairs = ((OPEN, CLOSE), (BARE_OPEN, BARE_CLOSE)) if fmt == QWEN_XML else ((OPEN, CLOSE),)
        self.calls: list[ToolCall] = []
        self._text = ""              # not yet classified
        self._close: str | None = None   # inside a block: the tag that ends it
        self._space = ""             # whitespace held until text follows it

    @property
    def inside_call(self) -> bool:
        return self._close is not None

    def push(self, text: str) -> list[tuple[str, object]]:
        self._text += text
        out: list[tuple[str, object]] = []
        while self._text:
            if self._close is not None:
                end = self._text.find(self._close)
                if end < 0:
                    break
                stop = end + len(self._close)
                block, self._text = self._text[:stop], self._text[stop:]
                self._end_block(block[:end], block, out)
                continue
            starts = [(i, o, c) for o, c in self.pairs if (i := self._text.find(o)) >= 0]
            if starts:
                i, opened, close = min(starts)
                self._content(self._text[:i], out)
                self._text = self._text[i + (len(opened) if opened == OPEN else 0):]
                self._close = close
                continue
            keep = partial_suffix(self._text, tuple(o for o, _ in self.pairs))
            self._content(self._text[:len(self._text) - keep], out)
            self._text = self._text[len(self._text) - keep:]
            break
        return out

    def finish(self) -> list[tuple[str, object]]:
        """The end of the output: an unclosed block is parsed as it is; held text is released."""
        out: list[tuple[str, object]] = []
        if self._close is not None:
            self._end_block(self._text, self._text, out)
        else:
            self._content(self._text, out)
        self._text = ""
        if self._space and not self.calls:
            out.append(("content", self._space))
        self._space = ""
        return out

    def _content(self, text: str, out: list) -> None:
        """Emit text, holding its trailing whitespace: whitespace before a call is not content."""
        body = text.rstrip()
        if body:
            out.append(("content", self._space + body))
            self._space = ""
        self._space += text[len(body):]

    def _end_block(self, block: str, raw: str, out: list) -> None:
        """`block`: between the tags (a bare <function=...> keeps its own tags); `raw`: as sent."""
        bare = self._close == BARE_CLOSE
        self._close = None
        parsed = parse_block(block + BARE_CLOSE if bare else block, self.tools_by_name)
        if parsed is None:
            self._content((OPEN if not bare else "") + raw, out)
            return
        self._space = ""
        for name, args in parsed:
            call = ToolCall(new_call_id(), name, json.dumps(args, ensure_ascii=False))
            self.calls.append(call)
            out.append(("tool_call", call))
