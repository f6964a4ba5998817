"""Engine: scheduler, slots, pages, recurrent states, transactions, step builder.

    from luce.engine import Engine, EngineConfig, SamplingParams
"""
from luce.engine.engine import Engine, EngineConfig, EngineStats, StepUpdate
from luce.engine.pages import PagePool, PoolExhausted
from luce.engine.request import FinishReason, Request, RequestOutput
from luce.engine.sampler import SamplingError, SamplingParams
from luce.engine.scheduler import Scheduler
from luce.engine.slots import AdmissionError, QueueFull, SlotManager
from luce.engine.state_slots import SnapshotTableFull, StateSlots
from luce.engine.step import Cohort, DecodeRow, PrefillChunk, StepBatch, StepBuilder, TreeChunk, bucket
from luce.engine.txn import Plan, Reject, StalePlan, Transaction

__all__ = [
    "Engine", "EngineConfig", "EngineStats", "StepUpdate", "PagePool", "PoolExhausted", "FinishReason", "Request",
    "RequestOutput", "SamplingError", "SamplingParams", "Scheduler", "AdmissionError", "QueueFull",
    "SlotManager", "SnapshotTableFull", "StateSlots", "Cohort", "DecodeRow", "PrefillChunk", "StepBatch",
    "StepBuilder", "TreeChunk", "bucket", "Plan", "Reject", "StalePlan", "Transaction",
]
