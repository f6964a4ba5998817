"""The seed's C1-C5 measurement (issue 17 deliverable 9), in process through luce.engine.Engine:
fixed-concurrency waves, plain decoding (AR) and speculation with an oracle drafter of a set
acceptance length (luce.spec.drafters.bench_drafters.OracleDrafter, wrapping the real drafter
so every step pays its draft cost), goodput per concurrency, output digests.

    prompts, truth = prepare_waves(model, cfg)                 # the prompts, their greedy outputs
    report = run_waves(model, draft, cfg, prompts, truth)      # {"ar": {C: row}, "specla": {C: row}, "summary"}
    table = compare_waves([a, b, a2])                          # A/B/A across commits: ratios, drift, digests
    gate = run_gate(model, draft, cfg, prompts, truth)         # AL 6 and 3: ar, default config, chain@8

A wave at concurrency C sends C requests together (`max_tokens` forced output tokens each) and
the next wave starts only when all C have ended; wave w sends prompts (w * C + i) mod
`n_prompts`, so successive waves rotate through the prompts (as luce.benchmark.waves does over
HTTP). One engine per arm serves every C (max_slots = the largest C): per C one untimed
warm-up wave (its graph keys captured), then `waves` timed waves. Per C: goodput = output
tokens of the timed waves / their wall time, the waves' times, the digest (sha256 of every
timed request's tokens, in order: equal across arms and commits when everything is exact),
whether every output equals plain greedy decoding, acceptance length, graph counters, and
for speculation the depths the engine chose (`depths`: depth -> steps, 0 = plain decoding).
Arms: 'ar', 'ar2' (a second plain engine: the A/A control, how far two engines decoding alike
differ), 'default' (luce-serve's own SpecConfig for the draft: depth chosen per step, down to
plain decoding), or a mode at a fixed depth ('specla', 'chain@8': the bounds).
A/B/A against the previous commit: run the tool on the previous commit (A), this one (B), the
previous again (A2) and compare the three reports: B/A goodput per arm and C, the A/A drift,
digests equal.
"""
from __future__ import annotations

import hashlib
import time
from dataclasses import asdict, dataclass
from typing import Sequence

import numpy as np


@dataclass(frozen=True)
class WaveConfig:
    concurrency: tuple[int, ...] = (1, 2, 3, 4, 5)
    waves: int = 2                 # timed waves per C (after one warm-up wave)
    prompt_len: int = 256
    max_tokens: int = 128
    n_prompts: int = 10
    acceptance_length: int = 8
    spec: str = "specla"
    budget: int = 22
    top_k: int = 4
    tau: float = 6.0
    chain_depth: int = 15          # fixed-depth arms' depth unless the arm names one ('chain@8')
    token_budget: int = 512
    seed: int = 0

    @property
    def max_slots(self) -> int:
        return max(self.concurrency)

    @property
    def ctx(self) -> int:
        return self.prompt_len + self.max_tokens + self.budget + 32


def prepare_waves(model, cfg: WaveConfig) -> tuple[list[list[int]], list[list[int]]]:
    """(prompts, greedy outputs): `n_prompts` random prompts and their plain greedy continuations."""
    from luce.engine import Engine, EngineConfig, SamplingParams

    rng = np.random.default_rng(cfg.seed)
    vocab = int(model.config.vocab)
    prompts = [[int(t) for t in rng.integers(3, vocab - 1, cfg.prompt_len)] for _ in range(cfg.n_prompts)]
    engine = Engine(model, None, EngineConfig(max_slots=cfg.max_slots, ctx=cfg.ctx, token_budget=cfg.token_budget))
    ids = [engine.add_request(p, SamplingParams(max_tokens=cfg.max_tokens, ignore_eos=True)) for p in prompts]
    engine.run()
    return prompts, [list(engine.take_output(i).token_ids) for i in ids]


