"""PNG plots (matplotlib, the optional `bench` extra): output tok/s against concurrency for
each run, and the established requests' time between tokens over the staggered round.

    save_plot([result_a, result_b, result_a2], "bench.png")
"""
from __future__ import annotations

from typing import Sequence

INSTALL_HINT = "plotting needs matplotlib: pip install matplotlib   (or: pip install -e '.[bench]')"


def tbt_timeline(records: Sequence[dict]) -> list[tuple[list[float], list[float]]]:
    """Per established request: (chunk times s, per-token TBT s at that chunk).

    The TBT at chunk j is (t_j - t_{j-1}) / tokens in chunk j, from the record JSON
    (`chunk_times_s`, `chunk_tokens`); the first chunk has none."""
    lines = []
    for record in records:
        if record.get("role") != "established":
            continue
        times, tokens = record["chunk_times_s"], record["chunk_tokens"]
        xs, ys = [], []
        for j in range(1, len(times)):
            if tokens[j] > 0:
                xs.append(times[j])
                ys.append((times[j] - times[j - 1]) / tokens[j])
        lines.append((xs, ys))
    return lines


def save_plot(results: Sequence[dict], path: str) -> None:
    """Write the figure to `path` (PNG); raises RuntimeError when matplotlib is missing."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise RuntimeError(INSTALL_HINT) from None
    staggered = [r for r in results if r.get("staggered")]
    n_panels = 1 + len(staggered)
    fig, axes = plt.subplots(n_panels, 1, figsize=(8, 3.6 * n_panels), squeeze=False)
    ax = axes[0][0]
    for result in results:
        levels = [lv for lv in result.get("levels") or () if lv["output_tok_s"] is not None]
        if levels:
            ax.plot([lv["concurrency"] for lv in levels], [lv["output_tok_s"] for lv in levels], marker="o",
                    label=result["label"])
    ax.set_xticks(sorted({lv["concurrency"] for r in results for lv in r.get("levels") or ()}))
    ax.set_xlabel("concurrency C")
    ax.set_ylabel("output tok/s")
    ax.set_title("output throughput (sum of tokens over the output window)")
    ax.grid(True, alpha=0.3)
    if any(result.get("levels") for result in results):
        ax.legend()
    for panel, result in enumerate(staggered, start=1):
        ax = axes[panel][0]
        s = result["staggered"]
        for i, (xs, ys) in enumerate(tbt_timeline(result["records"]["staggered"])):
            ax.plot(xs, [1000 * y for y in ys], linewidth=0.8, label=f"established {i}")
        window = s.get("prefill_window")
        if window:
            ax.axvspan(window["start_s"], window["end_s"], color="orange", alpha=0.2, label="prefill window")
        ax.set_xlabel("time since the run started (s)")
        ax.set_ylabel("TBT (ms per token)")
        ax.set_title(f"{result['label']}: established requests' TBT, arrivals after "
                     f"{s['config']['arrive_after_s']:g} s")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
