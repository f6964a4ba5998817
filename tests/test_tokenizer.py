"""luce.tokenizer and luce.detokenize.

Three sources of truth:
- a hand-built byte-level vocabulary whose expected ids follow from the pre-tokenizer rules
  (digits one by one, whitespace runs, contractions, special tokens), worked out by hand;
- the real Qwen2.5-Coder vocabulary (skipped when the GGUF files are absent) against the ids
  transformers produced (tests/fixtures/qwen2_tokenizer_expected.json, written by
  tools/make_tokenizer_fixture.py) and, when transformers is installed, against it live;
- the tiny test models' tokenizer (luce.testing.tiny_tokenizer) for round trips.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from luce.detokenize import StreamDecoder
from luce.model_paths import DEFAULT_DRAFT, DEFAULT_TARGET, model_path
from luce.tokenizer import (TOKEN_CONTROL, TOKEN_NORMAL, TOKEN_UNUSED, TOKEN_USER_DEFINED, Tokenizer,
                            byte_to_unicode)

FIXTURES = Path(__file__).parent / "fixtures"
CORPUS_FILE = FIXTURES / "tokenizer_corpus.txt"
EXPECTED_FILE = FIXTURES / "qwen2_tokenizer_expected.json"


def read_corpus() -> list[str]:
    lines = CORPUS_FILE.read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip() and not line.startswith("#")]


# ---- a hand-built vocabulary --------------------------------------------------------------

def gpt2_byte_alphabet() -> list[str]:
    """GPT-2's byte -> character table, written out independently of luce."""
    printable = set(range(0x21, 0x7F)) | set(range(0xA1, 0xAD)) | set(range(0xAE, 0x100))
    out, extra = [], 0
    for b in range(256):
        if b in printable:
            out.append(chr(b))
        else:
            out.append(chr(0x100 + extra))
            extra += 1
    return out


ALPHABET = gpt2_byte_alphabet()
SP, NL = ALPHABET[0x20], ALPHABET[0x0A]   # 'Ġ', 'Ċ'
MERGES = ["h e", "he l", "hel l", "hell o", f"{SP} w", f"{SP}w o", f"{SP}wo r", f"{SP}wor l",
          f"{SP}worl d", "1 2", f"{NL} {NL}", f"{SP} {SP}", "o ,", "' s",
          f"{ALPHABET[0xE4]} {ALPHABET[0xBD]}",   # first two bytes of '你' (e4 bd a0)
          f"{ALPHABET[0x95]} {ALPHABET[0xE0]}"]   # across "क|ा" (see the qwen35 test)
SPECIALS = [("<|endoftext|>", TOKEN_CONTROL), ("<|im_start|>", TOKEN_CONTROL),
            ("<|im_end|>", TOKEN_CONTROL), ("<tool_call>", TOKEN_USER_DEFINED),
            ("<tool_call>x", TOKEN_USER_DEFINED), ("[PAD300]", TOKEN_UNUSED)]


def synthetic_meta(pre: str = "qwen2") -> dict:
    tokens = list(ALPHABET)
    for m in MERGES:
        tokens.append(m.replace(" ", ""))
    types = [TOKEN_NORMAL] * len(tokens)
    for text, kind in SPECIALS:
        tokens.append(text)
        types.append(kind)
    return {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": pre, "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.token_type": types, "tokenizer.ggml.merges": list(MERGES),
            "tokenizer.ggml.bos_token_id": tokens.index("<|endoftext|>"),
            "tokenizer.ggml.eos_token_id": tokens.index("<|im_end|>"),
            "tokenizer.chat_template": "{% for m in messages %}<|im_start|>{{ m.role }}\n"
                                       "{{ m.content }}<|im_end|>\n{% endfor %}"}


@pytest.fixture(scope="module")
def syn() -> Tokenizer:
    return Tokenizer.from_metadata(synthetic_meta())


def ids_of(tok: Tokenizer, *pieces: str) -> list[int]:
    """Ids of byte-level token texts (or special texts)."""
    return [tok.tokens.index(p) for p in pieces]


def test_byte_alphabet_matches_gpt2():
    assert [byte_to_unicode()[b] for b in range(256)] == ALPHABET
    assert (SP, NL, ALPHABET[0]) == ("\u0120", "\u010a", "\u0100")


def test_merges_apply_within_pretokens_only(syn):
    assert syn.encode("hello") == ids_of(syn, "hello")
    # "o ," exists as a merge, but the regex puts "," in its own piece
    assert syn.encode("hello, world") == ids_of(syn, "hello", ",", f"{SP}world")


