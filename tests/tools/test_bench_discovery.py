"""tools/bench.py finds every BENCH_CASES entry without a GPU: each case is a named callable
and names are unique (the table and the JSON key on them)."""
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
import bench  # noqa: E402


def test_every_bench_module_contributes_named_cases():
    cases = bench.discover(None)
    names = [name for name, _ in cases]
    assert len(names) == len(set(names)), "duplicate bench case names"
    modules = {p.stem for p in (ROOT / "tests" / "kernels").glob("bench_*.py")}
    for family in ("rmsnorm", "gated_rmsnorm", "rotary", "swiglu", "conv1d", "sampling", "gather"):
        assert f"bench_{family}" in modules
    assert all(callable(c) and not name.startswith(("functools.partial", "<")) for name, c in cases)
    assert any(n.startswith("rmsnorm_hidden") for n in names)


def test_filter_selects_by_name_or_module():
    assert {n for n, _ in bench.discover("swiglu")} == {"swiglu_1x17408", "swiglu_64x17408", "swiglu_4096x17408",
                                                        "swiglu_quant_1x8960", "swiglu_quant_1x17408",
                                                        "swiglu_quant_64x8960", "swiglu_quant_64x17408"}
    assert {n for n, _ in bench.discover("swiglu_64x17408$")} == {"swiglu_64x17408"}
    assert all("argmax" in n or "logprobs" in n for n, _ in bench.discover("bench_sampling"))
