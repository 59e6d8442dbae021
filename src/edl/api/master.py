"""The master's API as its clients see it."""

from __future__ import annotations

from typing import Protocol


class MasterLink(Protocol):
    def status(self) -> dict | None:
        """The master's /v1/status, or ``None`` while it cannot be reached."""
        ...

    def scale(self, trainers: int) -> None: ...
