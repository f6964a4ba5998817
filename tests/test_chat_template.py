"""luce.chat_template: Hugging Face-compatible, sandboxed chat template rendering.

Expected strings are written by hand from jinja2/transformers semantics; where transformers
is installed its own renderer is the oracle, and the real Qwen2.5-Coder template is checked
against the renders stored by tools/make_tokenizer_fixture.py.
"""
from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import pytest

from luce.chat_template import ChatTemplateError, render_chat_template
from luce.model_paths import DEFAULT_DRAFT, model_path
from luce.tokenizer import Tokenizer

EXPECTED_FILE = Path(__file__).parent / "fixtures" / "qwen2_tokenizer_expected.json"

CHATML = (
    "{% for message in messages %}\n"
    "    {% if loop.first and message.role != 'system' %}\n"
    "<|im_start|>system\nDefault.<|im_end|>\n"
    "    {% endif %}\n"
    "<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n"
    "{% endfor %}\n"
    "{% if add_generation_prompt %}\n"
    "<|im_start|>assistant\n"
    "{% endif %}\n"
)

CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Bonjour, ça va? 你好 😀"},
    {"role": "assistant", "content": "Oui."},
    {"role": "user", "content": "<b>&</b>"},
]


def test_trim_and_lstrip_blocks():
    # block tags on their own (indented) lines leave neither indentation nor newline behind
    out = render_chat_template(CHATML, [{"role": "user", "content": "hi"}], add_generation_prompt=True)
    assert out == ("<|im_start|>system\nDefault.<|im_end|>\n"
                   "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    out = render_chat_template(CHATML, CONVERSATION[:3], add_generation_prompt=False)
    assert out == ("<|im_start|>system\nBe brief.<|im_end|>\n"
                   "<|im_start|>user\nBonjour, ça va? 你好 😀<|im_end|>\n"
                   "<|im_start|>assistant\nOui.<|im_end|>\n")


def test_tojson_keeps_unicode_and_html():
    tpl = "{{ tools | tojson }}|{{ tools[0] | tojson(indent=2) }}"
    tools = [{"name": "météo", "desc": "<a & b>"}]
    out = render_chat_template(tpl, [], tools=tools)
    assert out == ('[{"name": "météo", "desc": "<a & b>"}]|'
                   '{\n  "name": "météo",\n  "desc": "<a & b>"\n}')


def test_raise_exception_becomes_value_error():
    tpl = "{% if messages[0].role != 'user' %}{{ raise_exception('first message must be user') }}{% endif %}"
    with pytest.raises(ValueError, match="first message must be user"):
        render_chat_template(tpl, [{"role": "assistant", "content": "x"}])
    assert render_chat_template(tpl, [{"role": "user", "content": "x"}]) == ""


def test_syntax_error_names_the_line():
    with pytest.raises(ChatTemplateError, match=r"syntax error at line 2"):
        render_chat_template("ok\n{% for m in messages %}never closed", [])


def test_runtime_type_error_is_value_error():
    with pytest.raises(ValueError, match="chat template"):
        render_chat_template("{{ messages[0].content + 1 }}", [{"role": "user", "content": "x"}])


def test_strftime_now():
    before = datetime.now().strftime("%d %b %Y")
    out = render_chat_template("{{ strftime_now('%d %b %Y') }}", [])
    assert out in {before, datetime.now().strftime("%d %b %Y")}


def test_special_token_variables_and_extra_kwargs():
    tpl = "{{ bos_token }}|{{ eos_token }}|{{ enable_thinking }}"
    assert render_chat_template(tpl, [], bos_token="<s>", eos_token="</s>", enable_thinking=False) \
        == "<s>|</s>|False"


def test_none_valued_keys_are_dropped():
    tpl = "{% for m in messages %}{{ 'content' in m }},{{ m.tool_calls is defined }};{% endfor %}"
    msgs = [{"role": "assistant", "content": None, "tool_calls": None}, {"role": "user", "content": "x"}]
    assert render_chat_template(tpl, msgs) == "False,False;True,False;"


def test_namespace_loopcontrols_and_generation_block():
    tpl = ("{% set ns = namespace(n=0) %}{% for m in messages %}{% if loop.index > 2 %}{% break %}{% endif %}"
           "{% set ns.n = ns.n + 1 %}{% generation %}[{{ m.content }}]{% endgeneration %}{% endfor %}{{ ns.n }}")
    assert render_chat_template(tpl, CONVERSATION) == "[Be brief.][Bonjour, ça va? 你好 😀]2"


@pytest.mark.parametrize("tpl", [
    "{{ ''.__class__.__mro__ }}",
    "{{ messages.__class__.__subclasses__() }}",
    "{% set x = messages.append(1) %}",
    "{% set ns = namespace(_hidden=1) %}",
    "{{ messages[0].update({'role': 'x'}) }}",
])
def test_sandbox_blocks_escapes_and_mutation(tpl):
    with pytest.raises(ValueError):
        render_chat_template(tpl, [{"role": "user", "content": "x"}])


def test_inputs_must_be_json_like():
    with pytest.raises(TypeError, match=r"messages\[0\]\['content'\]"):
        render_chat_template(CHATML, [{"role": "user", "content": object()}])
    with pytest.raises(TypeError, match="dict"):
        render_chat_template(CHATML, ["just a string"])


def test_tokenizer_apply_chat_template_passes_special_tokens():
    from tests.test_tokenizer import synthetic_meta

    meta = synthetic_meta()
    meta["tokenizer.chat_template"] = "{{ bos_token }}{{ messages[0].content }}{{ eos_token }}"
    tok = Tokenizer.from_metadata(meta)
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}]) == "<|endoftext|>hi<|im_end|>"
    del meta["tokenizer.chat_template"]
    with pytest.raises(ValueError, match="no tokenizer.chat_template"):
        Tokenizer.from_metadata(meta).apply_chat_template([{"role": "user", "content": "hi"}])


