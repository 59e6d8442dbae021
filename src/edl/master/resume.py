"""Where a restarted master goes on from: the trainers' last step, or its checkpoint. Pure.

A master that restarts knows only its newest checkpoint: the queue as of step ``c``
and every member's cursor there. The trainers went on training past ``c`` and
re-register with where they stopped (``ResumeReport``): their generation, its last
step ``s``, every member's cursor at ``s`` and each one's *ledger*, the tasks it took
since ``c`` in the order it consumed them. When every member of that generation
reports the same step, the rows consumed between ``c`` and ``s`` are known exactly
(from each one's cursor at ``c`` to its cursor at ``s`` along its ledger); the
queue is the checkpoint's minus those rows, and the next generation starts at ``s``
from a trainer's replica (``Source.PEER``): nothing is rolled back.

Anything less (a member missing after the window, reports that disagree, a
checkpoint the ledgers do not reach back to, a row the queue does not hold) falls
back to the checkpoint, which is always safe.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from edl.api.data import Cursor
from edl.api.master import ResumeReport, Source, cursors_from_json, cursors_to_json
from edl.master.tasks import TaskQueue

RESUME_WINDOW_S = 2.0  # how long a restarted master waits for the rest of a reporting generation


@dataclass(frozen=True)
class CutRecord:
    """Whose cut a checkpoint is (stored in its ``master.json``): the master and generation that cut it
    at ``step``, and every member's cursor there."""

    master_uid: str
    generation: int
    step: int
    cursors: dict[str, Cursor | None]

    def to_json(self) -> dict:
        return {"master_uid": self.master_uid, "generation": self.generation, "step": self.step,
                "cursors": cursors_to_json(self.cursors)}

    @classmethod
    def from_json(cls, d: dict) -> CutRecord:
        return cls(str(d["master_uid"]), int(d["generation"]), int(d["step"]), cursors_from_json(d["cursors"]))


@dataclass(frozen=True)
class Restored:
    """What the restarted master started from: its checkpoint (``uri`` None: none, a fresh queue)."""

    step: int
    uri: str | None
    cut: CutRecord | None  # None for a fresh start, or a checkpoint written before cuts were recorded
    queue_state: dict  # ``TaskQueue.to_state()`` at ``step``


@dataclass(frozen=True)
class ResumePlan:
    wait: bool  # members of the reported generation have not registered yet: ask again later
    rebuild: bool  # go on from the trainers' step with ``queue_state``; else from the checkpoint
    step: int  # the next generation's base step
    lead: str | None  # with ``rebuild``: rank 0, whose replica is at ``step``
    queue_state: dict | None  # with ``rebuild``: the queue at ``step``
    reported_step: int  # the newest step any trainer reported (what a fallback rolls back from)
    why: str  # with neither: why the checkpoint it is


_LEDGER_START = "ledger-start"  # a member's cursor at the base is where its ledger begins


def _position(report: ResumeReport, cursor: Cursor | None | str) -> tuple[int, int] | None:
    """(index in the ledger, rows consumed of that task) of ``cursor``; None: the ledger does not reach it."""
    if cursor == _LEDGER_START or cursor == report.ledger_start:
        return 0, report.ledger_offset
    if not isinstance(cursor, Cursor):
        return None
    for i, t in enumerate(report.ledger):
        if t.id == cursor.task_id:
            return i, cursor.offset
    return None


def consumed_rows(report: ResumeReport, begin: Cursor | None | str,
                  end: Cursor | None) -> list[tuple[int, str, int, int]] | None:
    """(epoch, shard, start, end) row ranges the reporting trainer consumed from ``begin`` to ``end``
    (its cursors at the checkpoint and at its last step); None when its ledger cannot tell."""
    a, b = _position(report, begin), _position(report, end)
    if a is None or b is None or b < a:
        return None
    out = []
    for i in range(a[0], min(b[0], len(report.ledger) - 1) + 1):
        t = report.ledger[i]
        lo = a[1] if i == a[0] else 0
        hi = b[1] if i == b[0] else t.size
        if not 0 <= lo <= hi <= t.size:
            return None
        if hi > lo:
            out.append((t.epoch, t.shard, t.start + lo, t.start + hi))
    return out


def _fallback(restored: Restored, reported: int, why: str, wait: bool = False) -> ResumePlan:
    return ResumePlan(wait, False, restored.step, None, None, reported, why)


def _begin_cursors(restored: Restored, r: ResumeReport) -> dict[str, Cursor | None | str] | str:
    """Every member's cursor at the checkpoint, or why the ledgers cannot be walked from it."""
    cut = restored.cut
    if cut is not None and (cut.master_uid, cut.generation) == (r.master_uid, r.generation):
        if cut.step > r.step or any(m not in cut.cursors for m in r.members):
            return f"the checkpoint at step {cut.step} does not fit the trainers' step {r.step}"
        return {m: cut.cursors[m] for m in r.members}
    # The generation began from exactly this checkpoint (or from scratch with none): every ledger
    # reaches back to it, unless one was shortened at a later checkpoint that this master did not read.
    started_here = (r.source is Source.CHECKPOINT and r.checkpoint_uri == restored.uri) or (
        r.source is Source.INIT and restored.uri is None)
    if started_here and r.base_step == restored.step:
        return {m: _LEDGER_START for m in r.members}
    return f"the trainers' generation {r.generation} did not start from checkpoint step {restored.step}"


def plan_resume(restored: Restored, reports: Mapping[str, ResumeReport], registered: Collection[str],
                waited_s: float, window_s: float = RESUME_WINDOW_S) -> ResumePlan:
    """Decide where the first generation of a restarted master starts.

    ``reports``: the resume reports of the trainers registered so far (``registered``), ``waited_s``
    since the first of them registered.
    """
    reported = max((r.step for r in reports.values()), default=restored.step)
    if not reports:
        return _fallback(restored, reported, "no trainer reported where it stopped")
    first = next(iter(reports.values()))
    key = (first.master_uid, first.generation, first.step, first.members)
    if any((r.master_uid, r.generation, r.step, r.members) != key for r in reports.values()):
        return _fallback(restored, reported, "the trainers stopped at different steps or generations")
    missing = [m for m in first.members if m not in registered or m not in reports]
    if missing:
        if waited_s < window_s:
            return _fallback(restored, reported, "waiting", wait=True)
        return _fallback(restored, reported, f"trainer {missing[0]} of generation {first.generation} "
                                             f"did not come back within {window_s:.0f} s")
    if any(r.cursors != first.cursors for r in reports.values()):
        return _fallback(restored, reported, "the trainers disagree on the cursors of their last step")
    begin = _begin_cursors(restored, first)
    if isinstance(begin, str):
        return _fallback(restored, reported, begin)
    queue = TaskQueue.from_state(restored.queue_state)
    for m in first.members:
        rows = consumed_rows(reports[m], begin[m], first.cursors.get(m))
        if rows is None:
            return _fallback(restored, reported, f"trainer {m}'s tasks do not reach back to step {restored.step}")
        for epoch, shard, lo, hi in rows:
            if not queue.remove_consumed(epoch, shard, lo, hi):
                return _fallback(restored, reported, f"trainer {m} reports rows of {shard} (epoch {epoch}) "
                                                     "the checkpoint does not hold")
    return ResumePlan(False, True, first.step, first.members[0], queue.to_state(), reported, "")

