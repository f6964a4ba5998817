"""Fault injection for engine tests: a hook that raises at chosen points of chosen steps, and
digests of every domain a step may touch (what "nothing changed" is checked against)."""
from __future__ import annotations

import hashlib

import numpy as np

POINTS = ("before_forward", "after_forward", "after_accept")   # every hook point before commit


class FaultInjector:
    """Installs itself as engine.fault_hook. Set `step_no` before each engine.step(); the
    steps in fault_steps raise at `point`."""

    def __init__(self, engine, fault_steps=(), point: str = "after_forward"):
        self.fault_steps = set(fault_steps)
        self.point = point
        self.step_no = 0
        self.cohort: set = set()       # request ids of the step that ran last
        self.fired: list = []          # (step_no, durable) of every fault raised
        engine.fault_hook = self

    def __call__(self, point, step):
        if point == "before_forward":
            self.cohort = {item.request_id for item in step.cohort.items}
        if point == self.point and self.step_no in self.fault_steps:
            # durable: the forward ran and wrote prefill / AR rows' state before the fault
            self.fired.append((self.step_no, step.durable and point != "before_forward"))
            raise RuntimeError(f"injected fault at step {self.step_no}")


def _hash(h, x) -> None:
    h.update(np.ascontiguousarray(np.asarray(x)).tobytes())


def domain_digests(engine) -> dict[str, str]:
    """Digest of each domain: bookkeeping (pages, slots, state owners and recurrent arrays),
    the committed KV rows of every live slot in every attention layer, and the drafter's
    committed context (DFlash: its feature count and draft KV rows per slot)."""
    to_host = getattr(engine.model.backend, "to_numpy", np.asarray)
    kv = hashlib.sha256()
    for slot, entry in enumerate(engine.slots.table):
        if entry is None:
            continue
        pages = np.asarray(engine.pool.slot_pages(slot), np.int64)
        for il in sorted(engine.model_state.kv):
            layer = engine.model_state.kv[il]
            for pool in ((layer.k, layer.v) if hasattr(layer, "k") else (layer.tokens,)):   # fake models: tokens
                pool = to_host(pool)
                _hash(kv, pool[pages].reshape(-1, *pool.shape[2:])[:entry.kv_len])
    ctx = hashlib.sha256()
    drafter = getattr(getattr(engine.spec, "speculator", None), "drafter", None)
    while drafter is not None:
        if hasattr(drafter, "n_context"):
            ctx.update(repr(drafter.n_context).encode())
            for slot, n in enumerate(drafter.n_context):
                pages = np.asarray(drafter.pages(slot), np.int64)
                for il in sorted(drafter.state.kv):
                    k = to_host(drafter.state.kv[il].k)
                    _hash(ctx, k[pages].reshape(-1, *k.shape[2:])[:n])
        drafter = getattr(drafter, "inner", None)
    return {"pages": engine.pool.digest(), "slots": engine.slots.digest(), "states": engine.states.digest(),
            "kv": kv.hexdigest(), "draft context": ctx.hexdigest()}
