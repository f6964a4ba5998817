"""tools/profile_host_step.py on its fake CUDA runtime: a replayed greedy decode step through
the engine (launched ahead of the last step's ids, luce.engine.ahead) replays its graph and
makes only the runtime calls it needs: the metadata arena's upload, the graph launch, the ids'
copy to the host, an event recorded after that copy and the wait on the last step's event (on
the hybrid too: a step ahead takes no checkpoint of its rows' recurrent state); no kernel is
launched outside the graph (the argmax, the ids kept by slot and the feed are in it). Times are
reported, never asserted."""
import argparse
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
import profile_host_step  # noqa: E402

ARGS = argparse.Namespace(prompt=20, warmup=2, steps=4, profile=0, phases=True, sort="tottime", top=5, spec_depth=0)


@pytest.mark.parametrize("shape, concurrency, runtime_calls", [("1.5b", 1, 5), ("27b", 2, 5)])
def test_a_replayed_decode_step_makes_only_the_runtime_calls_it_needs(shape, concurrency, runtime_calls):
    row = profile_host_step.run(shape, concurrency, ARGS)
    assert row["replays"] == 1 and row["eager"] == 0
    assert row["kernels"] == 0 and row["rt_calls"] == runtime_calls
    assert row["host_us"] > 0 and row["calls"] > 0
    # a step launched ahead neither schedules nor decides: it follows the last step's rows and
    # the device drew its tokens
    assert {"build", "preflight", "forward", "commit", "record+apply"} <= set(row["phases"]) \
        <= {label for label, *_ in profile_host_step.PHASES}


def test_a_speculative_step_replays_its_draft_passes_and_verify():
    """--spec-depth 3 (a 0.5B-shaped draft model, every draft accepted): a step replays the
    draft's 3 passes and the verify (the chain's path is in place: no commit launch), launches
    only the draft's 3 top-k kernels outside a graph, and reports the drafter's host time
    within the step's."""
    row = profile_host_step.run("1.5b", 1, argparse.Namespace(**{**vars(ARGS), "spec_depth": 3, "phases": False}))
    assert row["replays"] == 3 + 1 and row["eager"] == 0 and row["kernels"] == 3
    assert 0 < row["draft_us"] < row["host_us"]


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-v"]))
