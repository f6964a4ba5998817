"""Grammar-constrained decoding: a request's grammar as a token mask over the target's logits.

The grammar engine is llguidance (PyPI, a Rust core with no run-time dependencies: JSON
schema, Lark, regex; chosen over xgrammar, whose wheel requires torch, and outlines-core,
which has no general JSON object grammar). One `LLTokenizer` is built per (tokenizer,
vocab) and reused; each request gets its own matcher.

The mask is applied on the host to the logits row before the engine sampler draws
(luce.engine.sampler.sample_token): a constrained request's step brings its logits to the
host (luce.engine.outcome). Speculation: the target's token at every tree node the
acceptance walk reaches is drawn from the masked row with the grammar advanced along that
node's path (`Walk`), so a drafted token the grammar forbids never equals the target's
token and is never accepted; the walk is rolled back afterwards (acceptance stays pure) and
the request advances its matcher only by the tokens it commits (`advance`).
"""
from __future__ import annotations

import functools
import json
from dataclasses import dataclass

import numpy as np

KINDS = ("json_schema", "json_object", "lark", "regex")
# JSON as json.dumps writes it ("a": 1, "b": 2) and no free whitespace, so a model cannot
# spend its tokens on blanks; a schema's own "x-guidance" options override these.
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


class GrammarError(ValueError):
    """The grammar cannot be compiled; the message says why (the server answers 400)."""


@dataclass(frozen=True)
class Grammar:
    """What a request's output must match: kind (KINDS) and its source text (a JSON schema
    as JSON text, a Lark grammar or a regex; empty for json_object)."""
    kind: str
    source: str = ""

    def __post_init__(self):
        if self.kind not in KINDS:
            raise GrammarError(f"grammar kind {self.kind!r}: choose one of {', '.join(KINDS)}")

    @classmethod
    def json_schema(cls, schema: dict | str) -> "Grammar":
        return cls("json_schema", schema if isinstance(schema, str) else json.dumps(schema, sort_keys=True))

    def llguidance_grammar(self) -> str:
        from llguidance import LLMatcher

        if self.kind == "json_object":
            return LLMatcher.grammar_from_json_schema({"type": "object"}, defaults=JSON_OPTIONS)
        if self.kind == "json_schema":
            try:
                return LLMatcher.grammar_from_json_schema(self.source, defaults=JSON_OPTIONS)
            except ValueError as e:
                raise GrammarError(f"not a JSON schema: {e}") from None
        if self.kind == "lark":
            return LLMatcher.grammar_from_lark(self.source)
        return LLMatcher.grammar_from_regex(self.source)


class _Vocab:
    """luce.tokenizer.Tokenizer in llguidance's TokenizerWrapper shape: each token's bytes,
    special tokens marked with a leading 0xFF, padded with empty tokens to the model's vocab."""

    def __init__(self, tokenizer, vocab: int):
        self.tokenizer = tokenizer
        self.eos_token_id = tokenizer.eos_id
        self.bos_token_id = tokenizer.bos_id
        self.tokens = [b"\xff" + tokenizer.token_bytes(i) if tokenizer.is_special(i) else tokenizer.token_bytes(i)
                       for i in range(tokenizer.vocab_size)] + [b""] * max(vocab - tokenizer.vocab_size, 0)
        self.special_token_ids = [i for i in range(tokenizer.vocab_size) if tokenizer.is_special(i)]

    def __call__(self, text):
        text = text.decode("utf-8", errors="replace") if isinstance(text, bytes) else text
        return self.tokenizer.encode(text, parse_special=False)


@functools.lru_cache(maxsize=4)
def ll_tokenizer(tokenizer, vocab: int):
    """The llguidance tokenizer for a luce Tokenizer and model vocab (built once: about a
    second at a 150K vocabulary). End of generation: every end-of-generation token."""
    import llguidance

    eos = sorted(tokenizer.eot_ids) or [tokenizer.eos_id]
    return llguidance.LLTokenizer(llguidance.TokenizerWrapper(_Vocab(tokenizer, vocab)), eos_token=eos)