def _engine(model, draft, cfg: WaveConfig, prompts, truth, arm: str):
    from luce.benchmark.seed_workload import spec_engine
    from luce.engine import Engine, EngineConfig

    if arm in ("ar", "ar2"):
        return Engine(model, None, EngineConfig(max_slots=cfg.max_slots, ctx=cfg.ctx, token_budget=cfg.token_budget))
    engine, _, _ = spec_engine(model, draft, cfg, [(p, cfg.max_tokens) for p in prompts], truth, arm)
    return engine


def _wave(engine, prompts: Sequence[Sequence[int]], max_tokens: int) -> tuple[float, list[list[int]]]:
    from luce.engine import SamplingParams

    t0 = time.perf_counter()
    ids = [engine.add_request(list(p), SamplingParams(max_tokens=max_tokens, ignore_eos=True)) for p in prompts]
    engine.run()
    seconds = time.perf_counter() - t0
    outs = [engine.take_output(i) for i in ids]
    failed = [o.error for o in outs if o.finish_reason == "error"]
    if failed:
        raise RuntimeError(f"waves: requests ended with errors: {failed}")
    return seconds, [list(o.token_ids) for o in outs]


def run_arm(engine, cfg: WaveConfig, prompts, truth, C: int) -> dict:
    """One warm-up wave, then cfg.waves timed waves of C requests on `engine`."""
    run = _ArmRun(engine, cfg, prompts, truth, C)
    for w in range(1, cfg.waves + 1):
        run.wave(w)
    return run.row()


class _ArmRun:
    """The waves of one arm at one concurrency: the warm-up wave at construction, then timed
    waves (`wave`, in any interleaving with other arms' waves), then the figures (`row`)."""

    def __init__(self, engine, cfg: WaveConfig, prompts, truth, C: int):
        from luce.benchmark.seed_workload import depth_histogram

        self.engine, self.cfg, self.prompts, self.truth, self.C = engine, cfg, prompts, truth, C
        _wave(engine, [prompts[i] for i in self.pick(0)], cfg.max_tokens)
        self.stats = getattr(engine.spec, "stats", None)
        self.before_graphs, self.before_depths = engine.graph_counters(), depth_histogram(engine)
        self.before = (self.stats.verifies, self.stats.emitted) if self.stats is not None else (0, 0)
        self.draft_before = engine.spec.draft_seconds if self.stats is not None else 0.0
        self.times, self.outputs, self.exact = [], [], True

    def pick(self, w: int) -> list[int]:
        return [(w * self.C + i) % len(self.prompts) for i in range(self.C)]

    def wave(self, w: int) -> None:
        seconds, outs = _wave(self.engine, [self.prompts[i] for i in self.pick(w)], self.cfg.max_tokens)
        self.times.append(seconds)
        self.outputs += outs
        self.exact &= all(o == self.truth[i] for o, i in zip(outs, self.pick(w)))

    def row(self) -> dict:
        from luce.benchmark.seed_workload import _delta, depth_histogram

        engine, stats, tokens = self.engine, self.stats, sum(len(o) for o in self.outputs)
        row = {"concurrency": self.C, "goodput_tok_s": tokens / sum(self.times), "wave_s": self.times,
               "tokens": tokens, "digest": hashlib.sha256(repr(self.outputs).encode()).hexdigest(),
               "matches_plain": self.exact, "graphs": _delta(engine.graph_counters(), self.before_graphs)}
        if stats is not None:
            row["acceptance_length"] = (stats.emitted - self.before[1]) / max(1, stats.verifies - self.before[0])
            row["depths"] = depth_histogram(engine, self.before_depths)
            row["draft_s"] = engine.spec.draft_seconds - self.draft_before   # drafting's wall time in the timed waves
            row["policy"] = engine.spec.policy.describe()   # what the depth policy measured, at the end
        return row