def test_digits_are_split_one_by_one(syn):
    assert syn.encode("12") == ids_of(syn, "1", "2")  # merge "1 2" must never apply


def test_whitespace_runs(syn):
    # "a  b" -> "a", " ", " b": the two spaces are in different pieces, so never "ĠĠ"
    assert syn.encode("a  b") == ids_of(syn, "a", SP, SP, "b")
    # trailing run of spaces stays one piece: merged
    assert syn.encode("a  ") == ids_of(syn, "a", SP + SP)
    # newlines gather into one piece (\s*[\r\n]+)
    assert syn.encode("x\n\ny") == ids_of(syn, "x", NL + NL, "y")


def test_contractions(syn):
    assert syn.encode("it's") == ids_of(syn, "i", "t", "'s")
    # uppercase contraction is its own piece too (no merge for it, so two byte tokens)
    assert syn.encode("IT'S") == ids_of(syn, "I", "T", "'", "S")


def test_multibyte_characters(syn):
    assert syn.encode("你") == ids_of(syn, ALPHABET[0xE4] + ALPHABET[0xBD], ALPHABET[0xA0])
    emoji = "😀".encode()
    assert syn.encode("😀") == ids_of(syn, *(ALPHABET[b] for b in emoji))


def test_special_tokens_parsed_atomically(syn):
    ids = syn.encode("<|im_start|>he<|im_end|>")
    assert ids == ids_of(syn, "<|im_start|>", "he", "<|im_end|>")


def test_control_tokens_as_text_when_parse_special_false(syn):
    ids = syn.encode("<|im_start|>he", parse_special=False)
    assert syn.token_id("<|im_start|>") not in ids
    assert ids[-1] == ids_of(syn, "he")[0]
    assert syn.decode(ids) == "<|im_start|>he"


def test_user_defined_tokens_always_atomic(syn):
    # llama.cpp semantics: USER_DEFINED tokens are matched whatever parse_special says
    for parse in (True, False):
        assert syn.encode("a<tool_call>b", parse_special=parse) == ids_of(syn, "a", "<tool_call>", "b")
    # longest special text wins
    assert syn.encode("<tool_call>x") == ids_of(syn, "<tool_call>x")


def test_unused_tokens_are_plain_text(syn):
    pad = syn.tokens.index("[PAD300]")
    ids = syn.encode("[PAD300]")
    assert pad not in ids and syn.decode(ids) == "[PAD300]"
    assert syn.token_bytes(pad) == b""


def test_ids_and_metadata(syn):
    assert syn.vocab_size == 256 + len(MERGES) + len(SPECIALS)
    assert syn.bos_id == syn.token_id("<|endoftext|>") and syn.eos_id == syn.token_id("<|im_end|>")
    assert syn.eot_ids == {syn.token_id("<|im_end|>"), syn.token_id("<|endoftext|>")}
    assert syn.encode("he", add_bos=True) == [syn.bos_id, *ids_of(syn, "he")]


def test_token_bytes_and_decode(syn):
    assert syn.token_bytes(ids_of(syn, f"{SP}world")[0]) == b" world"
    assert syn.token_bytes(syn.token_id("<|im_end|>")) == b"<|im_end|>"
    ids = syn.encode("<|im_start|>hello<tool_call><|im_end|>")
    assert syn.decode(ids) == "<|im_start|>hello<tool_call><|im_end|>"
    assert syn.decode(ids, skip_special=True) == "hello<tool_call>"
    assert syn.decode(syn.encode("😀")[:2]) == "\ufffd"  # a cut character is replaced
    with pytest.raises(ValueError, match="outside the vocabulary"):
        syn.token_bytes(syn.vocab_size)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(alphabet=st.characters(blacklist_categories=["Cs"]), max_size=40)
       | st.lists(st.sampled_from(["<|im_start|>", "<|im_end|>", "<tool_call>", "he", " ", "\n", "12",
                                   "你", "😀", "'s", "\t"]), max_size=12).map("".join))
def test_round_trip_any_text(syn, text):
    for parse in (True, False):
        ids = syn.encode(text, parse_special=parse)
        assert syn.decode(ids) == text
        assert syn.encode(syn.decode(ids), parse_special=parse) == ids


