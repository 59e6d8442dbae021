"""The training loop's progress, shared with its background threads."""

from __future__ import annotations

from dataclasses import dataclass

from edl.api.data import Cursor


@dataclass
class Progress:
    """Where the training loop is: written by the loop, read by the heartbeat and the prefetch."""

    generation: int = 0  # 0: in none yet
    step: int = 0
    safe_cursor: Cursor | None = None  # our data position at a step every rank has completed
    loss: float | None = None  # the last step's mean training loss
    in_collective_since: float | None = None  # when the loop entered the collective it is in
    store_port: int = 0  # where this trainer's store would listen for a generation it leads next
