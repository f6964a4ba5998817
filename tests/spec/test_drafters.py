"""Drafters: n-gram lookup, draft model (batched lanes, catch-up), DFlash (batched lanes)."""
from __future__ import annotations

import numpy as np
import pytest

from luce.models import SegmentSpec, build_batch, pages_needed
from luce.models.batch import SEG_PREFILL, SEG_TREE
from luce.models.packer import generate_greedy
from luce.models.dflash import features_from_captured
from luce.ref.sampling import top_k_logprobs
from luce.spec.drafters import DraftLane, NgramDrafter
from luce.spec.drafters.dflash import DFlashDrafter
from luce.spec.drafters.draft_model import DraftModelDrafter


# ---- n-gram ------------------------------------------------------------------------------------
def test_ngram_longest_suffix_counts_and_recency():
    d = NgramDrafter(max_ngram=3)
    seq = [1, 2, 3, 4, 9, 2, 3, 5, 7, 2, 3, 4, 8, 2, 3]
    prop = d.propose([DraftLane(0, seq, depth=3, top_k=3)])[0]
    # suffix (2, 3) occurred at 1, 5, 9 -> followed by 4, 5, 4; then 9, 7, 8
    assert prop.ids[0].tolist() == [4, 5, -1]
    np.testing.assert_allclose(prop.logprobs[0, :2], np.log([2 / 3, 1 / 3]), rtol=1e-6)
    assert prop.ids[1].tolist() == [8, 7, 9]  # equal counts: most recent first
    assert prop.ids[2].tolist() == [2, -1, -1] and prop.logprobs[2, 0] == 0.0


def test_ngram_prefers_longer_match_and_stops_when_text_ends():
    d = NgramDrafter(max_ngram=3)
    seq = [5, 1, 2, 6, 0, 1, 2, 7, 0, 1, 2]
    prop = d.propose([DraftLane(0, seq, depth=6, top_k=2)])[0]
    assert prop.ids[0].tolist() == [7, -1]     # (0, 1, 2) matched once, before 7
    assert prop.depth == 4                     # 7, 0, 1, 2 then the text ends
    assert d.propose([DraftLane(0, [1, 2, 3], 4, 2)])[0].depth == 0
    with pytest.raises(ValueError):
        NgramDrafter(max_ngram=1, min_ngram=2)


# ---- draft model -------------------------------------------------------------------------------
def test_draft_model_chain_is_its_greedy_continuation(tiny_models):
    model = tiny_models["qwen3"]
    prompt = [3, 17, 40, 2, 99, 5]
    greedy = generate_greedy(model, prompt, 6)
    drafter = DraftModelDrafter(model, max_slots=2, ctx=64, max_depth=5)
    prop = drafter.propose([DraftLane(1, prompt + greedy[:1], depth=5, top_k=3)])[0]
    assert prop.ids[:, 0].tolist() == greedy[1:6]
    assert (np.diff(prop.logprobs, axis=1) <= 0).all()


def test_draft_model_lanes_batched_and_catch_up_equal_fresh(tiny_models):
    model = tiny_models["qwen3_draft"]
    seqs = {0: [4, 8, 15, 16, 23, 42, 7], 2: [1, 2, 3]}
    alone = {s: DraftModelDrafter(model, 3, 64, 4).propose([DraftLane(s, t, 4, 2)])[0] for s, t in seqs.items()}
    drafter = DraftModelDrafter(model, 3, 64, 4)
    together = drafter.propose([DraftLane(s, t, 4, 2) for s, t in seqs.items()])
    for prop, s in zip(together, seqs):
        np.testing.assert_array_equal(prop.ids, alone[s].ids)
        np.testing.assert_array_equal(prop.logprobs, alone[s].logprobs)
    # the sequence grows (two accepted drafts and a bonus): catch-up equals a fresh drafter
    grown = seqs[0] + [int(together[0].ids[0, 0]), int(together[0].ids[1, 0]), 11]
    rows, forward = [], drafter.forward
    drafter.forward = lambda batch, state, **kw: (rows.append(batch.n_rows), forward(batch, state, **kw))[1]
    again = drafter.propose([DraftLane(0, grown, 3, 2)])[0]
    drafter.forward = forward
    assert rows[0] == 1   # the accepted drafts' KV rows were kept: only the bonus token is fed
    fresh = DraftModelDrafter(model, 3, 64, 4).propose([DraftLane(0, grown, 3, 2)])[0]
    np.testing.assert_array_equal(again.ids, fresh.ids)
    np.testing.assert_array_equal(again.logprobs, fresh.logprobs)
    # a rewritten history (slot reused) is followed too
    other = drafter.propose([DraftLane(0, [9, 9, 9, 1], 3, 2)])[0]
    np.testing.assert_array_equal(other.ids, DraftModelDrafter(model, 3, 64, 4).propose(
        [DraftLane(0, [9, 9, 9, 1], 3, 2)])[0].ids)