def test_unknown_pre_tokenizer_is_a_clear_error():
    with pytest.raises(ValueError, match=r"'llama-bpe'.*qwen2.*qwen35"):
        Tokenizer.from_metadata(synthetic_meta(pre="llama-bpe"))


def test_qwen35_pre_keeps_combining_marks_with_letters():
    # "का!" = क (e0 a4 95) + the vowel sign ा (e0 a4 be, category Mc) + "!".
    # qwen2 splits "क" | "ा!"; qwen35 keeps "का" | "!", so only qwen35 can apply the
    # merge of क's last byte with ा's first byte.
    text = "क\u093e!"
    bridge = ids_of(Tokenizer.from_metadata(synthetic_meta()), ALPHABET[0x95] + ALPHABET[0xE0])[0]
    t2 = Tokenizer.from_metadata(synthetic_meta("qwen2"))
    t35 = Tokenizer.from_metadata(synthetic_meta("qwen35"))
    assert bridge not in t2.encode(text)
    assert bridge in t35.encode(text)
    assert t2.decode(t2.encode(text)) == t35.decode(t35.encode(text)) == text


def test_metadata_errors():
    meta = synthetic_meta()
    with pytest.raises(ValueError, match="model"):
        Tokenizer.from_metadata({**meta, "tokenizer.ggml.model": "llama"})
    with pytest.raises(ValueError, match="merges"):
        Tokenizer.from_metadata({k: v for k, v in meta.items() if k != "tokenizer.ggml.merges"})
    short = {**meta, "tokenizer.ggml.tokens": meta["tokenizer.ggml.tokens"][1:],
             "tokenizer.ggml.token_type": meta["tokenizer.ggml.token_type"][1:]}
    with pytest.raises(ValueError, match="256 bytes"):
        Tokenizer.from_metadata(short)


# ---- streaming detokenization -----------------------------------------------------------

def test_stream_holds_partial_emoji(syn):
    ids = syn.encode("a😀b")
    assert len(ids) == 6  # a + four byte tokens + b
    sd = StreamDecoder(syn)
    assert [sd.push(i) for i in ids] == ["a", "", "", "", "😀", "b"]
    assert sd.flush() == ""


def test_stream_holds_partial_cjk(syn):
    ids = syn.encode("你你")
    sd = StreamDecoder(syn)
    out = [sd.push(i) for i in ids]
    assert out == ["", "你", "", "你"]


def test_stream_flush_replaces_unfinished_character(syn):
    sd = StreamDecoder(syn)
    assert sd.push_many(syn.encode("x😀")[:3]) == "x"
    assert sd.pending_bytes == "😀".encode()[:2]
    assert sd.flush() == "\ufffd"
    assert sd.push_many(syn.encode("ok")) == "ok"  # usable after flush


def test_stream_emits_invalid_byte_without_stalling(syn):
    sd = StreamDecoder(syn)
    assert sd.push(syn.tokens.index(ALPHABET[0xFF])) == "\ufffd"  # 0xff can never start UTF-8
    assert sd.push(ids_of(syn, "a")[0]) == "a"


def test_stream_skips_special_by_default(syn):
    ids = syn.encode("<|im_start|>he<|im_end|>")
    assert StreamDecoder(syn).push_many(ids) == "he"
    assert StreamDecoder(syn, skip_special=False).push_many(ids) == "<|im_start|>he<|im_end|>"


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_stream_equals_decode_for_any_ids(syn, data):
    ids = data.draw(st.lists(st.integers(0, syn.vocab_size - 1), max_size=30))
    skip = data.draw(st.booleans())
    sd = StreamDecoder(syn, skip_special=skip)
    pieces = [sd.push(i) for i in ids] + [sd.flush()]
    assert "".join(pieces) == syn.decode(ids, skip_special=skip)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(alphabet=st.characters(blacklist_categories=["Cs"]), max_size=30))
def test_stream_of_valid_text_never_emits_replacement(syn, text):
    sd = StreamDecoder(syn)
    pieces = [sd.push(i) for i in syn.encode(text, parse_special=False)]
    assert all("\ufffd" not in p or "\ufffd" in text for p in pieces)
    assert "".join(pieces) + sd.flush() == text


# ---- the real Qwen2.5-Coder vocabulary ------------------------------------------------------

def real_file(name: str) -> Path:
    path = model_path(name)
    if not path.is_file():
        pytest.skip(f"{name} not in the model cache ({path.parent}); run `make models`")
    return path


