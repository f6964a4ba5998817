"""Plain-text tables of a decode benchmark report (luce.benchmark.decode_bench)."""
from __future__ import annotations


def _prefill_budget(report) -> str:
    """The token budget the prefill rows ran at (the engine's default when the settings name none)."""
    used = sorted({r["token_budget"] for r in report["prefill"] if "token_budget" in r})
    return ", ".join(map(str, used)) or str(report["settings"].get("prefill_budget", "-"))


def _table(title: str, header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    line = lambda cells: "  ".join(c.rjust(w) for c, w in zip(cells, widths))  # noqa: E731
    return [title, line(header), line(["-" * w for w in widths]), *(line(r) for r in rows), ""]


def _f(x, digits: int = 2) -> str:
    if isinstance(x, bool):
        return "yes" if x else "NO"
    if isinstance(x, (int, float)):
        return f"{x:.{digits}f}" if isinstance(x, float) else str(x)
    return str(x)


def _rows(records: list[dict], key: str, cells, n_cells: int) -> list[list[str]]:
    """Table rows: cells(record) for measured records; the error text for failed ones."""
    return [[str(r.get(key, "-"))] + (["-"] * (n_cells - 2) + [r["error"][:80]] if "error" in r else cells(r))
            for r in records]


def _replays(r: dict) -> str:
    g = r.get("graphs") or {}
    return f"{g.get('replays', 0)}/{g.get('captures', 0)}/{g.get('eager_steps', 0)}"


def format_report(report: dict) -> str:
    s = report["settings"]
    out = [f"model {report['model']} ({report['arch']}, {report['n_layer']} layers, vocab {report['vocab']}, "
           f"{report['file_bytes'] / 1e9:.2f} GB) on {report['backend']} (sync: {report['sync']}), "
           f"loaded in {report['load_s']:.1f} s",
           f"prompt {s['prompt_len']} tokens; medians of {s['steps']} steps after {s['warmup']} warm-up steps; "
           "build = Python packing the batch, launch = inside model.forward, wait = until the device is done, "
           "sample = argmax to host; graphs = replays/captures/eager forwards (luce.models.graphed_forward); "
           "launches = kernels, memsets and copies of one replayed step (its graph's nodes), /layer = that over "
           "the layer count", ""]
    if report.get("ar"):
        out += _table("AR decode", ["C", "tok/s", "step ms", "build ms", "launch ms", "wait ms", "sample ms", "steps",
                                    "graphs", "launches", "/layer"],
                      _rows(report["ar"], "concurrency", lambda r: [
                          _f(r["tok_s"], 1), _f(r["step_ms"]), _f(r["build_ms"], 3), _f(r["launch_ms"], 3),
                          _f(r["wait_ms"]), _f(r["sample_ms"], 3), str(r["steps"]), _replays(r),
                          str(r.get("launches", "-")), _f(r.get("launches_per_layer", "-"), 1)], 11))
    if report.get("engine_ar"):
        out += _table("AR decode through luce.engine.Engine (scheduler, batch packing, graph replay, argmax; "
                      "host = step minus the wait for the device, launch = its part in graph launches)",
                      ["C", "tok/s", "step ms", "host ms", "launch ms", "wait ms", "steps", "graphs"],
                      _rows(report["engine_ar"], "concurrency", lambda r: [
                          _f(r["tok_s"], 1), _f(r["step_ms"]), _f(r.get("host_ms", float("nan")), 3),
                          _f(r.get("launch_ms", float("nan")), 3), _f(r.get("wait_ms", float("nan"))),
                          str(r["steps"]), _replays(r)], 8))
    if report.get("verify"):
        out += _table(f"Verify (one slot, DDTree rows, mode {s['spec_mode']}; x AR = multiple of the C=1 AR step, "
                      f"{_f(report.get('verify_ar_step_ms', float('nan')))} ms)",
                      ["width", "depth", "step ms", "x AR", "build ms", "launch ms", "wait ms", "steps", "graphs"],
                      _rows(report["verify"], "width", lambda r: [
                          str(r["tree_depth"]), _f(r["step_ms"]), _f(r["x_ar_step"]), _f(r["build_ms"], 3),
                          _f(r["launch_ms"], 3), _f(r["wait_ms"]), str(r["steps"]), _replays(r)], 9))
    if report.get("draft_pass"):
        out += _table(f"Draft pass ({report['draft']})", ["C", "pass ms", "steps"],
                      _rows(report["draft_pass"], "concurrency", lambda r: [_f(r["pass_ms"]), str(r["steps"])], 3))
    if report.get("spec"):
        draft = f"real draft {report['draft']} run and discarded" if report.get("draft") else "no draft cost"
        out += _table(f"Speculation bounds (mode {s['spec_mode']}, steady steps only; {draft})",
                      ["drafter", "C", "tok/s", "step ms", "tok/step", "accept len", "rows/verify", "steps",
                       "output = AR", "graphs"],
                      _rows(report["spec"], "drafter", lambda r: [
                          str(r["concurrency"]), _f(r["tok_s"], 1), _f(r["step_ms"]), _f(r["tokens_per_step"]),
                          _f(r["acceptance_length"]), _f(r["rows_per_verify"], 1), str(r["steps"]),
                          f"{_f(r['matches_ar'])} ({r['misses']} misses)", _replays(r)], 10))
    if report.get("prefill"):
        out += _table(f"Prefill through luce.engine.Engine (one prompt, time to first token, best of "
                      f"{s.get('prefill_reps', '-')}, token budget {_prefill_budget(report)})",
                      ["prompt", "tok/s", "TTFT s", "median s", "steps", "graphs"],
                      _rows(report["prefill"], "prompt_tokens", lambda r: ["-"] * 4 + [r["skipped"]] if "skipped" in r else [
                          _f(r["tok_s"], 1), _f(r["ttft_s"], 3), _f(r["ttft_median_s"], 3), str(r["steps"]),
                          _replays(r)], 6))
    mem = report.get("memory", {})
    if mem:
        out.append("memory: " + ", ".join(f"{k}={v}" for k, v in mem.items()))
    return "\n".join(out)
