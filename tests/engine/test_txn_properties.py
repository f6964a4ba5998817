"""Transactions under random admit / prefill / decode / speculate / cancel / retire
sequences (hypothesis stateful testing, 200 sequences).

After every operation: free + used == total pages, refcounts >= 0 and equal to owners, no page
owned by two slots, free slots own no pages or state. Every preflight leaves pool, slot table
and states byte-identical (digests), whether it plans or rejects. A step dropped before commit
leaves them byte-identical too (a tree step wrote only scratch; a prefill / AR step is rolled
back to the checkpoint taken before its forward). Every committed
step read only pages and state its slots own (checked twice: by the pages a segment lists,
and by the fake model comparing each slot's pages with its state). Speculation is a stub:
tree rows get scratch pages, commit keeps an accepted root path of the tree.
"""
import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from luce.engine.pages import PagePool, PoolExhausted
from luce.engine.slots import AdmissionError, QueueFull, SlotManager
from luce.engine.state_slots import StateSlots
from luce.engine.step import Cohort, DecodeRow, PrefillChunk, StepBuilder, TreeChunk
from luce.engine.txn import Plan, Reject, StepOutcome, Transaction
from luce.models.kv_cache import PAGE_SIZE, pages_needed
from tests.engine.fake_model import FakeModel

N_PAGES, MAX_SLOTS, CTX = 24, 4, 160


class TxnMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.model = FakeModel(check_alignment=False)   # the scheduler aligns, not the txn
        self.state = self.model.new_state(N_PAGES, MAX_SLOTS)
        self.pool = PagePool(N_PAGES)
        self.states = StateSlots(self.state)
        self.slots = SlotManager(self.pool, self.states, max_queue=3)
        self.txn = Transaction(self.slots, CTX)
        self.builder = StepBuilder(self.pool)
        self.next_id = 0
        self.steps_committed = 0

    def digests(self):
        return self.pool.digest(), self.slots.digest(), self.states.digest()

    def live(self):
        return self.slots.live_slots()

    # ---- admission and release --------------------------------------------------------------
    @initialize()
    def two_running_requests(self):
        for _ in range(2):
            self.submit(reserve=4)
            self.admit()

    @rule(reserve=st.integers(1, N_PAGES + 2))
    def submit(self, reserve):
        before = self.digests()
        try:
            self.slots.submit(f"r{self.next_id}", reserve)
            self.next_id += 1
        except (AdmissionError, QueueFull):
            assert self.digests() == before

    @rule()
    def admit(self):
        got = self.slots.admit_next()
        if got is not None:
            rid, slot = got
            assert self.states.owns(slot, rid) and len(self.state.recurrent.seq[slot]) == 0

    @rule(data=st.data())
    def cancel_or_retire(self, data):
        ids = [e.request_id for e in self.slots.table if e] + [rid for rid, _ in self.slots.queue]
        rid = data.draw(st.sampled_from(ids + ["nobody"]))
        if rid in [e.request_id for e in self.slots.table if e] and data.draw(st.booleans()):
            slot = self.slots.slot_of(rid)
            self.slots.retire(slot)
            assert not self.pool.slot_pages(slot) and self.states.owner[slot] is None
            return
        where = self.slots.cancel(rid)
        assert where == "unknown" if rid == "nobody" else where in ("queued", "live")
        assert self.slots.slot_of(rid) is None and not self.slots.is_queued(rid)

    # ---- steps -----------------------------------------------------------------------------
    @precondition(lambda self: self.live())
    @rule(data=st.data(), corrupt=st.sampled_from([None] * 6 + ["start", "owner", "twice", "stale"]),
          commit=st.booleans())
    def step(self, data, corrupt, commit):
        cohort = Cohort()
        for slot in self.live():
            e = self.slots.table[slot]
            kind = data.draw(st.sampled_from(["skip", "prefill", "decode", "tree"]))
            if kind == "prefill":
                n = data.draw(st.integers(1, 40))
                cohort.prefill.append(PrefillChunk(slot, e.request_id, tuple(range(n)), e.kv_len, True))
            elif kind == "decode":
                cohort.decode.append(DecodeRow(slot, e.request_id, 7, e.kv_len))
            elif kind == "tree":
                n = data.draw(st.integers(1, 9))
                parents = (-1,) + tuple(data.draw(st.integers(0, i - 1)) for i in range(1, n))
                cohort.tree.append(TreeChunk(slot, e.request_id, tuple(range(n)), parents, e.kv_len))
        if cohort.tree:   # the fake model does not run tree rows: a tree step holds only trees
            cohort = Cohort(tree=cohort.tree)
        if not cohort:
            return
        if corrupt == "start":
            c = cohort.items[0]
            bad = type(c)(**{**c.__dict__, **({"position": c.position + 1} if isinstance(c, DecodeRow)
                                              else {"start": c.start + 1})})
            cohort = Cohort([bad] if isinstance(bad, PrefillChunk) else [],
                            [bad] if isinstance(bad, DecodeRow) else [], [bad] if isinstance(bad, TreeChunk) else [])
        elif corrupt == "owner":
            c = cohort.items[0]
            cohort = Cohort([PrefillChunk(c.slot, "intruder", (1,), self.slots.table[c.slot].kv_len, True)])
        before = self.digests()
        try:
            step = self.builder.build(cohort)
        except PoolExhausted:
            assert self.digests() == before
            return
        if corrupt == "twice":
            first = step.cohort.items[0]
            lists = [step.cohort.prefill, step.cohort.decode, step.cohort.tree]
            step.cohort = Cohort(*[lst + [first] if first in lst else lst for lst in lists])
        stolen = None
        planned = [p for pages in step.new_pages.values() for p in pages]
        if corrupt == "stale" and planned:
            stolen = planned[0]
            self.pool.take(-5, [stolen])            # someone took a planned page meanwhile
        before = self.digests()
        plan = self.txn.preflight(step)
        assert self.digests() == before, "preflight changed something"
        if stolen is not None:
            self.pool.release(-5)
        if corrupt in ("start", "owner", "twice") or stolen is not None:
            assert isinstance(plan, Reject), corrupt
        if isinstance(plan, Reject):
            assert plan.reason
            return
        assert isinstance(plan, Plan)
        self.run_and_finish(step, plan, commit, data)

    @precondition(lambda self: self.live())
    @rule(data=st.data(), commit=st.booleans())
    def plain_step(self, data, commit):
        """Steps weigh more than the other rules: a second rule for an uncorrupted step."""
        self.step(data, None, commit)

    def run_and_finish(self, step, plan, commit, data):
        before = self.digests()
        if not step.cohort.tree:
            self.state.checkpoint(step.durable_slots)             # the engine's, before a durable forward
            self.model.forward(step.forward, self.state)        # writes KV rows and state
            assert not self.model.violations, self.model.violations
        if not commit:   # the step failed before its commit
            if not step.cohort.tree:   # prefill / AR rows advanced state in place: rolled back
                self.state.rollback()
            assert self.digests() == before                       # tree rows wrote scratch only
            return
        paths, kept_tokens, pages_before = {}, {}, {}
        for t in step.cohort.tree:   # stub of acceptance: a root path to the deepest node, cut
            assert step.kv_len_after[t.slot] == t.start + len(t.token_ids)
            d = t.depths()
            node, path = int(np.argmax(d)), []
            while node >= 0:
                path.append(node)
                node = t.parents[node]
            path = path[::-1][:data.draw(st.integers(1, len(path)))]
            paths[t.slot] = tuple(path)
            kept_tokens[t.slot] = [t.token_ids[n] for n in path]
            pages_before[t.slot] = len(self.pool.slot_pages(t.slot))
        self.txn.commit(plan, StepOutcome(output=None, paths=paths))
        self.steps_committed += 1
        for t in step.cohort.tree:
            kept = np.asarray(kept_tokens[t.slot], np.int64)
            pages = self.pool.slot_pages(t.slot)
            for j, tok in enumerate(kept):
                pos = t.start + j
                self.state.kv[0].tokens[pages[pos // PAGE_SIZE], pos % PAGE_SIZE] = tok
            self.state.recurrent.seq[t.slot] = np.concatenate([self.state.recurrent.seq[t.slot], kept])
        f = step.forward
        for s in range(f.n_segments):                            # nobody read what it does not own
            slot = int(f.seq_slots[s])
            if slot >= 0:
                owned = set(self.pool.slot_pages(slot)) | set(step.new_pages.get(slot, ()) if slot in paths else ())
                assert set(f.segment_pages(s).tolist()) <= owned
                assert self.states.owns(slot, self.slots.table[slot].request_id)
        for t in step.cohort.tree:   # a tree keeps only the pages its accepted rows need
            length = t.start + len(paths[t.slot])
            assert self.slots.table[t.slot].kv_len == length
            assert len(self.pool.slot_pages(t.slot)) == max(pages_before[t.slot], pages_needed(length))
            unkept = set(step.new_pages[t.slot]) - set(self.pool.slot_pages(t.slot))
            assert all(self.pool.is_free(p) for p in unkept), "pages of rejected tree rows outlived the step"

    # ---- invariants ------------------------------------------------------------------------
    @invariant()
    def bookkeeping_is_consistent(self):
        self.pool.check()
        self.slots.check()
        assert self.pool.n_free + self.pool.n_used == N_PAGES
        assert (self.pool.refcount >= 0).all()
        for slot in self.live():
            assert len(self.state.recurrent.seq[slot]) == self.slots.table[slot].kv_len


TestTxnMachine = TxnMachine.TestCase
TestTxnMachine.settings = settings(max_examples=200, stateful_step_count=40, deadline=None,
                                   suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
