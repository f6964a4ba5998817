"""The seed workload of issue 15, in process through luce.engine.Engine (no server):

two established decoders, then two prompts (~1,500 and ~4,500 tokens, 64 output tokens each)
arriving `arrive_after_s` later, `max_slots` slots, an oracle drafter with a set acceptance
length (luce.spec.drafters.bench_drafters.OracleDrafter, wrapping the real drafter so a step
pays its draft cost) over the true greedy continuations (a plain run computes them first).

    requests, outputs = prepare(model, cfg)            # the workload and its plain greedy outputs
    report = run_seed(model, draft, cfg, requests, outputs)      # {"warmup", "warmup_paused", "A", "B", "A2", ...}
    modes = compare_modes(model, draft, cfg, requests, outputs)  # {"specla": ..., "ddtree": ...}

Arms: A pauses speculation while prompts prefill (EngineConfig.spec_during_prefill False),
B keeps it. One engine serves a warm-up run of each arm (B's, then A's at B's arrival step:
the arms' prefill-window steps differ in topology, A's carrying no trees, so a warm-up of one
arm leaves the other's replay keys unseen), then A, B, A; the measured runs meet only keys
the warm-ups met (their graphs captured then, or on their second call). Per run:
established goodput in the prefill window (their tokens emitted
after the arrival t_a up to the last arriving request's first token t_p, over t_p - t_a),
the same before the arrival, the arriving requests' TTFT (from t_a), the full round (first
step to last token), all tokens over the round, the output digest (sha256 of every
request's tokens: must be equal across runs), the step count and the graph counters of the
run (eager calls by reason). `compare_modes` runs the B arm with spec modes side by side
(SpecLA vs per-node-state ddtree): tok/s, goodput and the peak staged verify scratch.
Both summaries list the eager calls after the warm-up by reason (`eager_after_warmup`) and
the graph keys a measured run met that no warm-up met (`new_keys_after_warmup`, by topology:
the target's and the draft's forward keys, the tree commits' replay keys; recorded on the
host, so on every backend). On a GPU, eager calls after the warm-up with no new key there
mean the cache let graphs go or a commit's staged scratch moved; new keys mean the runs'
steps differ in shape.
Speculation arms (`arm_spec`): 'default' is luce-serve's own SpecConfig for the draft (the
server's construction, depth chosen per step down to plain decoding); a mode ('specla',
'chain', ...) or 'MODE@D' drafts a fixed depth. Every run reports the depths the engine
chose (`depths`: depth -> steps, 0 = plain).
"""
from __future__ import annotations

import hashlib
import time
from dataclasses import asdict, dataclass, field

import numpy as np


@dataclass(frozen=True)
class SeedConfig:
    established: int = 2
    established_tokens: int = 3072
    arriving_lens: tuple[int, ...] = (1500, 4500)
    arriving_tokens: int = 64
    arrive_after_s: float = 2.0
    max_slots: int = 5
    token_budget: int = 512
    acceptance_length: int = 8
    spec: str = "specla"          # the arm (seed_workload.arm_spec): a mode, MODE@DEPTH or 'default'
    budget: int = 22
    top_k: int = 4
    tau: float = 6.0
    chain_depth: int = 15         # fixed-depth arms' depth (a draft model's; DFlash: its block)
    seed: int = 0

    @property
    def ctx(self) -> int:
        return max(max(self.arriving_lens) + self.arriving_tokens, 64 + self.established_tokens) + self.budget + 32


def workload(cfg: SeedConfig, vocab: int) -> list[tuple[list[int], int]]:
    """(prompt, max_tokens) of the established requests, then the arriving ones."""
    rng = np.random.default_rng(cfg.seed)
    prompt = lambda n: [int(t) for t in rng.integers(3, vocab - 1, n)]  # noqa: E731
    return ([(prompt(64), cfg.established_tokens) for _ in range(cfg.established)]
            + [(prompt(n), cfg.arriving_tokens) for n in cfg.arriving_lens])


def prepare(model, cfg: SeedConfig):
    """(requests, outputs): the workload and the greedy continuation of every request (plain
    decoding: what speculation must equal, and the oracle's truth)."""
    from luce.engine import Engine, EngineConfig, SamplingParams

    requests = workload(cfg, int(model.config.vocab))
    engine = Engine(model, None, EngineConfig(max_slots=cfg.max_slots, ctx=cfg.ctx, token_budget=cfg.token_budget))
    ids = [engine.add_request(p, SamplingParams(max_tokens=n, ignore_eos=True)) for p, n in requests]
    engine.run()
    return requests, [engine.take_output(i).token_ids for i in ids]


