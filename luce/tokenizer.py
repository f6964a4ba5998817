"""Byte-level BPE tokenizer built from a GGUF file's `tokenizer.*` metadata.

Follows llama.cpp's semantics for `tokenizer.ggml.model = "gpt2"` vocabularies:
- text is first cut at special tokens, longest text first; CONTROL tokens are only matched
  when `parse_special=True`, USER_DEFINED tokens are always matched whole (as llama.cpp and
  the `tokenizers` library's non-special added tokens do);
- each remaining fragment is split by the pre-tokenizer regex named by `tokenizer.ggml.pre`,
  mapped to the GPT-2 byte alphabet and merged by BPE rank (`tokenizers` does this part);
- no Unicode normalization (llama.cpp applies none; the original Hugging Face Qwen
  `tokenizer.json` applies NFC, so decomposed accents can tokenize differently there).
"""
from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path
from typing import Iterable, Sequence

from tokenizers import Regex
from tokenizers import Tokenizer as _HFTokenizer
from tokenizers import models, pre_tokenizers

# tokenizer.ggml.token_type values (llama.cpp's llama_token_type)
TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED, TOKEN_BYTE = 1, 2, 3, 4, 5, 6

# Split regexes per `tokenizer.ggml.pre`, as llama.cpp spells them (the case-insensitive
# contractions of the original tokenizer.json are expanded into explicit classes).
_QWEN2_SPLIT = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
    r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN35_SPLIT = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
    r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
PRE_TOKENIZER_SPLITS = {"qwen2": _QWEN2_SPLIT, "qwen35": _QWEN35_SPLIT}

# Token texts llama.cpp treats as end of generation whatever the metadata says.
_EOG_TEXTS = frozenset({
    "<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end|>", "<|eom_id|>", "<end_of_turn>",
    "<|end_of_text|>", "<EOT>", "</s>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>",
})
_EOG_ID_KEYS = ("eos_token_id", "eot_token_id", "eom_token_id",
                "fim_pad_token_id", "fim_rep_token_id", "fim_sep_token_id")


