"""Terminal tables and the JSON file for runs (run.run_benchmark) and brackets (bracket.bracket)."""
from __future__ import annotations

import json
import math
import os


def _num(value, digits: int = 1, scale: float = 1.0) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return f"{value * scale:,.{digits}f}"


def _ms(value) -> str:
    return _num(value, 1, 1000.0)


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    line = lambda cells: "  ".join(str(c).rjust(w) if i else str(c).ljust(w)  # noqa: E731
                                   for i, (c, w) in enumerate(zip(cells, widths)))
    return [line(header), line(["-" * w for w in widths])] + [line(r) for r in rows]


def format_run(result: dict) -> str:
    """A run as text: the concurrency table, the staggered round, the output digest."""
    out = []
    outputs = result["outputs"]
    endpoint = result["endpoint"]
    out.append(f"run {result['label']}: {endpoint['base_url']} ({endpoint['api']}), "
               f"{result['config']['max_tokens']} tokens per wave request, "
               f"{result['config']['waves']} waves per C")
    out.append(f"  outputs: set sha256 {outputs['set_digest'][:16]}  ({len(outputs['outputs'])} keys, "
               f"{len(outputs['inconsistent_keys'])} inconsistent, {outputs['incomplete']} incomplete)")
    if outputs["inconsistent_keys"]:
        out.append("  WARNING: outputs changed with concurrency for " + ", ".join(outputs["inconsistent_keys"][:5]))
    rows = []
    for level in result.get("levels") or ():
        rows.append([str(level["concurrency"]), _num(level["output_tok_s"]),
                     _ms(level["ttft_s"]["p50"]), _ms(level["ttft_s"]["p90"]),
                     _ms(level["tbt_s"]["p50"]), _ms(level["tbt_s"]["p90"]),
                     _num(level["acceptance_length"], 2), str(level["requests"]), str(level["failed"]),
                     str(level["short"])])
    if rows:
        out += ["  " + line for line in _table(
            ["C", "out tok/s", "TTFT p50 ms", "TTFT p90 ms", "TBT p50 ms", "TBT p90 ms", "accept",
             "reqs", "failed", "short"], rows)]
        for level in result["levels"]:
            if level["errors"]:
                out.append(f"  C={level['concurrency']} errors: " + "; ".join(level["errors"]))
            if level["short"]:
                out.append(f"  C={level['concurrency']}: {level['short']} outputs were not exactly "
                           f"{result['config']['max_tokens']} tokens (the server did not honour ignore_eos?)")
    s = result.get("staggered")
    if s:
        cfg = s["config"]
        out.append(f"  staggered: {cfg['established']} established x {cfg['established_tokens']} tokens; "
                   f"after {cfg['arrive_after_s']:g} s {', '.join(cfg['arriving_prompts'])} arrive "
                   f"({cfg['arrival_tokens']} tokens each)")
        window = s["prefill_window"]
        if window:
            out.append(f"    prefill window {_ms(window['duration_s'])} ms: established goodput "
                       f"{_num(s['established_goodput_tok_s'])} tok/s (before: "
                       f"{_num(s['established_goodput_before_tok_s'])}), effective TBT "
                       f"{_ms(s['established_tbt_effective_s'])} ms (before: {_ms(s['established_tbt_before_s'])}),"
                       f" longest stall {_ms(s['established_max_gap_s'])} ms")
        out.append(f"    arriving TTFT p50 {_ms(s['arriving_ttft_s']['p50'])} ms, prompt "
                   f"{_num(s['prompt_tok_s'])} tok/s ({s['arriving_prompt_tokens']} tokens), round "
                   f"{_num(s['round_time_s'], 2)} s, acceptance {_num(s.get('acceptance_length'), 2)}")
        for warning in s["warnings"] + s["errors"]:
            out.append(f"    WARNING: {warning}")
    return "\n".join(out)


def _value(name: str, value) -> str:
    if name.endswith("_s") and not name.endswith("tok_s"):
        return _ms(value) + " ms"
    return _num(value, 2 if "acceptance" in name else 1)


def format_bracket(result: dict) -> str:
    """The A/B/A verdict: correctness first, then each metric against the drift."""
    out = [f"A/B/A bracket: output-set digests A {result['digests']['A'][:16]}  "
           f"B {result['digests']['B'][:16]}  A2 {result['digests']['A2'][:16]}"]
    if not result["baseline_reproducible"]:
        keys = result["baseline_differing_keys"]
        out.append(f"  INVALID: the baseline's outputs changed between A and A2 on {len(keys)} keys "
                   f"({', '.join(keys[:5])})")
    if not result["correctness_ok"]:
        keys = result["candidate_differing_keys"]
        out.append(f"  CORRECTNESS FAILURE: the candidate's outputs differ from the baseline's on {len(keys)} "
                   f"keys ({', '.join(keys[:5])}); its timings are quarantined and not compared")
        return "\n".join(out)
    out.append("  correctness: candidate outputs identical to the baseline's")
    rows = []
    for c in result["changes"]:
        rel = "-" if c["change_rel"] is None else f"{100 * c['change_rel']:+.1f}%"
        drift = "-" if c["drift_rel"] is None else f"{100 * c['drift_rel']:.1f}%"
        rows.append([c["name"], _value(c["name"], c["a"]), _value(c["name"], c["b"]), _value(c["name"], c["a2"]),
                     drift, rel, c["verdict"]])
    out += ["  " + line for line in _table(["metric", "A", "B", "A2", "drift", "B vs mean(A,A2)", "verdict"], rows)]
    out.append("  (significant only when |B - mean(A, A2)| >= 2 |A2 - A|)")
    return "\n".join(out)


def write_json(path: str, obj: dict) -> None:
    """Write atomically (a temporary file renamed over `path`)."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(finite(obj), f, indent=1, allow_nan=False)
        f.write("\n")
    os.replace(tmp, path)


def finite(value):
    """`value` with every NaN or infinity replaced by None (strict JSON has neither)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value