def test_hybrid_draft_model_restores_its_state(tiny_models):
    model = tiny_models["qwen35"]
    drafter = DraftModelDrafter(model, 1, 64, 3)
    lane = DraftLane(0, [5, 6, 7, 8], 3, 2)
    first = drafter.propose([lane])[0]
    assert drafter.seen[0] == 4
    second = drafter.propose([lane])[0]   # same sequence again: restarts, same proposal
    np.testing.assert_array_equal(first.ids, second.ids)
    grown = drafter.propose([DraftLane(0, [5, 6, 7, 8, 1], 3, 2)])[0]
    fresh = DraftModelDrafter(model, 1, 64, 3).propose([DraftLane(0, [5, 6, 7, 8, 1], 3, 2)])[0]
    np.testing.assert_array_equal(grown.ids[:, 0], fresh.ids[:, 0])


def test_draft_head_vocab_proposes_the_best_id_below_the_cut(tiny_models):
    """head_vocab H: at every depth the proposal is the argmax of the full model's logits over
    ids < H (the reference: plain forwards on the growing chain, sliced in numpy)."""
    model, H = tiny_models["qwen3_draft"], 150
    prompt = [4, 8, 15, 16, 23, 42, 7]
    prop = DraftModelDrafter(model, 1, 64, 4, head_vocab=H).propose([DraftLane(0, prompt, 4, 3)])[0]
    assert (prop.ids < H).all() and prop.ids.shape == (4, 3)
    chain = list(prompt)
    for d in range(4):
        pages = list(range(pages_needed(len(chain))))
        state = model.new_state(max_pages=len(pages), max_slots=1)
        logits = np.asarray(model.forward(build_batch([SegmentSpec(0, chain, 0, pages)]), state).logits)[-1]
        order = np.argsort(-logits[:H], kind="stable")
        assert prop.ids[d].tolist() == order[:3].tolist()
        chain.append(int(order[0]))
    assert model.output.shape == (model.config.vocab, model.config.hidden)   # the caller's head is whole
    with pytest.raises(ValueError, match="head vocabulary"):
        DraftModelDrafter(model, 1, 16, head_vocab=0)


def test_draft_model_rejects_other_vocab(tiny_models):
    with pytest.raises(ValueError, match="tokenizer"):
        DraftModelDrafter(tiny_models["qwen3"], 1, 16, target_vocab=1000)


# ---- DFlash ------------------------------------------------------------------------------------
def target_features(target, draft, tokens):
    """Prefill `tokens` on the target, capturing the draft's layers -> features [T, W]."""
    state = target.new_state(max_pages=pages_needed(len(tokens)), max_slots=1)
    out = target.forward(build_batch([SegmentSpec(0, tokens, 0, list(range(pages_needed(len(tokens)))))],
                                     capture_layers=draft.target_layers), state)
    return np.asarray(features_from_captured(out.captured, draft.target_layers, target.backend))


