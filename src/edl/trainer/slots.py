"""The per-rank slot that rides in every gradient all-reduce.

One slot per rank, zeros in everyone else's: after the SUM every rank knows
every rank's data cursor, sample count, loss sum and flags at this step, and
the prepared generation it is ready to switch into. Integers are split in two
float32 halves (20 bits low) so they stay exact.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from edl.api.data import Cursor

SLOT = 10  # task_hi, task_lo, off_hi, off_lo, count, loss_sum, stop, finished, switch_hi, switch_lo
COUNT, LOSS, STOP, FINISHED, SWITCH = 4, 5, 6, 7, 8
_LOW = 1 << 20


def _split(v: int) -> tuple[float, float]:
    return float(v // _LOW), float(v % _LOW)


def encode_slot(cursor: Cursor | None, count: int, loss_sum: float, stop: bool, finished: bool,
                switch_to: int = 0) -> list[float]:
    tid = 0 if cursor is None else cursor.task_id + 1
    off = 0 if cursor is None else cursor.offset
    return [*_split(tid), *_split(off), float(count), loss_sum, float(stop), float(finished), *_split(switch_to)]


def _join(hi: float, lo: float) -> int:
    return int(round(float(hi) * _LOW + float(lo)))


def decode_cursor(slot: np.ndarray) -> Cursor | None:
    tid = _join(slot[0], slot[1])
    if tid == 0:
        return None
    return Cursor(tid - 1, _join(slot[2], slot[3]))


def own_slots(world: int, rank: int, cursor: Cursor | None, count: int, loss_sum: float, stop: bool,
              finished: bool, switch_to: int = 0) -> np.ndarray:
    """This rank's contribution to the slots' all-reduce: its slot filled, everyone else's zero.
    ``switch_to``: the prepared generation it has the go for and is ready to switch into (0: none)."""
    slots = np.zeros(world * SLOT, dtype=np.float32)
    slots[rank * SLOT : (rank + 1) * SLOT] = encode_slot(cursor, count, loss_sum, stop, finished, switch_to)
    return slots


@dataclass(frozen=True)
class StepSums:
    """What the summed slots of one step say, the same on every rank."""

    cursors: dict[str, Cursor | None]  # every member's data position after the step
    samples: int  # rows trained on, all ranks together (0: nobody had data)
    loss_sum: float  # the loss summed over those rows
    stop: bool  # some rank asked to end the generation at this step
    finished: bool  # every rank is out of data: the job's training is done
    switch_to: int = 0  # every rank is ready to switch into this prepared generation after the step (0: not all)


def decode_sums(summed: np.ndarray, members: tuple[str, ...]) -> StepSums:
    """Read the all-reduced slots of ``members`` (in rank order)."""
    rows = summed.reshape(len(members), SLOT)
    switch = {_join(r[SWITCH], r[SWITCH + 1]) for r in rows}
    return StepSums(
        cursors={m: decode_cursor(rows[i]) for i, m in enumerate(members)},
        samples=int(round(float(rows[:, COUNT].sum()))),
        loss_sum=float(rows[:, LOSS].sum()),
        stop=bool(rows[:, STOP].sum() > 0),
        finished=bool(rows[:, FINISHED].sum() >= len(members)),
        switch_to=switch.pop() if len(switch) == 1 else 0,
    )
