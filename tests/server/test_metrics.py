"""/metrics parses with the Prometheus text parser and its numbers match what was served."""
from __future__ import annotations

import math

import pytest

from luce.server.metrics import Counter, Gauge, Histogram
from tests.server import rawhttp
from tests.server.conftest import fake_server, openai_client, tiny_tokenizer, wait_until

parser = pytest.importorskip("prometheus_client.parser")


def scrape(url) -> dict:
    resp = rawhttp.call(url, "GET", "/metrics")
    assert resp.status == 200 and resp.headers["content-type"].startswith("text/plain; version=0.0.4")
    return {f.name: f for f in parser.text_string_to_metric_families(resp.body.decode())}


def sample(families, family, suffix="", **labels) -> float:
    for s in families[family].samples:
        if s.name == family + suffix and all(s.labels.get(k) == v for k, v in labels.items()):
            return s.value
    raise KeyError((family, suffix, labels))


def test_metrics_parse_and_count_what_was_served():
    with fake_server(max_slots=3) as s:
        client = openai_client(s)
        tok = tiny_tokenizer()
        usages = []
        for i in range(3):
            r = client.chat.completions.create(model="m", messages=[{"role": "user", "content": f"q{i}"}],
                                               max_tokens=5 + i)
            usages.append(r.usage)
        chunks = list(client.completions.create(model="m", prompt="abc", max_tokens=4, stream=True))
        assert rawhttp.call(s.url, "POST", "/v1/completions", {"prompt": 5}).status == 400
        # the engine gauges come from the snapshot taken after each step: let the last one land
        assert wait_until(lambda: s.app.bridge.stats().slots_busy == 0)
        fams = scrape(s.url)

        assert sample(fams, "luce_http_requests", "_total", endpoint="/v1/chat/completions", status="200") == 3
        assert sample(fams, "luce_http_requests", "_total", endpoint="/v1/completions", status="200") == 1
        assert sample(fams, "luce_http_requests", "_total", endpoint="/v1/completions", status="400") == 1
        n_prompt = sum(u.prompt_tokens for u in usages) + len(tok.encode("abc"))
        assert sample(fams, "luce_prompt_tokens", "_total") == n_prompt
        assert sample(fams, "luce_generation_tokens", "_total") == 5 + 6 + 7 + 4
        assert sample(fams, "luce_request_finished", "_total", reason="length") == 4
        assert sample(fams, "luce_time_to_first_token_seconds", "_count") == 4
        # every token after the first of each request is one inter-token observation
        assert sample(fams, "luce_inter_token_latency_seconds", "_count") == (5 + 6 + 7 + 4) - 4
        assert sample(fams, "luce_inter_token_latency_seconds", "_bucket", le="+Inf") == 18
        assert sample(fams, "luce_request_duration_seconds", "_count") == 4
        for name in ("luce_slots_busy", "luce_queue_depth", "luce_kv_pages_used", "luce_requests_in_flight"):
            assert sample(fams, name) == 0
        assert sample(fams, "luce_slots_total") == 3
        assert sample(fams, "luce_kv_pages_free") == 512
        assert sample(fams, "luce_spec_acceptance_length") == 1.0
        assert sample(fams, "luce_engine_steps", "_total") >= 7
        assert fams["luce_time_to_first_token_seconds"].type == "histogram"
        assert fams["luce_slots_busy"].type == "gauge"
        assert len(chunks) >= 4


def test_metric_primitives_render_valid_exposition():
    c = Counter("x_total", "a counter", ("status",))
    c.inc(status='we"ird\\va\nlue')
    g = Gauge("y", "a gauge")
    g.set(math.nan)
    h = Histogram("z_seconds", "a histogram", (0.1, 1.0))
    for v in (0.05, 0.5, 5.0):
        h.observe(v)
    text = "\n".join(c.render() + g.render() + h.render()) + "\n"
    fams = {f.name: f for f in parser.text_string_to_metric_families(text)}
    assert fams["x"].samples[0].labels["status"] == 'we"ird\\va\nlue'
    assert math.isnan(fams["y"].samples[0].value)
    buckets = [(float(s.labels["le"]), s.value) for s in fams["z_seconds"].samples if s.name.endswith("_bucket")]
    assert buckets == [(0.1, 1), (1.0, 2), (math.inf, 3)]
    assert sample(fams, "z_seconds", "_sum") == pytest.approx(5.55)
    with pytest.raises(ValueError):
        c.inc(-1, status="x")
    with pytest.raises(ValueError):
        c.inc(other="x")