def test_dflash_drafter_matches_single_sequence_api_and_batches(tiny_models):
    """Committed features reach the drafter through add_context (one batched call per commit,
    backend arrays); proposals then equal the single-sequence API's, lane by lane."""
    target, draft = tiny_models["qwen35"], tiny_models["dflash"]
    seqs = {1: [3, 9, 27, 81, 5, 6], 0: [7, 7, 2]}
    feats = {s: target_features(target, draft, t[:-1]) for s, t in seqs.items()}
    drafter = DFlashDrafter(draft, max_slots=2, ctx=64)
    assert drafter.max_depth == draft.block_size - 1 and drafter.feature_layers == draft.target_layers
    drafter.add_context([(s, 0, len(feats[s])) for s in seqs], np.concatenate([feats[s] for s in seqs]))
    props = drafter.propose([DraftLane(s, t, depth=3, top_k=2) for s, t in seqs.items()])
    for prop, (s, t) in zip(props, seqs.items()):
        seq = draft.new_sequence(64)
        logits = draft.propose(seq, feats[s], t[-1])
        ids, lps = top_k_logprobs(logits, 2)
        np.testing.assert_array_equal(prop.ids, ids)
        np.testing.assert_array_equal(prop.logprobs, lps)
    # the next commit hands over only the newly committed positions
    grown = seqs[0] + [11, 12]
    all_feats = target_features(target, draft, grown[:-1])
    drafter.add_context([(0, len(seqs[0]) - 1, len(all_feats) - len(seqs[0]) + 1)], all_feats[len(seqs[0]) - 1:])
    nxt = drafter.propose([DraftLane(0, grown, 2, 1)])[0]
    seq = draft.new_sequence(64)
    ids, _ = top_k_logprobs(draft.propose(seq, all_feats, grown[-1]), 1)
    assert nxt.ids[:, 0].tolist() == ids[:2, 0].tolist()
    with pytest.raises(ValueError, match="exactly once"):
        drafter.propose([DraftLane(0, grown + [1], 2, 1)])
    with pytest.raises(ValueError, match="exactly once"):
        drafter.add_context([(0, 3, 1)], all_feats[:1])


def test_dflash_scores_only_the_block_rows_its_lanes_draft(tiny_models):
    """Lanes drafting 1 and 2 deep (block 4): the pass takes 2 rows a lane to the LM head
    (logit_rows: a power of two), not 3, and proposes what the whole block's logits give."""
    from luce.spec.drafters.dflash import logit_rows

    assert [logit_rows(d, 15) for d in (1, 2, 3, 5, 8, 9, 15)] == [1, 2, 4, 8, 8, 15, 15]
    target, draft = tiny_models["qwen35"], tiny_models["dflash"]
    seqs = {1: [3, 9, 27, 81, 5, 6], 0: [7, 7, 2]}
    feats = {s: target_features(target, draft, t[:-1]) for s, t in seqs.items()}
    drafter = DFlashDrafter(draft, max_slots=2, ctx=64)
    drafter.add_context([(s, 0, len(feats[s])) for s in seqs], np.concatenate([feats[s] for s in seqs]))
    rows, forward = [], drafter.forward
    drafter.forward = lambda batch, state, **kw: (rows.append(len(batch.logits_indices)), forward(batch, state, **kw))[1]
    props = drafter.propose([DraftLane(1, seqs[1], depth=1, top_k=2), DraftLane(0, seqs[0], depth=2, top_k=2)])
    assert rows == [4]
    for prop, (s, t), depth in zip(props, seqs.items(), (1, 2)):
        ids, lps = top_k_logprobs(draft.propose(draft.new_sequence(64), feats[s], t[-1]), 2)
        np.testing.assert_array_equal(prop.ids, ids[:depth])
        np.testing.assert_array_equal(prop.logprobs, lps[:depth])


def test_oracle_with_a_set_acceptance_length_commits_exactly_that_many(tiny_models):
    """The seed workload's drafter: the truth at the first a - 1 depths only, so a verify of a
    deep tree commits a tokens (a - 1 drafts and the bonus), whatever the tree's shape."""
    from luce.engine import Engine, EngineConfig, SamplingParams
    from luce.spec.config import SpecConfig
    from luce.spec.drafters.bench_drafters import OracleDrafter

    model = tiny_models["qwen3"]
    prompts = [[5, 6, 7, 8, 9], [11, 12, 13]]
    plain = Engine(model, None, EngineConfig(max_slots=2, ctx=128, token_budget=80))
    ids = [plain.add_request(p, SamplingParams(max_tokens=30)) for p in prompts]
    plain.run()
    want = [plain.take_output(i).token_ids for i in ids]
    for mode in ("chain", "specla"):
        drafter = OracleDrafter([p + w for p, w in zip(prompts, want)], model.config.vocab, acceptance_length=4)
        spec = SpecConfig(spec=mode, draft_kind="model", draft="oracle", chain_depth=8, ddtree_budget=10,
                          spec_top_k=3)
        engine = Engine(model, None, EngineConfig(max_slots=2, ctx=128, token_budget=80, spec=spec), drafter=drafter)
        ids = [engine.add_request(p, SamplingParams(max_tokens=30)) for p in prompts]
        engine.run()
        assert [engine.take_output(i).token_ids for i in ids] == want
        s = engine.spec.stats
        assert s.verifies > 4 and s.acceptance_length > 3.5 and s.accepted <= 3 * s.verifies


