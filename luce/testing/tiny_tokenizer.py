"""A small byte-level BPE tokenizer in GGUF form (`tokenizer.ggml.*` keys, Qwen2 style).

Vocabulary, in id order: the 256 byte symbols of GPT-2's byte-to-unicode map (printable
bytes first, as GPT-2 and Qwen order them), then the tokens of BPE merges learned from the
built-in corpus below (deterministic: most frequent pair, ties to the smallest pair), then
the special tokens. Pre-tokenization follows llama.cpp's `qwen2` pre-tokenizer regex, so
every merge can fire on text split the way the runtime splits it.
"""
from __future__ import annotations

import functools
from collections import Counter

from tokenizers import Regex
from tokenizers.pre_tokenizers import Split

# The original Qwen2 tokenizer.json split pattern (llama.cpp LLAMA_VOCAB_PRE_TYPE_QWEN2).
QWEN2_PRETOKENIZER_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# <|mask|> is the DFlash draft's mask token (Qwen3.5's vocabulary reserves one too).
TINY_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|mask|>")
TOKEN_TYPE_NORMAL = 1
TOKEN_TYPE_CONTROL = 3
DEFAULT_N_MERGES = 160

CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if loop.first and message['role'] != 'system' %}"
    "{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

CORPUS = '''\
The quick brown fox jumps over the lazy dog. The dog was not amused, and the fox ran
into the forest where the other animals were waiting for the evening to begin.
In the beginning there was only the sea, and the sea was quiet. Then the wind came and
the waves started to move, one after another, towards the shore of the island.
She said that the weather would be better tomorrow, but nobody believed her. They stayed
inside, reading books and talking about the things they would do when the rain stopped.
It is important to write tests for the code that you write, because the tests tell you
when something that used to work has stopped working. Good tests are fast and clear.
Speculative decoding lets a small draft model propose several tokens, and the target
model verifies all of them in a single forward pass. Accepted tokens are kept; the first
rejected token is replaced by the target's own choice, so the output does not change.

def fibonacci(n):
    """Return the n-th Fibonacci number."""
    if n <= 1:
        return n
    return fibonacci(n - 1) + fibonacci(n - 2)


def fib(n):
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a


class Counter:
    def __init__(self, start=0):
        self.value = start

    def increment(self, step=1):
        self.value += step
        return self.value


for i in range(10):
    print(f"value {i}: {fib(i)}")

import numpy as np
x = np.zeros((4, 8), dtype=np.float32)
y = x.reshape(-1) + 1.0
result = {"name": "luce", "version": 1, "tokens": [1, 2, 3], "ok": True}
if result["ok"] and len(result["tokens"]) > 0:
    print("the result is ready")
'''

_CHAT_SAMPLE = "<|im_start|>user\nHello, how are you?<|im_end|>\n<|im_start|>assistant\nI am fine.<|im_end|>\n"


@functools.lru_cache(maxsize=1)
def byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map, in vocabulary order: bytes that
    are printable Latin-1 map to themselves, the other 68 to U+0100 onwards in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    table = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def _pretokenize(text: str) -> list[str]:
    """Split like the qwen2 pre-tokenizer, each piece mapped to byte-level symbols."""
    table = byte_to_unicode()
    splitter = Split(Regex(QWEN2_PRETOKENIZER_PATTERN), behavior="isolated")
    return ["".join(table[b] for b in piece.encode("utf-8"))
            for piece, _ in splitter.pre_tokenize_str(text)]


def _merge_word(word: tuple[str, ...], pair: tuple[str, str]) -> tuple[str, ...]:
    out: list[str] = []
    i = 0
    while i < len(word):
        if i + 1 < len(word) and (word[i], word[i + 1]) == pair:
            out.append(word[i] + word[i + 1])
            i += 2
        else:
            out.append(word[i])
            i += 1
    return tuple(out)


@functools.lru_cache(maxsize=4)
def learn_merges(n_merges: int = DEFAULT_N_MERGES, corpus: str = CORPUS) -> tuple[tuple[str, str], ...]:
    """Byte-level BPE training: repeatedly merge the most frequent adjacent pair (ties to the
    lexicographically smallest pair) inside pre-tokens; stops early when no pair repeats."""
    words = Counter(tuple(piece) for piece in _pretokenize(corpus + "\n" + _CHAT_SAMPLE))
    merges: list[tuple[str, str]] = []
    for _ in range(n_merges):
        pairs: Counter = Counter()
        for word, freq in words.items():
            for pair in zip(word, word[1:]):
                pairs[pair] += freq
        if not pairs:
            break
        best = min(pairs, key=lambda p: (-pairs[p], p))
        if pairs[best] < 2:
            break
        merges.append(best)
        words = Counter({_merge_word(w, best): f for w, f in words.items()})
    return tuple(merges)


def tiny_tokenizer_metadata(extra_specials: tuple[str, ...] = (),
                            n_merges: int = DEFAULT_N_MERGES) -> dict[str, object]:
    """The `tokenizer.*` GGUF keys of the tiny tokenizer (ready for `write_model`).

    Specials (`TINY_SPECIALS` then `extra_specials`) come last with token type CONTROL;
    bos = padding = <|endoftext|>, eos = <|im_end|> (as in Qwen2.5-Instruct GGUFs).
    """
    table = byte_to_unicode()
    tokens = [table[b] for b in sorted(table, key=lambda b: (table[b] != chr(b), b))]
    known = set(tokens)
    merges = learn_merges(n_merges)
    for a, b in merges:
        if a + b not in known:
            tokens.append(a + b)
            known.add(a + b)
    n_normal = len(tokens)
    specials = list(TINY_SPECIALS) + [s for s in extra_specials if s not in TINY_SPECIALS]
    duplicate = [s for s in specials if s in known]
    if duplicate or len(set(specials)) != len(specials):
        raise ValueError(f"special tokens {duplicate or specials} collide with other tokens")
    tokens += specials
    ids = {t: i for i, t in enumerate(tokens)}
    return {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "qwen2",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": [TOKEN_TYPE_NORMAL] * n_normal + [TOKEN_TYPE_CONTROL] * len(specials),
        "tokenizer.ggml.merges": [f"{a} {b}" for a, b in merges],
        "tokenizer.ggml.bos_token_id": ids["<|endoftext|>"],
        "tokenizer.ggml.eos_token_id": ids["<|im_end|>"],
        "tokenizer.ggml.padding_token_id": ids["<|endoftext|>"],
        "tokenizer.ggml.add_bos_token": False,
        "tokenizer.chat_template": CHAT_TEMPLATE,
    }


def tiny_vocab_size(extra_specials: tuple[str, ...] = ()) -> int:
    return len(tiny_tokenizer_metadata(extra_specials)["tokenizer.ggml.tokens"])
