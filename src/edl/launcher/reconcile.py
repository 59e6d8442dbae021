"""What the launcher does about its trainers, decided as a pure function of what it sees.

Input: the master's desired count, whether the job's data is all consumed, the
trainer pods the cluster reports, which of them are being drained (since when)
and the clock. Output: a ``Plan`` of effects. The launcher applies it; applying
it twice does no harm (creates use fresh names only for the missing count,
deletes are idempotent).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Collection, Mapping, Sequence

from edl.api.cluster import PodPhase
from edl.api.cluster import TrainerExit, TrainerPod
from edl.api.master import trainer_number
from edl.api.policy import leaving

RELAUNCH = (TrainerExit.PREEMPTED, TrainerExit.NODE_LOST)


@dataclass(frozen=True)
class Plan:
    create: int = 0  # new trainers to start
    drain: tuple[str, ...] = ()  # ask the master to drain these (then they exit 0)
    delete: tuple[str, ...] = ()  # remove these pods now
    unschedulable: tuple[str, ...] = ()  # pending too long: removed and reported
    relaunched: tuple[str, ...] = ()  # ended by the cluster (preempted, node lost): replaced, not a failure
    failures: tuple[tuple[str, str], ...] = ()  # (name, message) that count towards the limit
    fatal: tuple[TrainerExit, str] | None = None  # the job must fail: why, and the message
    exited: tuple[tuple[str, int], ...] = field(default=())  # (name, code) to report to the master


def _code(t: TrainerPod) -> int:
    return 0 if t.exit is TrainerExit.SUCCEEDED else 1


def plan_trainers(desired: int, trainers: list[TrainerPod], draining: Mapping[str, float], now: float,
                  pending_timeout_s: float, drain_timeout_s: float = 60.0, data_done: bool = False,
                  node_hints: Sequence[str] = (), held: Collection[str] = (), replacing: Collection[str] = ()) -> Plan:
    """``data_done``: every epoch's data is consumed (the job is finishing: rank 0 writes the last
    checkpoint and the model while its peers exit 0): nothing is started any more, unless no
    trainer is left to finish. ``held``: trainers told to stop whose replacements wait for the sidecar's
    next decision (``JobView.held_replacements``): the places of those whose pods are gone are not filled
    yet (one still there counts as live until it has gone). ``node_hints``: the sidecar's plan, one node per trainer it keeps or
    adds (``JobView.node_hints``); on a shrink the trainers on nodes it does not keep go first. ``replacing``:
    trainers told to stop at the job's minimum (``JobView.replacing``): they stay until their replacements
    have joined, and are counted out of the job, so those are started now and never drained as excess."""
    delete: list[str] = []
    left_unasked = False  # a trainer exited 0 without being drained
    relaunched: list[str] = []
    failures: list[tuple[str, str]] = []
    exited: list[tuple[str, int]] = []
    fatal: tuple[TrainerExit, str] | None = None
    live: list[TrainerPod] = []
    unschedulable: list[str] = []
    for t in trainers:
        if t.phase.terminated:
            delete.append(t.name)
            exited.append((t.name, _code(t)))
            if t.exit is TrainerExit.SUCCEEDED or t.name in draining:
                left_unasked |= t.name not in draining and t.name not in replacing
                continue  # drained or finished: its exit is expected whatever the code
            if t.exit in RELAUNCH:
                relaunched.append(t.name)
            elif t.exit in (TrainerExit.OOM_KILLED, TrainerExit.USER_ERROR):
                fatal = fatal or (t.exit, t.message or f"trainer {t.name} ended: {t.exit.value}")
            else:
                failures.append((t.name, t.message or f"trainer {t.name} failed"))
        elif t.exit is TrainerExit.CANNOT_START:
            fatal = fatal or (t.exit, t.message or f"trainer {t.name} cannot start")
        elif t.name in draining:
            if now - draining[t.name] > drain_timeout_s:
                delete.append(t.name)  # it did not leave on its own: remove it
        elif t.phase is PodPhase.PENDING and t.node is None and now - t.created_at > pending_timeout_s:
            unschedulable.append(t.name)
        elif t.name in replacing:
            pass  # leaving once its replacement has joined
        else:
            live.append(t)
    # A trainer that left on its own says the job is ending (or its master went away): its place
    # is filled only once a status read after its exit still asks for it (the next round), so the
    # last second of a job starts no fresh trainers.
    # Once the data is all consumed nothing is started while a trainer is still there to finish (rank 0
    # writes the last checkpoint and the model); if none is (the finishing one failed or was evicted),
    # one is, or the job would wait for a finish that nobody does.
    live_names = {t.name for t in live}
    waiting = sum(1 for name in held if name not in live_names)
    want = max(0, desired - len(live) - len(unschedulable) - waiting)
    create = 0 if left_unasked else (min(1, want) if not live else 0) if data_done else want
    drain: list[str] = []
    if len(live) > desired:
        # Those the plan does not keep go first (the policy chose which nodes to empty: the room a
        # higher-priority pod or a better packing needs); else, and among them, pods not yet running
        # (nothing to drain), then the youngest: it holds the least warmed-up state (the highest number
        # among those first seen at once: an adopted job's).
        excess = sorted(live, key=lambda t: (t.phase is PodPhase.RUNNING, -t.created_at, -trainer_number(t.name),
                                             t.name))
        by_name = {t.name: t for t in live}
        for name in leaving(len(live) - desired, node_hints, [(t.name, t.node) for t in excess]):
            (drain if by_name[name].phase is PodPhase.RUNNING else delete).append(name)
    return Plan(create=create, drain=tuple(drain), delete=tuple(delete + unschedulable),
                unschedulable=tuple(unschedulable), relaunched=tuple(relaunched), failures=tuple(failures),
                fatal=fatal, exited=tuple(exited))
