"""The per-rank slot that rides in every gradient all-reduce.

One slot per rank, zeros in everyone else's: after the SUM every rank knows
every rank's data cursor, sample count, loss sum and flags at this step.
Integers are split in two float32 halves (20 bits low) so they stay exact.
"""

from __future__ import annotations

import numpy as np

from edl.api.data import Cursor

SLOT = 8  # task_hi, task_lo, off_hi, off_lo, count, loss_sum, stop, finished
COUNT, LOSS, STOP, FINISHED = 4, 5, 6, 7
_LOW = 1 << 20


def _split(v: int) -> tuple[float, float]:
    return float(v // _LOW), float(v % _LOW)


def encode_slot(cursor: Cursor | None, count: int, loss_sum: float, stop: bool, finished: bool) -> list[float]:
    tid = 0 if cursor is None else cursor.task_id + 1
    off = 0 if cursor is None else cursor.offset
    return [*_split(tid), *_split(off), float(count), loss_sum, float(stop), float(finished)]


def decode_cursor(slot: np.ndarray) -> Cursor | None:
    tid = int(round(float(slot[0]) * _LOW + float(slot[1])))
    if tid == 0:
        return None
    return Cursor(tid - 1, int(round(float(slot[2]) * _LOW + float(slot[3]))))