def test_draft_model_prefill_leaves_one_row_for_the_first_draft(tiny_models):
    """prefill(slot, prompt): the draft state covers the prompt, so the first draft feeds only
    the new root, and proposes what a drafter that caught up inside propose does."""
    model = tiny_models["qwen3_draft"]
    prompt, first = [4, 8, 15, 16, 23, 42, 7], 11
    drafter = DraftModelDrafter(model, 2, 64, 4)
    drafter.prefill([(1, prompt)])
    assert drafter.seen[1] == len(prompt)
    rows, forward = [], drafter.forward
    drafter.forward = lambda batch, state, **kw: (rows.append(batch.n_rows), forward(batch, state, **kw))[1]
    got = drafter.propose([DraftLane(1, prompt + [first], 3, 2)])[0]
    assert rows == [1, 1, 1]
    want = DraftModelDrafter(model, 2, 64, 4).propose([DraftLane(1, prompt + [first], 3, 2)])[0]
    np.testing.assert_array_equal(got.ids, want.ids)
    np.testing.assert_array_equal(got.logprobs, want.logprobs)


@pytest.mark.parametrize("name", ["qwen3_draft", "qwen35"])
def test_draft_model_catch_ups_after_plain_steps_share_a_padded_key(tiny_models, name):
    """A lane back from plain decoding catches up on every token since: 5 or 7 tokens feed one
    segment padded to 8 rows (one graph key, replayed on a GPU), and propose what a fresh
    drafter does. One or two rows (a lane that drafted last step) stay unpadded. An
    attention-only draft feeds them as a chain of tree rows (the decode kernels), a hybrid one
    as prompt rows (its recurrent state advances in place)."""
    model = tiny_models[name]
    base = [4, 8, 15, 16, 23, 42, 7, 9]
    drafter = DraftModelDrafter(model, 2, 64, 3)
    keys, forward = [], drafter.forward
    drafter.forward = lambda batch, state, **kw: (keys.append((batch.n_rows, batch.replay_key)),
                                                  forward(batch, state, **kw))[1]
    catch_ups = []
    for slot, extra in ((0, [1, 2, 3, 4, 5]), (1, [5, 4, 3, 2, 1, 6, 7])):
        drafter.propose([DraftLane(slot, base, 2, 2)])
        keys.clear()
        got = drafter.propose([DraftLane(slot, base + extra, 2, 2)])[0]
        assert keys[0][0] == 8 and keys[1][0] == 1, keys
        catch_ups.append(keys[0][1])
        want = DraftModelDrafter(model, 2, 64, 3).propose([DraftLane(slot, base + extra, 2, 2)])[0]
        np.testing.assert_array_equal(got.ids, want.ids)
        np.testing.assert_allclose(got.logprobs, want.logprobs, rtol=1e-5, atol=1e-5)
    kind = SEG_TREE if drafter.state.recurrent is None else SEG_PREFILL
    assert catch_ups[0] == catch_ups[1] and catch_ups[0][0] == ((kind, 8),)