def _staged_bytes(out) -> int:
    total = 0
    for stage in out.staged.values():
        for arr in (stage.conv_inputs, stage.node_states, *(() if stage.factors is None else
                                                             (stage.factors.k, stage.factors.g, stage.factors.beta,
                                                              stage.factors.u))):
            total += 0 if arr is None else int(np.prod(arr.shape)) * np.dtype(arr.dtype).itemsize
    return total


DEFAULT_ARM = "default"   # the SpecConfig luce-serve runs for the draft (adaptive depth, down to plain)


def arm_spec(arm: str, draft, cfg):
    """The SpecConfig of a benchmark arm over `draft` (a loaded draft model or None):
    'default' is exactly luce-serve's default for such a draft (luce.server.engine_core.
    serve_spec_config of ServeOptions(): chain, depth adaptive in [draft_min, draft_max]);
    'MODE' or 'MODE@D' (MODE in luce.spec.config.MODES) a fixed depth D (cfg.chain_depth),
    DDTree options from cfg: the bounds the default is measured against."""
    from luce.spec.config import SpecConfig

    kind = "dflash" if draft is not None and draft.config.arch == "dflash" else "model"
    if arm == DEFAULT_ARM:
        from luce.server.engine_core import ServeOptions, serve_spec_config

        return serve_spec_config(ServeOptions(draft_kind=kind), "oracle")
    mode, _, depth = arm.partition("@")
    return SpecConfig(spec=mode, draft_kind=kind, draft="oracle", ddtree_budget=cfg.budget, spec_top_k=cfg.top_k,
                      ddtree_tau=cfg.tau, chain_depth=int(depth) if depth else cfg.chain_depth)


def spec_engine(model, draft, cfg, requests, outputs, arm: str):
    """(engine, oracle, RunRecord): an engine speculating as `arm` (arm_spec) with the oracle
    drafter over the true continuations, wrapping the drafter the arm's SpecConfig builds for
    `draft` (luce.spec.config.make_drafter, as the server: depth, draft vocabulary) so every
    step pays the real draft cost; no draft: the oracle alone (free drafts)."""
    from luce.engine import Engine, EngineConfig
    from luce.spec.config import make_drafter
    from luce.spec.drafters.bench_drafters import OracleDrafter

    spec = arm_spec(arm, draft, cfg)
    inner = None if draft is None else make_drafter(spec, model, cfg.max_slots, cfg.ctx, draft_model=draft)
    oracle = OracleDrafter([p + o for (p, _), o in zip(requests, outputs)], model.config.vocab, inner=inner,
                           acceptance_length=cfg.acceptance_length)
    engine = Engine(model, None, EngineConfig(max_slots=cfg.max_slots, ctx=cfg.ctx, token_budget=cfg.token_budget,
                                              spec=spec), drafter=oracle)
    record = RunRecord()
    engine.forward = _RecordingForward(engine.forward, record, "target")
    engine.committer = _RecordingCommit(engine.committer, record)
    if inner is not None:
        inner.forward = _RecordingForward(inner.forward, record, "draft")
    return engine, oracle, record


def depth_histogram(engine, before: dict | None = None) -> dict[int, int]:
    """depth -> steps the engine's speculation chose it (0: plain decoding), less `before`."""
    spec = getattr(engine, "spec", None)
    counts = dict(getattr(spec, "depths", {}))
    return {d: n - (before or {}).get(d, 0) for d, n in sorted(counts.items()) if n - (before or {}).get(d, 0)}


@dataclass
class RunRecord:
    """What the graph owners of a seed engine met: the peak staged verify scratch and the
    graph keys by topology (`keys`: (owner, key), the current run's; run_once resets it)."""

    staged_bytes: int = 0
    keys: set = field(default_factory=set)


class _RecordingForward:
    """A GraphedForward (the target's or the draft's) recording its graph keys and, for the
    target, the peak staged verify scratch; its counters and graph cache stay visible
    (Engine.graph_counters, the engine's room-making)."""

    def __init__(self, forward, record: RunRecord, owner: str):
        self.inner, self.record, self.owner = forward, record, owner

    def __call__(self, batch, state, **kw):
        self.record.keys.add((self.owner, self.inner.key(batch)))
        out = self.inner(batch, state, **kw)
        if self.owner == "target":
            self.record.staged_bytes = max(self.record.staged_bytes, _staged_bytes(out))
        return out

    def __getattr__(self, name):
        return getattr(self.inner, name)


class _RecordingCommit:
    """The engine's GraphedCommit, recording each commit's topology (its replay key and the
    stage modes; the graph key adds the staged arrays' addresses, which only a GPU fixes)."""

    def __init__(self, committer, record: RunRecord):
        self.inner, self.record = committer, record

    def __call__(self, state, staged: dict, commit) -> None:
        if len(commit.slots):
            modes = tuple((il, st.mode) for il, st in sorted(staged.items()))
            self.record.keys.add(("commit", (commit.replay_key, modes)))
        return self.inner(state, staged, commit)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def _delta(after: dict, before: dict) -> dict:
    out = {k: v - before.get(k, 0) for k, v in after.items() if isinstance(v, (int, float))}
    reasons = {k: v - before.get("eager_reasons", {}).get(k, 0) for k, v in after.get("eager_reasons", {}).items()}
    out["eager_reasons"] = {k: v for k, v in reasons.items() if v}
    return out


