"""Peak memory figures of a benchmark run (host and device)."""
from __future__ import annotations

import resource


def peak_memory(backend) -> dict:
    """Peak memory figures: `backend.memory_stats()` when the backend has it; else a caching
    allocator's `peak_reserved_bytes` and, on a GPU backend, the device's
    used memory (its runtime's mem_get_info); always the host's peak RSS."""
    out: dict = {"host_peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
    stats = getattr(backend, "memory_stats", None)
    if callable(stats):
        out.update(dict(stats()))
        return out
    reserved = getattr(getattr(backend, "allocator", None), "peak_reserved_bytes", None)
    if reserved is not None:
        out["device_reserved_bytes"] = int(reserved)
    runtime = getattr(backend, "runtime", None)
    if runtime is not None:
        try:
            free, total = runtime.mem_get_info()
            out["device_used_bytes"] = total - free
        except Exception:  # noqa: BLE001 - the figure is optional
            pass
    return out