@lru_cache(maxsize=1)
def byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from each byte to a printable character (byte-level BPE alphabet):
    printable Latin-1 bytes map to themselves, the other 68 to U+0100 onwards in byte order."""
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    mapping = {b: chr(b) for b in kept}
    shifted = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + shifted)
            shifted += 1
    return mapping


@lru_cache(maxsize=1)
def _unicode_to_latin1_table() -> dict[int, str]:
    """str.translate table: byte-alphabet character -> chr(byte); other Latin-1 characters ->
    U+FFFF so that encoding the result as latin-1 fails and the slow path handles them."""
    table = {ord(ch): chr(b) for b, ch in byte_to_unicode().items()}
    for cp in range(256):
        table.setdefault(cp, "\uffff")
    return table


def byte_level_text_to_bytes(token: str) -> bytes:
    """Raw bytes of a token written in the byte-level alphabet. A character outside that
    alphabet (a malformed vocabulary) contributes its own UTF-8 bytes."""
    try:
        return token.translate(_unicode_to_latin1_table()).encode("latin-1")
    except UnicodeEncodeError:
        inverse = {ch: b for b, ch in byte_to_unicode().items()}
        return b"".join(bytes([inverse[ch]]) if ch in inverse else ch.encode("utf-8") for ch in token)


def _meta_get(meta: dict, key: str, default=None):
    value = meta.get(f"tokenizer.ggml.{key}", default)
    return default if value is None else value


class Tokenizer:
    """Encode/decode for one GGUF vocabulary. Immutable after construction; thread-safe."""

    def __init__(self, tokens: Sequence[str], token_types: Sequence[int], merges: Sequence[str],
                 pre: str, *, bos_id: int | None, eos_id: int, pad_id: int | None = None,
                 adds_bos: bool = False, chat_template: str | None = None,
                 extra_eog_ids: Iterable[int] = ()):
        if pre not in PRE_TOKENIZER_SPLITS:
            raise ValueError(
                f"unsupported tokenizer.ggml.pre {pre!r}: luce supports {sorted(PRE_TOKENIZER_SPLITS)}; "
                "add its split regex (llama.cpp src/llama-vocab.cpp) to PRE_TOKENIZER_SPLITS")
        if len(token_types) != len(tokens):
            raise ValueError(f"tokenizer.ggml.token_type has {len(token_types)} entries for "
                             f"{len(tokens)} tokens: the GGUF metadata is inconsistent")
        self.tokens: tuple[str, ...] = tuple(tokens)
        self.token_types: tuple[int, ...] = tuple(int(t) for t in token_types)
        self.pre = pre
        self.vocab_size = len(self.tokens)
        for name, value in (("bos", bos_id), ("eos", eos_id), ("padding", pad_id)):
            if value is not None and not 0 <= value < self.vocab_size:
                raise ValueError(f"tokenizer.ggml.{name}_token_id = {value} is outside the "
                                 f"vocabulary (size {self.vocab_size})")
        self.bos_id = bos_id
        self.eos_id = eos_id
        self.pad_id = pad_id
        self.adds_bos = adds_bos
        self.chat_template = chat_template
        self._bpe = self._build_bpe(merges)
        self._special_id = self._special_token_ids()
        eog = {i for t, i in self._special_id.items() if t in _EOG_TEXTS}
        eog.update(i for i in extra_eog_ids if 0 <= i < self.vocab_size)
        eog.add(eos_id)
        self.eot_ids: frozenset[int] = frozenset(eog)
        # llama.cpp treats end-of-generation tokens as CONTROL whatever the file marks them
        self._control_ids = frozenset(
            i for i, t in enumerate(self.token_types) if t == TOKEN_CONTROL) | self.eot_ids
        self._split_all = self._special_regex(self._special_id)
        self._split_user = self._special_regex({
            t: i for t, i in self._special_id.items()
            if self.token_types[i] == TOKEN_USER_DEFINED and i not in self._control_ids})
        self._bytes = [self._compute_token_bytes(i) for i in range(self.vocab_size)]

    # ---- construction -------------------------------------------------------------------

    @classmethod
    def from_metadata(cls, meta: dict) -> "Tokenizer":
        """Build from the GGUF `tokenizer.*` key/values (python values; arrays as sequences)."""
        model = _meta_get(meta, "model")
        if model != "gpt2":
            raise ValueError(f"tokenizer.ggml.model is {model!r}: luce only supports byte-level BPE ('gpt2')")
        for key in ("tokens", "token_type", "merges", "pre", "eos_token_id"):
            if f"tokenizer.ggml.{key}" not in meta:
                raise ValueError(f"GGUF metadata lacks tokenizer.ggml.{key}: cannot build the tokenizer")
        bos = _meta_get(meta, "bos_token_id")
        pad = _meta_get(meta, "padding_token_id")
        return cls(
            list(meta["tokenizer.ggml.tokens"]), list(meta["tokenizer.ggml.token_type"]),
            list(meta["tokenizer.ggml.merges"]), str(meta["tokenizer.ggml.pre"]),
            bos_id=None if bos is None else int(bos), eos_id=int(meta["tokenizer.ggml.eos_token_id"]),
            pad_id=None if pad is None else int(pad),
            adds_bos=bool(_meta_get(meta, "add_bos_token", False)),
            chat_template=meta.get("tokenizer.chat_template"),
            extra_eog_ids=[int(_meta_get(meta, k)) for k in _EOG_ID_KEYS if _meta_get(meta, k) is not None],
        )

    @classmethod
    def from_gguf(cls, path) -> "Tokenizer":
        return cls.from_metadata(read_tokenizer_metadata(path))

    def _build_bpe(self, merges: Sequence[str]) -> _HFTokenizer:
        vocab: dict[str, int] = {}
        for i, (text, kind) in enumerate(zip(self.tokens, self.token_types)):
            if kind not in (TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED, TOKEN_UNKNOWN):
                vocab.setdefault(text, i)
        missing = [b for b, ch in byte_to_unicode().items() if ch not in vocab]
        if missing:
            raise ValueError(f"the vocabulary has no token for {len(missing)} of the 256 bytes "
                             f"(first: {missing[:8]}): a byte-level BPE needs all of them")
        pairs = []
        for n, merge in enumerate(merges):
            left, sep, right = merge.partition(" ")
            if not sep or not left or not right or " " in right:
                raise ValueError(f"tokenizer.ggml.merges[{n}] = {merge!r} is not 'left right'")
            pairs.append((left, right))
        try:
            bpe = models.BPE(vocab=vocab, merges=pairs, dropout=None, unk_token=None,
                             fuse_unk=False, byte_fallback=False, ignore_merges=False)
        except Exception as e:  # tokenizers raises its own exception type for bad merges
            raise ValueError(f"cannot build BPE from the GGUF vocabulary and merges: {e}") from e
        hf = _HFTokenizer(bpe)
        hf.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(PRE_TOKENIZER_SPLITS[self.pre]), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
        return hf

    def _special_token_ids(self) -> dict[str, int]:
        """Text -> id of every token matched whole in text (CONTROL, USER_DEFINED, UNKNOWN);
        the lowest id wins when two share a text."""
        out: dict[str, int] = {}
        for i, (text, kind) in enumerate(zip(self.tokens, self.token_types)):
            if kind in (TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNKNOWN) and text:
                out.setdefault(text, i)
        return out

    @staticmethod
    def _special_regex(texts: dict[str, int]) -> re.Pattern | None:
        if not texts:
            return None
        ordered = sorted(texts, key=len, reverse=True)  # longest first, as llama.cpp
        return re.compile("(" + "|".join(re.escape(t) for t in ordered) + ")")

    def _compute_token_bytes(self, i: int) -> bytes:
        kind, text = self.token_types[i], self.tokens[i]
        if kind in (TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNKNOWN):
            return text.encode("utf-8")
        if kind == TOKEN_UNUSED:
            return b""  # padding entries like "[PAD151700]" have no text (llama.cpp renders nothing)
        return byte_level_text_to_bytes(text)

    # ---- public API ------------------------------------------------------------------------

    def encode(self, text: str, add_bos: bool = False, parse_special: bool = True) -> list[int]:
        """Token ids of `text`. `parse_special=False` encodes CONTROL token texts (like
        `<|im_start|>`) as plain text; USER_DEFINED tokens are matched whole either way."""
        if not isinstance(text, str):
            raise TypeError(f"encode expects str, got {type(text).__name__}")
        ids: list[int] = []
        if add_bos:
            if self.bos_id is None:
                raise ValueError("add_bos=True but the GGUF metadata has no tokenizer.ggml.bos_token_id")
            ids.append(self.bos_id)
        splitter = self._split_all if parse_special else self._split_user
        pieces = splitter.split(text) if splitter is not None else [text]
        # re.split with one capture group alternates: text, special, text, special, ..., text
        plain = [p for p in pieces[0::2] if p]
        encoded = iter(self._bpe.encode_batch(plain, add_special_tokens=False) if plain else [])
        for n, piece in enumerate(pieces):
            if n % 2:
                ids.append(self._special_id[piece])
            elif piece:
                ids.extend(next(encoded).ids)
        return ids

    def token_bytes(self, id: int) -> bytes:
        """Raw bytes of one token (CONTROL/USER_DEFINED tokens: their text as UTF-8)."""
        if not 0 <= id < self.vocab_size:
            raise ValueError(f"token id {id} is outside the vocabulary (size {self.vocab_size})")
        return self._bytes[id]

    def is_special(self, id: int) -> bool:
        """True for CONTROL tokens (and end-of-generation tokens): what decode(skip_special) drops."""
        return id in self._control_ids

    def decode_bytes(self, ids: Iterable[int], skip_special: bool = False) -> bytes:
        out = bytearray()
        for i in ids:
            i = int(i)
            if skip_special and i in self._control_ids:
                continue
            out += self.token_bytes(i)
        return bytes(out)

    def decode(self, ids: Iterable[int], skip_special: bool = False) -> str:
        """Text of `ids`; invalid UTF-8 (a character cut by the ids' ends) becomes U+FFFD."""
        return self.decode_bytes(ids, skip_special).decode("utf-8", errors="replace")

    def token_id(self, text: str) -> int | None:
        """Id of the special token spelled `text` (e.g. "<|im_end|>"), or None."""
        return self._special_id.get(text)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True,
                            tools: list[dict] | None = None, **kw) -> str:
        """Render `messages` with the GGUF `tokenizer.chat_template` (Hugging Face semantics)."""
        from luce.chat_template import render_chat_template

        if not self.chat_template:
            raise ValueError("this GGUF has no tokenizer.chat_template: format the prompt yourself")
        specials = {}
        for name, tid in (("bos_token", self.bos_id), ("eos_token", self.eos_id), ("pad_token", self.pad_id)):
            if tid is not None:
                specials[name] = self.tokens[tid]
        return render_chat_template(self.chat_template, messages, add_generation_prompt=add_generation_prompt,
                                    tools=tools, **{**specials, **kw})

    def __repr__(self) -> str:
        return (f"Tokenizer(pre={self.pre!r}, vocab_size={self.vocab_size}, bos_id={self.bos_id}, "
                f"eos_id={self.eos_id}, eot_ids={sorted(self.eot_ids)})")


def read_tokenizer_metadata(path) -> dict:
    """The `tokenizer.*` key/values of a GGUF file as python values."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"GGUF file not found: {path}")
    try:
        from luce.gguf.reader import GGUFModel
    except ImportError:  # the luce reader is optional here; gguf's reader is slower but complete
        GGUFModel = None
    if GGUFModel is not None and hasattr(GGUFModel, "tokenizer_metadata"):
        with GGUFModel(path, check_tensors=False) as model:
            return dict(model.tokenizer_metadata())
    from gguf import GGUFReader

    reader = GGUFReader(str(path), "r")
    return {name: field.contents() for name, field in reader.fields.items() if name.startswith("tokenizer.")}