def run_once(engine, cfg: SeedConfig, requests, pause_during_prefill: bool, arrive_step: int | None = None) -> dict:
    """One pass of the workload on `engine` (reused: its graphs stay warm). The prompts arrive
    before step `arrive_step`, or (None: the warm-up) at the first step `cfg.arrive_after_s`
    after the start; the report's `arrive_step` lets later passes arrive at the same step, so
    their steps have the warm-up's shapes (replay keys) instead of a wall-clock-dependent mix."""
    from luce.engine import SamplingParams

    engine.spec.during_prefill = not pause_during_prefill
    record = getattr(engine.forward, "record", None)   # spec_engine's RunRecord
    if record is not None:
        record.keys = set()
    n_est = cfg.established
    before_graphs, before_stats = engine.graph_counters(), dict(verifies=engine.spec.stats.verifies,
                                                                emitted=engine.spec.stats.emitted)
    before_depths = dict(engine.spec.depths)
    t0 = time.perf_counter()
    rids = [engine.add_request(p, SamplingParams(max_tokens=n, ignore_eos=True)) for p, n in requests[:n_est]]
    events: list[tuple[float, object, int]] = []   # (time, request id, tokens)
    first: dict = {}
    t_a, steps, arrived_at = None, 0, None
    while engine.has_unfinished() or t_a is None:
        due = steps >= arrive_step if arrive_step is not None else time.perf_counter() - t0 >= cfg.arrive_after_s
        if t_a is None and due:
            arrived_at = steps
            t_a = time.perf_counter()
            rids += [engine.add_request(p, SamplingParams(max_tokens=n, ignore_eos=True)) for p, n in requests[n_est:]]
        updates = engine.step()
        now = time.perf_counter()
        steps += 1
        for u in updates:
            if u.token_ids:
                events.append((now, u.request_id, len(u.token_ids)))
                first.setdefault(u.request_id, now)
        if steps > 200_000:
            raise RuntimeError("the seed workload did not finish")
    outs = [engine.take_output(r) for r in rids]
    failed = [(r, o.error) for r, o in zip(rids, outs) if o.finish_reason == "error"]
    if failed:   # such a request may have no first token: no figure of the run would mean anything
        raise RuntimeError(f"seed workload: requests ended with errors: {failed}")
    t_end = max(t for t, _, _ in events)
    arriving = rids[n_est:]
    t_p = max(first[r] for r in arriving)
    est = set(rids[:n_est])
    last = {r: max(t for t, rr, _ in events if rr == r) for r in est}
    in_window = sum(n for t, r, n in events if r in est and t_a < t <= t_p)
    t_s = max(first[r] for r in rids[:n_est])
    before = sum(n for t, r, n in events if r in est and t_s < t <= t_a)
    digest = hashlib.sha256(repr([o.token_ids for o in outs]).encode()).hexdigest()
    s = engine.spec.stats
    return {
        "pause_during_prefill": pause_during_prefill, "steps": steps, "arrive_step": arrived_at,
        "established_goodput_tok_s": in_window / (t_p - t_a) if t_p > t_a else float("nan"),
        "established_goodput_before_tok_s": before / (t_a - t_s) if t_a > t_s else float("nan"),
        "prefill_window_s": t_p - t_a, "arriving_ttft_s": [first[r] - t_a for r in arriving],
        "round_s": t_end - t0, "tok_s": sum(len(o.token_ids) for o in outs) / (t_end - t0),
        "established_done_before_window_end": any(last[r] < t_p for r in est),   # True: raise established_tokens
        "finish_reasons": [o.finish_reason for o in outs], "digest": digest,
        "acceptance_length": (s.emitted - before_stats["emitted"]) / max(1, s.verifies - before_stats["verifies"]),
        "graphs": _delta(engine.graph_counters(), before_graphs), "depths": depth_histogram(engine, before_depths),
        "keys": sorted(map(repr, record.keys)) if record is not None else [],
    }