def run_waves(model, draft, cfg: WaveConfig, prompts, truth, arms=("ar", "specla"), log=print,
              interleave: bool = False) -> dict:
    """-> {"config", arm: {C: row}, "summary"}. arms: 'ar' (plain decoding), 'default'
    (luce-serve's SpecConfig for the draft: adaptive depth) and spec modes at a fixed depth,
    'MODE' or 'MODE@D' (luce.benchmark.seed_workload.arm_spec). interleave: every arm's engine
    at once, the timed waves taken in turn (wave 1 of each arm, then wave 2, ...), so that a
    drift of the machine's speed weighs on every arm alike (the gate's comparison)."""
    from luce.benchmark.peak_memory import peak_memory

    report: dict = {"config": asdict(cfg)}
    engines = {arm: _engine(model, draft, cfg, prompts, truth, arm) for arm in arms} if interleave else {}
    for arm in arms:
        report[arm] = {}
    for C in cfg.concurrency:
        if interleave:
            runs = {arm: _ArmRun(engines[arm], cfg, prompts, truth, C) for arm in arms}
            for w in range(1, cfg.waves + 1):
                for run in runs.values():
                    run.wave(w)
            for arm, run in runs.items():
                report[arm][C] = run.row()
    for arm in arms:
        if not interleave:
            engine = _engine(model, draft, cfg, prompts, truth, arm)
            for C in cfg.concurrency:
                report[arm][C] = run_arm(engine, cfg, prompts, truth, C)
            del engine
        for C in cfg.concurrency:
            row = report[arm][C]
            depths = f", depths {row['depths']}" if "depths" in row else ""
            depths += f", drafting {row['draft_s']:.3f} s of {sum(row['wave_s']):.3f}" if "draft_s" in row else ""
            log(f"waves: {arm} C{C} {row['goodput_tok_s']:.1f} tok/s, exact {row['matches_plain']}{depths}, "
                f"eager {row['graphs'].get('eager_reasons', {})}")
    engines.clear()
    report["summary"] = {
        "goodput_tok_s": {arm: {C: report[arm][C]["goodput_tok_s"] for C in cfg.concurrency} for arm in arms},
        "digests_equal": all(len({report[arm][C]["digest"] for arm in arms}) == 1 for C in cfg.concurrency),
        "matches_plain": all(report[arm][C]["matches_plain"] for arm in arms for C in cfg.concurrency),
        "eager_steps_after_warmup": {arm: {C: report[arm][C]["graphs"].get("eager_steps", 0) for C in cfg.concurrency}
                                     for arm in arms},
    }
    report["memory"] = peak_memory(model.backend)
    return report


def compare_waves(reports: Sequence[dict]) -> dict:
    """A/B/A of three waves reports (previous commit, this one, previous again):
    {arm: {"C": {"B_over_A", "A_A_drift"}}, "digests_equal"}, C as a string (as JSON keeps it)."""
    if len(reports) != 3:
        raise ValueError(f"A/B/A compares three reports (A, B, A again), got {len(reports)}")
    a, b, a2 = ({str(k): v for k, v in r.get("summary", {}).get("goodput_tok_s", {}).items()} for r in reports)
    out: dict = {}
    for arm in sorted(set(a) & set(b) & set(a2)):
        ga, gb, ga2 = ({str(c): v for c, v in g[arm].items()} for g in (a, b, a2))
        out[arm] = {C: {"B_over_A": gb[C] / ((ga[C] + ga2[C]) / 2), "A_A_drift": abs(ga2[C] - ga[C]) / ga[C]}
                    for C in sorted(set(ga) & set(gb) & set(ga2), key=int)}
    digests = {(arm, str(C), row["digest"]) for r in reports for arm, rows in r.items()
               if isinstance(rows, dict) and arm not in ("config", "summary", "memory") for C, row in rows.items()}
    out["digests_equal"] = len(digests) == len({(arm, C) for arm, C, _ in digests})
    return out


GATE_ARMS = ("ar", "default", "chain@8")


