"""Engine: scheduler, slots, pages, recurrent state owners, transactions, step builder.

    from luce.engine import Engine, EngineConfig, SamplingParams
"""
from luce.engine.engine import Engine, EngineConfig, EngineStats, StepUpdate
from luce.engine.output_stream import OutputStream
from luce.engine.pages import PagePool, PoolExhausted
from luce.engine.request import FinishReason, Request, RequestOutput
from luce.engine.sampler import SamplingError, SamplingParams
from luce.engine.scheduler import Scheduler
from luce.engine.slots import AdmissionError, QueueFull, SlotManager
from luce.engine.state_slots import StateSlots
from luce.engine.step import Cohort, DecodeRow, PrefillChunk, StepBatch, StepBuilder, TreeChunk
from luce.engine.txn import Plan, Reject, StalePlan, StepOutcome, Transaction

__all__ = [
    "Engine", "EngineConfig", "EngineStats", "StepUpdate", "OutputStream", "PagePool", "PoolExhausted",
    "FinishReason", "Request", "RequestOutput", "SamplingError", "SamplingParams", "Scheduler", "AdmissionError",
    "QueueFull", "SlotManager", "StateSlots", "Cohort", "DecodeRow", "PrefillChunk", "StepBatch", "StepBuilder",
    "TreeChunk", "Plan", "Reject", "StalePlan", "StepOutcome", "Transaction",
]
