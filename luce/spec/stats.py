"""Speculation statistics, per request and per engine (issue 5 item 7)."""
from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass
class SpecStats:
    verifies: int = 0        # tree verifies (one per speculating lane per step)
    drafted: int = 0         # drafted tokens verified (tree nodes besides the root)
    accepted: int = 0        # drafted tokens accepted
    emitted: int = 0         # tokens committed by verifies (accepted drafts + bonus tokens)
    verify_rows: int = 0     # tree rows run, roots included
    verify_steps: int = 0    # steps that carried at least one tree (engine level)

    def record(self, n_rows: int, n_accepted: int, n_emitted: int) -> None:
        """One verified tree of n_rows rows that emitted n_emitted tokens."""
        self.verifies += 1
        self.drafted += n_rows - 1
        self.accepted += n_accepted
        self.emitted += n_emitted
        self.verify_rows += n_rows

    @property
    def acceptance_length(self) -> float:
        """Tokens committed per verify (1.0 = no draft ever accepted)."""
        return self.emitted / self.verifies if self.verifies else 0.0

    @property
    def acceptance_rate(self) -> float:
        """Share of drafted tokens accepted."""
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def rows_per_step(self) -> float:
        """Tree rows per step that verified trees."""
        return self.verify_rows / self.verify_steps if self.verify_steps else 0.0

    def as_dict(self) -> dict:
        return {**asdict(self), "acceptance_length": self.acceptance_length,
                "acceptance_rate": self.acceptance_rate, "rows_per_step": self.rows_per_step}