# ---- transformers as the oracle ----------------------------------------------------------------

def hf_render(template, messages, add_generation_prompt, tools=None, **kw):
    utils = pytest.importorskip("transformers.utils.chat_template_utils")
    rendered, _ = utils.render_jinja_template(conversations=[messages], chat_template=template, tools=tools,
                                              add_generation_prompt=add_generation_prompt, **kw)
    return rendered[0]


@pytest.mark.parametrize("gen", [True, False])
def test_matches_transformers_renderer(gen):
    tpl = CHATML + "{{ tools | tojson if tools else '' }}{{ bos_token }}"
    tools = [{"type": "function", "function": {"name": "f", "description": "°C <x>"}}]
    for msgs in (CONVERSATION, CONVERSATION[1:2], CONVERSATION[:3]):
        assert render_chat_template(tpl, msgs, add_generation_prompt=gen, tools=tools, bos_token="<s>") \
            == hf_render(tpl, msgs, gen, tools=tools, bos_token="<s>")


def test_tiny_template_matches_transformers():
    tiny = pytest.importorskip("luce.testing.tiny_tokenizer")
    meta = tiny.tiny_tokenizer_metadata()
    tok = Tokenizer.from_metadata(meta)
    for gen in (True, False):
        for msgs in (CONVERSATION, CONVERSATION[1:2]):
            assert tok.apply_chat_template(msgs, add_generation_prompt=gen) \
                == hf_render(meta["tokenizer.chat_template"], msgs, gen,
                             bos_token=tok.tokens[tok.bos_id] if tok.bos_id is not None else None,
                             eos_token=tok.tokens[tok.eos_id])


# ---- the real Qwen2.5-Coder template ----------------------------------------------------------

@pytest.fixture(scope="module")
def qwen() -> Tokenizer:
    path = model_path(DEFAULT_DRAFT)
    if not path.is_file():
        pytest.skip(f"{DEFAULT_DRAFT} not in the model cache ({path.parent}); run `make models`")
    return Tokenizer.from_gguf(path)


def test_real_template_matches_fixture(qwen):
    if not EXPECTED_FILE.is_file():
        pytest.skip("no fixture: run tools/make_tokenizer_fixture.py")
    chats = json.loads(EXPECTED_FILE.read_text(encoding="utf-8"))["chat"]
    assert len(chats) >= 4
    for chat in chats:
        got = qwen.apply_chat_template(chat["messages"], add_generation_prompt=chat["add_generation_prompt"],
                                       tools=chat["tools"])
        assert got == chat["text"], chat["messages"]


@pytest.mark.real
def test_real_template_matches_transformers_live(qwen):
    transformers = pytest.importorskip("transformers")
    path = model_path(DEFAULT_DRAFT)
    hf = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    for gen in (True, False):
        for msgs in (CONVERSATION, CONVERSATION[1:2], CONVERSATION[:3]):
            assert qwen.apply_chat_template(msgs, add_generation_prompt=gen) \
                == hf.apply_chat_template(msgs, add_generation_prompt=gen, tokenize=False)
