"""The prefix cache seen from the API (tiny models, the real engine behind the server): a
repeated chat reports the prompt tokens it took from the cache in
usage.prompt_tokens_details.cached_tokens, as OpenAI does, gives the offline API's text, and
/metrics counts the cached tokens and the cache's bytes."""
from __future__ import annotations

import re

from tests.server import rawhttp
from tests.server.test_engine_e2e import client, msgs, reference_text, served  # noqa: F401 - the fixture

HISTORY = "the quick brown fox jumps over the lazy dog " * 4


def metric(text: str, name: str) -> float:
    found = re.search(rf"^{name} (\S+)$", text, re.M)
    assert found, f"{name} missing from /metrics"
    return float(found.group(1))


def test_repeated_chat_reports_cached_tokens_and_metrics(served):  # noqa: F811 - the fixture
    messages = msgs(HISTORY + "what jumps?")
    before = metric(rawhttp.call(served.url, "GET", "/metrics").body.decode(), "luce_prefix_cache_prompt_tokens_total")
    first = client(served).chat.completions.create(model="m", messages=messages, max_tokens=6, temperature=0)
    again = client(served).chat.completions.create(model="m", messages=messages, max_tokens=6, temperature=0)
    text, _, _ = reference_text(served, messages, max_tokens=6, temperature=0.0)
    assert first.choices[0].message.content == again.choices[0].message.content == text
    cached = again.usage.prompt_tokens_details.cached_tokens
    assert first.usage.prompt_tokens > 64 and cached > first.usage.prompt_tokens_details.cached_tokens
    assert first.usage.prompt_tokens - 64 <= cached < first.usage.prompt_tokens   # up to a snapshot (64) or a page
    fams = rawhttp.call(served.url, "GET", "/metrics").body.decode()
    assert metric(fams, "luce_prefix_cache_prompt_tokens_total") >= before + cached
    assert metric(fams, "luce_prefix_cache_bytes") > 0
    assert 'luce_prefix_cache_evictions_total{kind="page"}' in fams
