"""Whether the state directory takes what the sessions write (``StateHealth``): what ``/readyz``
and the metrics say while a disk is full (docs/persistence.md, "A full disk")."""

from __future__ import annotations

from typing import Protocol

__all__ = ["StateHealth", "StateMetrics"]


class StateMetrics(Protocol):
    """What the state directory reports (``GatewayMetrics``)."""

    def state_dir_error(self, file: str) -> None: ...

    def state_dir_failing(self, sessions: int) -> None: ...

    def history_gap(self, frames: int) -> None: ...


class StateHealth:
    """Which sessions' files cannot be written now (a full disk, an I/O error), and why: what
    ``/readyz`` and the metrics say. A session leaves it when its writes go through again."""

    def __init__(self, metrics: StateMetrics | None = None) -> None:
        self.metrics = metrics
        self.failing: dict[str, str] = {}  # session id -> the error of its last failed write

    def failed(self, key: str, file: str, err: OSError) -> bool:
        """A write of ``file`` (record, log, create) failed; whether ``key`` was fine before."""
        new = key not in self.failing
        self.failing[key] = err.strerror or str(err)
        if self.metrics is not None:
            self.metrics.state_dir_error(file)
            self.metrics.state_dir_failing(len(self.failing))
        return new

    def recovered(self, key: str) -> bool:
        """``key``'s writes go through again (or it is gone); whether it was failing."""
        if self.failing.pop(key, None) is None:
            return False
        if self.metrics is not None:
            self.metrics.state_dir_failing(len(self.failing))
        return True

    def problem(self) -> str | None:
        """Why the state directory is failing now (for ``/readyz``), or None."""
        if not self.failing:
            return None
        errors = sorted(set(self.failing.values()))
        return (
            f"the state directory cannot be written: {'; '.join(errors)} "
            f"({len(self.failing)} session(s) hold what they could not write)"
        )
