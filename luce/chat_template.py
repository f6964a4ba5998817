"""Render a GGUF `tokenizer.chat_template` the way Hugging Face transformers does.

Templates come from model files, so they are untrusted code: they run in jinja2's
ImmutableSandboxedEnvironment with trim_blocks/lstrip_blocks, the `loopcontrols` extension,
a `{% generation %}` block (rendered as its body), and the helpers transformers provides:
`raise_exception(msg)`, `strftime_now(fmt)`, a `tojson` filter that keeps non-ASCII text
(ensure_ascii=False) and escapes no HTML. Any template problem becomes a ValueError.
"""
from __future__ import annotations

import json
import numbers
from datetime import datetime
from functools import lru_cache

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.utils
from jinja2.sandbox import ImmutableSandboxedEnvironment


class ChatTemplateError(ValueError):
    """The chat template failed to compile or to render."""


class _GenerationBlock(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` marks assistant text for training masks in
    transformers; rendering only needs its body."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller):
        return caller()


class _Namespace(jinja2.utils.Namespace):
    """jinja2 namespace() that refuses underscore attributes (no path to Python internals)."""

    def __init__(*args, **kwargs):  # noqa: N805 - same trick as jinja2's Namespace signature
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _Namespace._check(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name, value):
        _Namespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name):
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"namespace attribute {name!r} starts with '_'")


def _raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _strftime_now(fmt):
    return datetime.now().strftime(fmt)


@lru_cache(maxsize=8)
def compile_chat_template(source: str) -> jinja2.Template:
    """Compile once per distinct template text (cached)."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[_GenerationBlock, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["namespace"] = _Namespace
    try:
        return env.from_string(source)
    except jinja2.TemplateSyntaxError as e:
        raise ChatTemplateError(f"chat template syntax error at line {e.lineno}: {e.message}") from e


def _plain(value, where: str):
    """A copy of `value` made of JSON types only, so the template sees no foreign objects."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    # subclasses (enums, numpy scalars) could expose methods the sandbox does not know
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, dict):
        return {str(k): _plain(v, f"{where}[{k!r}]") for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v, f"{where}[{n}]") for n, v in enumerate(value)]
    raise TypeError(f"{where} is a {type(value).__name__}; chat template inputs must be JSON-like "
                    "(dict, list, str, int, float, bool, None)")


def render_chat_template(source: str, messages: list[dict], add_generation_prompt: bool = True,
                         tools: list[dict] | None = None, documents: list[dict] | None = None,
                         **variables) -> str:
    """Render `source` for `messages` (each a dict with at least 'role'). Keys whose value is
    None are dropped from messages (as transformers does). `variables` (bos_token, eos_token,
    enable_thinking, ...) are passed to the template as globals."""
    if not isinstance(messages, (list, tuple)):
        raise TypeError(f"messages must be a list of dicts, got {type(messages).__name__}")
    chat = []
    for n, message in enumerate(messages):
        if not isinstance(message, dict):
            raise TypeError(f"messages[{n}] is a {type(message).__name__}, expected a dict")
        chat.append(_plain({k: v for k, v in message.items() if v is not None}, f"messages[{n}]"))
    if tools is not None and not all(isinstance(t, dict) for t in tools):
        raise TypeError("tools must be JSON schemas (dicts)")
    template = compile_chat_template(source)
    context = {k: _plain(v, k) for k, v in variables.items()}
    try:
        return template.render(messages=chat, tools=_plain(tools, "tools"),
                               documents=_plain(documents, "documents"),
                               add_generation_prompt=add_generation_prompt, **context)
    except jinja2.TemplateError as e:
        raise ChatTemplateError(f"chat template error: {e.message or type(e).__name__}") from e
    except (TypeError, ValueError, AttributeError, KeyError, IndexError, ZeroDivisionError) as e:
        raise ChatTemplateError(f"chat template failed while rendering: {type(e).__name__}: {e}") from e