def _ratio_bounds(plain_s, default_s) -> tuple[float, float]:
    """The default arm's speed over plain decoding's per interleaved wave (plain time / default
    time, wave by wave): (mean - 2 standard errors, mean + 2 standard errors)."""
    r = np.asarray(plain_s, np.float64) / np.asarray(default_s, np.float64)
    se = float(r.std(ddof=1) / np.sqrt(len(r))) if len(r) > 1 else 0.0
    return float(r.mean() - 2 * se), float(r.mean() + 2 * se)


def run_gate(model, draft, cfg: WaveConfig, prompts, truth, acceptance_lengths=(6, 3), arms=GATE_ARMS,
             log=print) -> dict:
    """Issue 17 deliverable 6's gate: speculation pays or steps aside. For each acceptance
    length the waves of `arms` (default: plain decoding, luce-serve's default config, the fixed
    depth 8 of --draft-max) -> {"AL<a>": waves report, "summary": {"AL<a>": {C: {arm: goodput,
    "default_over_ar", "exact", "depths"}}, "pass"}}; pass: the default arm's goodput >= plain
    decoding's at every acceptance length and concurrency, every output exact. The arms' timed
    waves are interleaved (run_waves' `interleave`): a drift of the machine weighs on all alike."""
    from dataclasses import replace

    report: dict = {}
    summary: dict = {}
    for a in acceptance_lengths:
        waves = run_waves(model, draft, replace(cfg, acceptance_length=a), prompts, truth, arms=arms,
                          log=lambda line, a=a: log(f"AL {a} {line}"), interleave=True)
        report[f"AL{a}"] = waves
        summary[f"AL{a}"] = {C: {**{arm: waves[arm][C]["goodput_tok_s"] for arm in arms},
                                 "exact": all(waves[arm][C]["matches_plain"] for arm in arms),
                                 "depths": waves.get("default", {}).get(C, {}).get("depths")}
                             for C in cfg.concurrency}
        for C, row in summary[f"AL{a}"].items():
            if "ar" in arms and "default" in arms:
                row["default_over_ar"] = row["default"] / row["ar"]
                row["wave_ratio_2se"] = _ratio_bounds(waves["ar"][C]["wave_s"], waves["default"][C]["wave_s"])
            if "ar" in arms and "ar2" in arms:         # the A/A control: what engine placement alone gives
                row["ar2_over_ar"] = row["ar2"] / row["ar"]
    ratios = [row["default_over_ar"] for rows in summary.values() for row in rows.values() if "default_over_ar" in row]
    exact = all(row["exact"] for rows in summary.values() if isinstance(rows, dict) for row in rows.values())
    summary["pass"] = bool(ratios) and min(ratios) >= 1.0 and exact
    highs = [row["wave_ratio_2se"][1] for rows in summary.values() if isinstance(rows, dict)
             for row in rows.values() if "wave_ratio_2se" in row]
    summary["pass_within_noise"] = bool(highs) and min(highs) >= 1.0 and exact
    report["summary"] = summary
    for key, rows in summary.items():
        if not isinstance(rows, dict):       # pass, pass_within_noise
            continue
        for C, row in rows.items():
            cells = "  ".join(f"{arm} {row[arm]:.1f}" for arm in arms)
            ratio = (f"  default/ar {row['default_over_ar']:.3f} (per wave {row['wave_ratio_2se'][0]:.3f}.."
                     f"{row['wave_ratio_2se'][1]:.3f})") if "default_over_ar" in row else ""
            ratio += f"  A/A ar2/ar {row['ar2_over_ar']:.3f}" if "ar2_over_ar" in row else ""
            log(f"gate {key} C{C}: {cells} tok/s{ratio}  exact {row['exact']}  default depths {row['depths']}")
    log(f"gate: {'PASS' if summary['pass'] else 'FAIL'} (default config >= plain decoding at every AL and C, exact); "
        f"within the waves' noise: {'PASS' if summary['pass_within_noise'] else 'FAIL'} (mean per-wave speed ratio "
        f"+ 2 standard errors >= 1)")
    return report