class TokenConstraint:
    """One request's grammar state. mask() -> allowed [V] bool for the next token;
    advance(tokens) commits tokens. Not thread-safe (the engine thread owns it)."""

    def __init__(self, grammar: Grammar, tokenizer, vocab: int):
        import llguidance

        if tokenizer is None:
            raise GrammarError("a grammar needs the model's tokenizer: build the engine with one")
        self.grammar = grammar
        self.vocab = vocab
        self.tokenizer = ll_tokenizer(tokenizer, vocab)
        self.matcher = llguidance.LLMatcher(self.tokenizer, grammar.llguidance_grammar(), log_level=0)
        if self.matcher.is_error():
            raise GrammarError(f"the {grammar.kind} grammar does not compile: {self.matcher.get_error()}")
        self._words = (vocab + 31) // 32
        self._bits = np.empty(self._words, dtype=np.int32)
        self._eos = np.asarray(self.tokenizer.eos_tokens, dtype=np.int64)

    def mask(self) -> np.ndarray:
        """allowed [V] bool for the next token in the current state (end-of-generation tokens
        exactly when the grammar is complete)."""
        if self.matcher.is_error():
            raise RuntimeError(f"the grammar matcher failed: {self.matcher.get_error()}")
        self.matcher.unsafe_compute_mask_ptr(self._bits.ctypes.data, self._bits.nbytes)
        allowed = np.unpackbits(self._bits.view(np.uint8), bitorder="little")[:self.vocab].view(bool)
        if allowed[self._eos].any():           # llguidance marks one of them: allow all
            allowed[self._eos] = True
        return allowed

    def apply(self, logits: np.ndarray) -> np.ndarray:
        """logits [V] -> a copy with the tokens the grammar forbids at -inf."""
        return np.where(self.mask(), logits, np.float32(-np.inf)).astype(np.float32, copy=False)

    def advance(self, tokens) -> None:
        """Commit tokens the engine emitted (each one the mask allowed)."""
        for t in tokens:
            if self.matcher.is_stopped():
                return                          # the end-of-generation token that finishes it
            if not self.matcher.consume_token(int(t)):
                raise RuntimeError(f"token {int(t)} breaks the grammar: {self.matcher.get_error()}")

    @property
    def complete(self) -> bool:
        return self.matcher.is_accepting()


class Walk:
    """The grammar along one acceptance walk: `at(emitted)` is the constraint after the
    committed tokens and `emitted`; on exit every token consumed is rolled back.

        with Walk(constraint) as walk:
            accept(tree, lambda node, emitted: draw(..., walk.at(emitted)))
    """

    def __init__(self, constraint: TokenConstraint | None):
        self.constraint = constraint
        self.seen = 0          # emitted tokens walked over
        self.consumed = 0      # of them, those the matcher took (none after it stopped)

    def __enter__(self) -> "Walk":
        return self

    def at(self, emitted) -> TokenConstraint | None:
        c = self.constraint
        if c is None:
            return None
        if len(emitted) < self.seen:
            raise RuntimeError("an acceptance walk went back along its path")
        for t in list(emitted)[self.seen:]:
            self.seen += 1
            if c.matcher.is_stopped():
                continue
            if not c.matcher.consume_token(int(t)):
                raise RuntimeError(f"token {int(t)} breaks the grammar: {c.matcher.get_error()}")
            self.consumed += 1
        return c

    def __exit__(self, *exc) -> None:
        if self.constraint is not None and self.consumed:
            self._rollback()

    def _rollback(self) -> None:
        m = self.constraint.matcher
        if not m.rollback(self.consumed):
            raise RuntimeError(f"the grammar matcher could not roll back: {m.get_error()}")
        self.seen = self.consumed = 0