def run_seed(model, draft, cfg: SeedConfig, requests, outputs, log=print) -> dict:
    """Warm-up, then A / B / A on one engine -> report dict."""
    from luce.benchmark.peak_memory import peak_memory

    report = {"config": asdict(cfg), "truth_digest": hashlib.sha256(repr(outputs).encode()).hexdigest()}
    engine, oracle, record = spec_engine(model, draft, cfg, requests, outputs, cfg.spec)
    report["warmup"] = run_once(engine, cfg, requests, pause_during_prefill=False)
    arrive = report["warmup"]["arrive_step"]
    report["warmup_paused"] = run_once(engine, cfg, requests, pause_during_prefill=True, arrive_step=arrive)
    log(f"seed: warm-up {report['warmup']['round_s']:.1f} s + {report['warmup_paused']['round_s']:.1f} s")
    for arm, pause in (("A", True), ("B", False), ("A2", True)):
        report[arm] = run_once(engine, cfg, requests, pause, arrive_step=arrive)
        report[arm]["new_keys"] = new_keys(report[arm], [report["warmup"], report["warmup_paused"]])
        log(f"seed: {arm} goodput {report[arm]['established_goodput_tok_s']:.1f} tok/s, "
            f"eager {report[arm]['graphs'].get('eager_reasons', {})}, new keys {len(report[arm]['new_keys'])}")
    a, b, a2 = (report[k]["established_goodput_tok_s"] for k in ("A", "B", "A2"))
    digests = {report[k]["digest"] for k in ("warmup", "warmup_paused", "A", "B", "A2")} | {report["truth_digest"]}
    report["summary"] = {
        "B_over_A_goodput": b / ((a + a2) / 2) if a + a2 > 0 else float("nan"),
        "A_A_drift": abs(a2 - a) / a if a > 0 else float("nan"), "goal_B_4x_A": b >= 4 * (a + a2) / 2,
        "digests_equal": len(digests) == 1,
        "oracle_misses": oracle.misses, "peak_staged_bytes": record.staged_bytes,
        **after_warmup({arm: report[arm] for arm in ("A", "B", "A2")}),
    }
    report["memory"] = peak_memory(model.backend)
    return report


def compare_modes(model, draft, cfg: SeedConfig, requests, outputs, modes=("specla", "ddtree"), log=print) -> dict:
    """The B arm under each spec mode (fresh engine each, one warm-up pass first)."""
    from luce.benchmark.peak_memory import peak_memory

    digest = hashlib.sha256(repr(outputs).encode()).hexdigest()
    report = {"config": asdict(cfg)}
    for mode in modes:
        engine, _, record = spec_engine(model, draft, cfg, requests, outputs, mode)
        warm = run_once(engine, cfg, requests, pause_during_prefill=False)
        record.staged_bytes = 0
        row = run_once(engine, cfg, requests, pause_during_prefill=False, arrive_step=warm["arrive_step"])
        row["new_keys"] = new_keys(row, [warm])
        row["peak_staged_bytes"] = record.staged_bytes
        row["matches_plain"] = row["digest"] == digest
        row["memory"] = peak_memory(model.backend)
        report[mode] = row
        log(f"modes: {mode} {row['tok_s']:.1f} tok/s, staged scratch {row['peak_staged_bytes'] / 2**20:.1f} MiB, "
            f"eager after warm-up {row['graphs'].get('eager_reasons', {})}, new keys {len(row['new_keys'])}")
        del engine
    rows = {mode: report[mode] for mode in modes}
    report["summary"] = {
        "tok_s": {m: r["tok_s"] for m, r in rows.items()},
        "peak_staged_MiB": {m: r["peak_staged_bytes"] / 2**20 for m, r in rows.items()},
        "peak_device_reserved_MiB": {m: r["memory"].get("device_reserved_bytes", 0) / 2**20 for m, r in rows.items()},
        "matches_plain": {m: r["matches_plain"] for m, r in rows.items()},
        **after_warmup(rows),
    }
    if "specla" in report and "ddtree" in report:
        report["summary"]["specla_over_ddtree_tok_s"] = report["specla"]["tok_s"] / report["ddtree"]["tok_s"]
    return report


def new_keys(run: dict, warmups: list[dict]) -> list[str]:
    """The graph keys `run` met that none of the warm-up runs met."""
    return sorted(set(run["keys"]).difference(*(w["keys"] for w in warmups)))


def after_warmup(runs: dict) -> dict:
    """Eager calls (forward, tree commit, draft passes) of runs after the warm-up, by reason,
    and their captures: the acceptance's "no eager steps after warm-up" (empty on a backend
    without graphs, where nothing is captured); and the graph keys each met that its
    warm-ups did not (`new_keys_after_warmup`, on every backend)."""
    return {"eager_after_warmup": {name: r["graphs"].get("eager_reasons", {}) for name, r in runs.items()},
            "eager_steps_after_warmup": {name: r["graphs"].get("eager_steps", 0) for name, r in runs.items()},
            "captures_after_warmup": {name: r["graphs"].get("captures", 0) for name, r in runs.items()},
            "new_keys_after_warmup": {name: r["new_keys"] for name, r in runs.items()}}