@pytest.fixture(scope="module")
def qwen() -> Tokenizer:
    return Tokenizer.from_gguf(real_file(DEFAULT_DRAFT))


@pytest.fixture(scope="module")
def expected() -> dict:
    if not EXPECTED_FILE.is_file():
        pytest.skip("no expected-ids fixture: run tools/make_tokenizer_fixture.py")
    return json.loads(EXPECTED_FILE.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def hf_tokenizer():
    transformers = pytest.importorskip("transformers")
    path = real_file(DEFAULT_DRAFT)
    return transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


def test_real_metadata(qwen):
    assert qwen.vocab_size == 151936
    assert (qwen.bos_id, qwen.eos_id, qwen.pre) == (151643, 151645, "qwen2")
    assert {151643, 151645} <= qwen.eot_ids
    assert qwen.token_id("<|im_start|>") == 151644


def test_fixture_covers_corpus(expected):
    corpus = read_corpus()
    assert len(corpus) >= 50
    assert [c["text"] for c in expected["cases"]] == corpus, "corpus changed: rerun the fixture tool"


def test_real_encode_matches_transformers_fixture(qwen, expected):
    mismatches = [c["text"] for c in expected["cases"] if qwen.encode(c["text"]) != c["ids"]]
    assert not mismatches, f"{len(mismatches)}/{len(expected['cases'])} differ: {mismatches[:5]}"
    split = [c["text"] for c in expected["cases"]
             if qwen.encode(c["text"], parse_special=False) != c["ids_split_special"]]
    assert not split, f"parse_special=False differs on {split[:5]}"


def test_real_round_trips(qwen):
    for text in read_corpus():
        ids = qwen.encode(text)
        assert qwen.decode(ids) == text
        assert qwen.encode(qwen.decode(ids)) == ids


def test_real_stream_decoder_matches_decode(qwen):
    for text in read_corpus():
        ids = qwen.encode(text)
        sd = StreamDecoder(qwen, skip_special=False)
        pieces = [sd.push(i) for i in ids]
        assert "".join(pieces) + sd.flush() == text
        assert all("\ufffd" not in p for p in pieces)


@pytest.mark.real
def test_real_encode_matches_transformers_live(qwen, hf_tokenizer):
    for text in read_corpus():
        assert qwen.encode(text) == hf_tokenizer.encode(text, add_special_tokens=False), text
        ids = qwen.encode(text)
        for skip in (False, True):
            want = hf_tokenizer.decode(ids, skip_special_tokens=skip, clean_up_tokenization_spaces=False)
            assert qwen.decode(ids, skip_special=skip) == want, (text, skip)


@pytest.mark.real
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(alphabet=st.characters(blacklist_categories=["Cs"]), max_size=60)
       | st.lists(st.sampled_from(["<|im_start|>", "<|im_end|>", "<tool_call>", "<|fim_prefix|>", "  ",
                                   "\n\n", "\t", "123", "'s", "你好", "😀", "def", " x", "é"]),
                  max_size=10).map("".join))
def test_real_random_text_matches_transformers(qwen, hf_tokenizer, text):
    assert qwen.encode(text) == hf_tokenizer.encode(text, add_special_tokens=False)


def test_real_target_and_draft_share_the_vocabulary(qwen):
    target = Tokenizer.from_gguf(real_file(DEFAULT_TARGET))
    assert target.tokens == qwen.tokens and target.token_types == qwen.token_types
    text = read_corpus()[-3]
    assert target.encode(text) == qwen.encode(text)


# ---- the tiny test models' tokenizer --------------------------------------------------------

@pytest.fixture(scope="module")
def tiny() -> Tokenizer:
    module = pytest.importorskip("luce.testing.tiny_tokenizer")
    return Tokenizer.from_metadata(module.tiny_tokenizer_metadata())


def test_tiny_round_trips(tiny):
    for text in read_corpus():
        ids = tiny.encode(text)
        assert all(0 <= i < tiny.vocab_size for i in ids)
        assert tiny.decode(ids) == text
        assert tiny.encode(tiny.decode(ids)) == ids
        sd = StreamDecoder(tiny, skip_special=False)
        assert sd.push_many(ids) + sd.flush() == text


def test_tiny_special_tokens(tiny):
    specials = [t for t, k in zip(tiny.tokens, tiny.token_types) if k == TOKEN_CONTROL]
    assert tiny.eos_id in tiny.eot_ids
    for text in specials:
        assert tiny.encode(text) == [tiny.token_id(text)]
