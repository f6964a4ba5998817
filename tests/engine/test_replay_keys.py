"""After a warm-up, a seed-like workload meets no eager step: every forward and every tree
commit of a second pass replays (or captures) a graph keyed by what the warm-up met.

The GPU backend runs on the recording double of cuda-python and the kernel library
(tests/ops/fake_cuda.py: no kernel computes, device addresses are real to the double), a
tiny qwen35 at the CUDA kernels' sizes. One pass is the seed workload's shape, scripted:
two established decoders verifying a DDTree-like tree every step (factor capture, or
per-node states), then
two prompts arriving and prefilled in aligned chunks beside those trees (mixed steps
[prefill][tree]), after which they decode with trees too; trees shrink to the tokens left
near the end (other tree buckets), contexts grow across KV page buckets. Each step is
packed by the engine's StepBuilder (the one replay key and padding), run through
GraphedForward, and its accepted paths committed through GraphedCommit, as the engine does.

The seed workload on the H200 met 11 eager steps after its warm-up in its B arm because a
commit's key held the addresses of the verify's staged arrays, which lay in each forward
graph's pool: a verify key first captured after the warm-up made its commits' keys new.
"""
from __future__ import annotations

import pytest

from luce.engine.pages import PagePool
from luce.engine.scheduler import prefill_end
from luce.engine.step import Cohort, DecodeRow, PrefillChunk, StepBuilder, TreeChunk
from luce.models.commit import GraphedCommit, plan_tree_commit
from luce.models.graphed_forward import GraphedForward
from luce.models.kv_cache import pages_needed
from tests.ops.test_hip_runtime import install_fakes

TREE = (-1, 0, 1, 2, 3, 0, 1, 2)      # a chain of 4 below the root, siblings at depths 1-3: 8 nodes
ACCEPT = (0, 1, 2, 3)                  # the root and 3 drafted tokens: 4 tokens a verify
BUDGET = 160                           # tokens a step holds (trees first, then prompt chunks)
PROMPTS = {2: 150, 3: 330}             # arriving slots and prompt lengths
ARRIVE = 3                             # the step the prompts arrive at


def tree_for(left: int) -> tuple[int, ...]:
    """TREE cut to the tokens a lane has left (a tree of depth d commits at most d + 1)."""
    keep = [i for i, p in enumerate(TREE) if _depth(i) <= left - 1]
    return tuple(TREE[i] for i in keep)


def _depth(i: int) -> int:
    d = 0
    while TREE[i] >= 0:
        i, d = TREE[i], d + 1
    return d


def _to_last(tree) -> tuple[int, ...]:
    """The path from the root to the tree's last node."""
    path = [len(tree.parents) - 1]
    while tree.parents[path[-1]] >= 0:
        path.append(int(tree.parents[path[-1]]))
    return tuple(reversed(path))


def one_pass(model, state, pool, forward, commit):
    """The scripted workload from empty slots to every request done; slots released after."""
    builder = StepBuilder(pool)
    length = {0: 450, 1: 500}           # established lanes: committed rows (their KV is scratch here)
    target = {0: 579, 1: 630, 2: 150 + 40, 3: 330 + 40}   # 129 = 4 * 32 + 1: a last AR row; 130: a last small tree
    prefilled = {}
    for slot, n in length.items():
        pool.take(slot, pool.peek_free(pages_needed(n)))
    step = 0
    while any(length.get(s, prefilled.get(s, 0)) < t for s, t in target.items()):
        if step == ARRIVE:
            prefilled.update({s: 0 for s in PROMPTS})
        trees, rows = [], []
        for slot in sorted(length):
            left = target[slot] - length[slot]
            if left > 1:
                parents = tree_for(left)
                trees.append(TreeChunk(slot, slot, tuple(range(1, len(parents) + 1)), parents, length[slot]))
            elif left == 1:                # one token left: an AR row, as the engine would
                rows.append(DecodeRow(slot, slot, 7, length[slot]))
        room = BUDGET - sum(len(t.token_ids) for t in trees) - len(rows)
        chunks = []
        for slot, done in sorted(prefilled.items()):
            end = prefill_end(done, PROMPTS[slot], room) if room > 0 else None
            if end is not None:
                chunks.append(PrefillChunk(slot, slot, tuple(range(done, end)), done, end == PROMPTS[slot]))
                room -= end - done
        if not (trees or rows or chunks):
            break
        batch = builder.build(Cohort(prefill=chunks, decode=rows, tree=trees))
        out = forward(batch.forward, state)
        # the chain on even steps, the path to the tree's last node (a sibling: its KV row moves) on odd
        paths = {t.slot: ACCEPT[:min(len(ACCEPT), 1 + max(t.depths()))] if step % 2 else _to_last(t) for t in trees}
        if trees:
            commit(state, out.staged, plan_tree_commit(batch.forward, paths))
        for slot, pages in batch.new_pages.items():
            pool.take(slot, pages)
        for t in trees:
            length[t.slot] += len(paths[t.slot])
        for r in rows:
            length[r.slot] += 1
        for c in chunks:
            prefilled[c.slot] = c.start + len(c.token_ids)
            if c.completes_prompt:
                length[c.slot] = prefilled.pop(c.slot)
        step += 1
    for slot in target:
        pool.release(slot)
        state.reset_slot(slot)
    return step


