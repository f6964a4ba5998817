#!/usr/bin/env python3
"""Regenerate tests/fixtures/qwen2_tokenizer_expected.json from transformers (the oracle).

The fixture lets tests/test_tokenizer.py and tests/test_chat_template.py check luce's
tokenizer against the real Qwen2.5-Coder vocabulary without transformers installed.
It stores, for every string of tests/fixtures/tokenizer_corpus.txt, the ids transformers
produces (special tokens parsed, and split as text), plus the chat template rendered by
transformers for a few conversations.

Usage (needs `pip install transformers`; no torch):
    python3 tools/make_tokenizer_fixture.py [path/to/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf]
Without a path, the file is looked up in $LUCE_MODELS, then ~/.cache/luce/models.
Nothing from luce is used to produce the expected values.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "tests" / "fixtures" / "tokenizer_corpus.txt"
FIXTURE = ROOT / "tests" / "fixtures" / "qwen2_tokenizer_expected.json"
DEFAULT_MODEL = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city (°C).",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}

# (messages, add_generation_prompt, tools)
CONVERSATIONS = [
    ([{"role": "user", "content": "Write a quicksort in Python."}], True, None),
    ([{"role": "user", "content": "Write a quicksort in Python."}], False, None),
    ([{"role": "system", "content": "You are terse."},
      {"role": "user", "content": "2+2?"},
      {"role": "assistant", "content": "4"},
      {"role": "user", "content": "和 😀?"}], True, None),
    ([{"role": "system", "content": "You are terse."},
      {"role": "user", "content": "2+2?"},
      {"role": "assistant", "content": "4"}], False, None),
    ([{"role": "user", "content": "Weather in Paris?"}], True, [WEATHER_TOOL]),
    ([{"role": "user", "content": "Weather in Paris?"},
      {"role": "assistant", "content": "",
       "tool_calls": [{"type": "function", "function": {"name": "get_weather",
                                                         "arguments": {"city": "Paris"}}}]},
      {"role": "tool", "content": "{\"temp_c\": 21}"}], True, [WEATHER_TOOL]),
]


def read_corpus(path: Path = CORPUS) -> list[str]:
    lines = path.read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip() and not line.startswith("#")]


def find_model(name: str = DEFAULT_MODEL) -> Path | None:
    for folder in (os.environ.get("LUCE_MODELS"), Path.home() / ".cache" / "luce" / "models"):
        if folder and (Path(folder) / name).is_file():
            return Path(folder) / name
    return None


def main(argv: list[str]) -> int:
    path = Path(argv[1]) if len(argv) > 1 else find_model()
    if path is None or not path.is_file():
        print(f"model file not found (looked for {DEFAULT_MODEL} in $LUCE_MODELS and "
              "~/.cache/luce/models); pass its path", file=sys.stderr)
        return 1
    import transformers
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    cases = [{"text": s,
              "ids": hf.encode(s, add_special_tokens=False),
              "ids_split_special": hf(s, add_special_tokens=False, split_special_tokens=True)["input_ids"]}
             for s in read_corpus()]
    chats = []
    for messages, gen, tools in CONVERSATIONS:
        text = hf.apply_chat_template(messages, tools=tools, add_generation_prompt=gen, tokenize=False)
        chats.append({"messages": messages, "add_generation_prompt": gen, "tools": tools, "text": text})
    meta = {"generated_by": "tools/make_tokenizer_fixture.py",
            "oracle": f"transformers {transformers.__version__} AutoTokenizer.from_pretrained(gguf_file=...)",
            "model_file": path.name, "model_bytes": path.stat().st_size}
    # one case per line keeps the fixture diffable
    rows = lambda items: ",\n".join(json.dumps(x, ensure_ascii=False) for x in items)  # noqa: E731
    FIXTURE.write_text(f'{{"meta": {json.dumps(meta)},\n"cases": [\n{rows(cases)}\n],\n'
                       f'"chat": [\n{rows(chats)}\n]}}\n', encoding="utf-8")
    json.loads(FIXTURE.read_text(encoding="utf-8"))  # well-formed
    print(f"wrote {FIXTURE.relative_to(ROOT)}: {len(cases)} strings, {len(chats)} conversations")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