def test_a_long_catch_up_of_an_attention_only_draft_feeds_prompt_rows(tiny_models):
    """Past CHAIN_CATCH_UP tokens (a prompt, a long run of plain steps) the catch-up is prompt
    rows again; a 2-token one is an unpadded chain. Both propose what a fresh drafter does."""
    from luce.spec.drafters.draft_model import CHAIN_CATCH_UP

    model = tiny_models["qwen3_draft"]
    base = [4, 8, 15, 16, 23, 42, 7, 9]
    for extra, want_block in ((list(range(20, 21 + CHAIN_CATCH_UP)), (SEG_PREFILL, 32)), ([3, 5], (SEG_TREE, 2))):
        drafter = DraftModelDrafter(model, 1, 64, 3)
        drafter.propose([DraftLane(0, base, 2, 2)])
        keys, forward = [], drafter.forward
        drafter.forward = lambda batch, state, **kw: (keys.append(batch.replay_key), forward(batch, state, **kw))[1]
        got = drafter.propose([DraftLane(0, base + extra, 2, 2)])[0]
        assert keys[0][0] == (want_block,), keys
        want = DraftModelDrafter(model, 1, 64, 3).propose([DraftLane(0, base + extra, 2, 2)])[0]
        np.testing.assert_array_equal(got.ids, want.ids)
        np.testing.assert_allclose(got.logprobs, want.logprobs, rtol=1e-5, atol=1e-5)


def test_benchmark_drafters_propose_the_truth_first_and_wrong_tokens_after():
    """OracleDrafter: the true token first at each depth, then top_k - 1 other tokens (fewer
    in a tiny vocabulary); past acceptance_length - 1 depths only other tokens. Always-wrong:
    never the true token. A lane that is no known sequence's prefix gets nothing (a miss)."""
    from luce.spec.drafters.bench_drafters import AlwaysWrongDrafter, OracleDrafter

    seqs = [list(range(10, 30)), [10, 11, 12, 99, 98, 97, 96, 95, 94, 93]]
    oracle = OracleDrafter(seqs, 100, acceptance_length=3)
    got = oracle.propose([DraftLane(0, seqs[1][:4], 4, 3)])[0]
    assert got.ids.tolist() == [[98, 99, 0], [97, 98, 99], [97, 98, 99], [96, 97, 98]]   # truth 98 97 | 96 95
    assert got.logprobs[0].tolist() == [0.0, -1.0, -2.0]
    got = OracleDrafter(seqs, 3).propose([DraftLane(0, seqs[0][:12], 2, 4)])[0]   # vocab 3: two others
    assert got.ids.tolist() == [[22, 23 % 3, 24 % 3, -1], [23, 24 % 3, 25 % 3, -1]]
    wrong = AlwaysWrongDrafter(seqs, 100).propose([DraftLane(0, seqs[0][:19], 3, 2)])[0]
    assert wrong.ids.tolist() == [[30, 31]] * 3 and wrong.logprobs[0].tolist() == [-1.0, -2.0]
    assert oracle.propose([DraftLane(0, [10, 11, 50], 3, 2)])[0].depth == 0 and oracle.misses == 1
    assert oracle.depths == [4, 0]


def test_draft_model_mixed_catch_ups_take_each_lanes_last_row(tiny_models):
    """One call, a lane catching up on prompt rows (past CHAIN_CATCH_UP) and lanes on chains of
    tree rows (which go last in the batch, every row reaching the LM head): each lane proposes
    what it does alone."""
    from luce.spec.drafters.draft_model import CHAIN_CATCH_UP

    model = tiny_models["qwen3_draft"]
    seqs = {2: [4, 8, 15, 16, 23], 0: list(range(30, 32 + CHAIN_CATCH_UP)), 1: [7, 9]}
    alone = {s: DraftModelDrafter(model, 3, 64, 3).propose([DraftLane(s, t, 3, 2)])[0] for s, t in seqs.items()}
    drafter = DraftModelDrafter(model, 3, 64, 3)
    kinds, forward = [], drafter.forward
    drafter.forward = lambda batch, state, **kw: (kinds.append(batch.replay_key[0]), forward(batch, state, **kw))[1]
    together = drafter.propose([DraftLane(s, t, 3, 2) for s, t in seqs.items()])
    assert {kind for kind, _ in kinds[0]} == {SEG_PREFILL, SEG_TREE}, kinds[0]
    for prop, s in zip(together, seqs):
        np.testing.assert_array_equal(prop.ids, alone[s].ids)
        np.testing.assert_allclose(prop.logprobs, alone[s].logprobs, rtol=1e-5, atol=1e-5)