# specla's and ddtree's GDN tree verify; a qwen35 whose layers are all full attention (its commit: KV moves only)
@pytest.mark.parametrize("tree_mode", ["factor", "baseline", "no GDN layer"])
def test_after_a_warm_up_pass_no_step_runs_eagerly(monkeypatch, tmp_path, tree_mode):
    from luce.models import load_model
    from luce.ops import get_backend
    from luce.testing.tiny_models import make_qwen35

    install_fakes(monkeypatch, tmp_path, "cuda")
    backend = get_backend("cuda")
    layers = dict(recurrent_layers=(False,) * 4) if tree_mode == "no GDN layer" else {}
    make_qwen35(tmp_path / "q35.gguf", seed=21, head_dim=64, ssm_state_size=64, **layers)
    model = load_model(tmp_path / "q35.gguf", backend)
    if not layers:
        model.gdn_tree_mode = tree_mode
    assert bool(model.config.gdn_layers) != bool(layers)
    n_pages = 4 * pages_needed(700)
    state, pool = model.new_state(max_pages=n_pages, max_slots=4), PagePool(n_pages)
    forward, commit = GraphedForward(model), GraphedCommit(backend)
    keys: list[set] = []
    recorded = GraphedForward.key

    def key(self, batch):
        keys[-1].add(recorded(self, batch))
        return recorded(self, batch)

    monkeypatch.setattr(GraphedForward, "key", key)
    counters = []
    for _ in range(3):
        keys.append(set())
        steps = one_pass(model, state, pool, forward, commit)
        counters.append({name: (dict(owner.counters), dict(owner.cache.eager_reasons))
                         for name, owner in (("forward", forward), ("commit", commit))})
    assert steps > 25 and len(keys[0]) >= 8, (steps, len(keys[0]))      # mixed steps, buckets crossed
    assert keys[1] == keys[2] == keys[0]        # a pass's topology repeats: the keys are the same set
    for name in ("forward", "commit"):
        warm, second, third = (c[name] for c in counters)
        assert warm[0]["eager_steps"] > 0 and warm[0]["failures"] == 0, warm
        assert second[0]["eager_steps"] == warm[0]["eager_steps"], (name, warm, second)     # none after warm-up
        assert third[0]["eager_steps"] == warm[0]["eager_steps"] and third[0]["captures"] == second[0]["captures"]
        assert set(second[1]) == {"first call of a key"}, second[1]
        assert third[0]["replays"] - second[0]["replays"] >= (steps if name == "forward" else 1)
        assert second[0]["drops"] == 0


def test_a_tree_cut_to_the_tokens_left_keeps_its_root():
    assert tree_for(100) == TREE and tree_for(3) == (-1, 0, 1, 0, 1) and tree_for(2) == (-1, 0, 0)


if __name__ == "__main__":
    pytest.main([__file__, "-q"])
