"""Open connections, with limits that idle clients cannot use to lock others out.

At most `max_total` connections are open, and at most `max_per_client` from one address. When a
limit is reached, a new connection takes the place of the oldest idle one (a keep-alive
connection waiting for its next request, nothing of it received), from the same client when
the per-client limit is what was reached; only when none is idle is the newcomer refused (503).
Half-sent request heads are not idle: the head timeout (luce.server.http) closes those.
"""
from __future__ import annotations

import asyncio


class ConnectionTable:
    def __init__(self, max_total: int, max_per_client: int):
        self.max_total = max_total
        self.max_per_client = max_per_client
        self._open: dict[asyncio.Task, object] = {}    # task -> HTTPConnection, oldest first
        self.evicted = 0

    def __len__(self) -> int:
        return len(self._open)

    def tasks(self) -> list[asyncio.Task]:
        return list(self._open)

    def admit(self, task: asyncio.Task, conn) -> str | None:
        """Register `conn`, evicting an idle connection if a limit is reached; returns the
        reason to refuse it instead, or None."""
        same = [t for t, c in self._open.items() if c.client == conn.client]
        if len(same) >= self.max_per_client and not self._evict(same):
            return (f"too many open connections from {conn.client} ({len(same)}, the limit is "
                    f"{self.max_per_client}); reuse or close some and retry")
        if len(self._open) >= self.max_total and not self._evict(list(self._open)):
            return f"too many open connections ({len(self._open)}); retry later"
        self._open[task] = conn
        return None

    def remove(self, task: asyncio.Task) -> None:
        self._open.pop(task, None)

    def _evict(self, candidates: list[asyncio.Task]) -> bool:
        for task in candidates:
            conn = self._open[task]
            if conn.idle and not task.done():
                del self._open[task]
                task.cancel()
                self.evicted += 1
                return True
        return False
