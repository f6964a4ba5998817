"""A fault injector for engine tests: records each step's cohort and raises after the
forward pass of chosen steps (the engine must then retire exactly that cohort)."""
from __future__ import annotations


class FaultInjector:
    """Installs itself as engine.fault_hook. Set `step_no` before each engine.step()."""

    def __init__(self, engine, fault_steps=()):
        self.fault_steps = set(fault_steps)
        self.step_no = 0
        self.cohort: set = set()       # request ids of the step that ran last
        engine.fault_hook = self

    def __call__(self, point, step):
        if point == "before_forward":
            self.cohort = {item.request_id for item in step.cohort.items}
        if point == "after_forward" and self.step_no in self.fault_steps:
            raise RuntimeError(f"injected fault at step {self.step_no}")
