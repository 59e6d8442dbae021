"""The trainer's heartbeat: renews its lease, commits its safe cursor, learns what the master wants.

It runs on its own thread. What it learns (``Control``) is read by the training loop at
step boundaries, and while the loop waits in a collective: an *abort* (a member of the
generation failed, or this trainer was dropped) makes the loop leave the collective at once.
Where the loop is (``Progress``) is written by the loop and read here; the master hears from
it how long the loop has waited in its collective, which is how it finds who holds the
others up.
It is also the loop's watchdog: a trainer stuck in a collective that can no longer
complete (a peer vanished mid-rendezvous) exits, and the launcher replaces it; a trainer
whose master has not answered for ``master_lost_s`` (longer than a master restart) ends
itself, so that a job whose launcher and master are gone leaves no trainer behind.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

from edl.api.master import HeartbeatAnswer, JobStatus, Prepared, TrainerLink, TrainerState
from edl.errors import EdlError
from edl.trainer.progress import Progress

log = logging.getLogger("edl.trainer")

COLLECTIVE_HANG_S = 15.0  # stuck this long while the master has moved on: give up
COLLECTIVE_DEADLINE_S = 300.0  # stuck this long: give up (``EDL_COLLECTIVE_DEADLINE_S``)
MASTER_LOST_S = 60.0  # the master unreachable this long: longer than it takes to restart one


def master_lost_after_s(launcher_timeout_s: float) -> float:
    """How long a trainer waits for an unreachable master: past a restart, and past the job's dead-man
    switch twice over (a master that ends the job tells its trainers first; this is for one that could not)."""
    return max(MASTER_LOST_S, 2 * launcher_timeout_s)


def master_lost(last_answer: float, now: float, limit_s: float) -> bool:
    """The master has not answered since ``last_answer`` for longer than ``limit_s``: give up on it."""
    return now - last_answer > limit_s


class Control:
    """What the heartbeat learned from the master, read by the loop at step boundaries. Thread-safe."""

    def __init__(self, master_uid: str | None = None) -> None:
        self._lock = threading.Lock()
        self._reset(master_uid)

    def _reset(self, master_uid: str | None) -> None:
        self._master_uid = master_uid
        self._stop_generation = -1  # stop at the next boundary if in this generation
        self._master_changed = False
        self._job_done = False
        self._checkpoint_now = False  # rank 0 takes a checkpoint at the next step
        self._abort_through = -1  # leave the collective of any generation up to this one
        self._dropped = False  # the master dropped us (we were silent or stuck): leave
        self._prepared: Prepared | None = None  # the next generation the master prepared for us
        self._generation = 0  # the master's current generation

    @property
    def master_uid(self) -> str | None:
        with self._lock:
            return self._master_uid

    def reset(self, master_uid: str) -> None:
        """Forget everything: we registered with ``master_uid`` (afresh, after it restarted)."""
        with self._lock:
            self._reset(master_uid)

    def learn(self, answer: HeartbeatAnswer) -> None:
        with self._lock:
            if self._master_uid is not None and answer.master_uid != self._master_uid:
                # Another master answered. One that does not know us is ours, restarted: stop and join
                # it afresh. One that knows us is a stale master still running beside the one we joined
                # (a lost node's processes live on until the run lock fences them; a kept-alive
                # connection still reaches them): nothing it says is ours.
                if not answer.known:
                    self._master_changed = True
                return
            if answer.stop:
                self._stop_generation = answer.generation
            if answer.abort:
                self._abort_through = max(self._abort_through, answer.abort_through)
            self._prepared, self._generation = answer.prepared, answer.generation
            if answer.state is TrainerState.FAILED:
                self._dropped = True
            if answer.job_status is not JobStatus.RUNNING or answer.abandoned:
                self._job_done = True
            self._checkpoint_now = answer.checkpoint

    def leave(self, generation: int) -> None:
        """Leave ``generation``'s collective (and any before it) now, whatever the master says."""
        with self._lock:
            self._abort_through = max(self._abort_through, generation)

    def stops(self, generation: int) -> bool:
        """End ``generation`` at this step: the master asked, it restarted, or the job is over."""
        with self._lock:
            return self._stop_generation == generation or self._master_changed or self._job_done

    def aborts(self, generation: int) -> bool:
        """Leave ``generation``'s collective now: a member failed (it cannot complete), or we were dropped."""
        with self._lock:
            return generation <= self._abort_through

    @property
    def prepared(self) -> Prepared | None:
        with self._lock:
            return self._prepared

    def heard(self) -> tuple[int, bool]:
        """The prepared generation last heard of (0: none), and whether it had the go."""
        with self._lock:
            p = self._prepared
            return (0, False) if p is None else (p.generation, p.go)

    def go(self, generation: int) -> bool:
        """The master gave the go for the prepared ``generation``, or already formed it (the others switched
        and reported between two of our heartbeats)."""
        with self._lock:
            p = self._prepared
            return (p is not None and p.generation == generation and p.go) or self._generation == generation

    def prepared_dropped(self, generation: int) -> bool:
        """The master no longer prepares ``generation`` (nor formed it)."""
        with self._lock:
            return ((self._prepared is None or self._prepared.generation != generation)
                    and self._generation != generation)

    def superseded(self, generation: int) -> bool:
        """The master prepared or formed a later generation than ``generation``: it will never form that one.
        Unlike ``prepared_dropped`` this needs no earlier answer naming ``generation`` (a joiner's assignment
        can come before its heartbeat hears of it, and the drop before its next heartbeat)."""
        with self._lock:
            if self._generation == generation:
                return False  # formed: a later one prepared now is the next change, not this one's drop
            return (self._prepared is not None and self._prepared.generation > generation) or self._generation > generation

    @property
    def dropped(self) -> bool:
        with self._lock:
            return self._dropped

    @property
    def master_changed(self) -> bool:
        """Our master restarted (a heartbeat was answered by another): it knows nothing of what we were
        told, our place in a generation included."""
        with self._lock:
            return self._master_changed

    @property
    def checkpoint_requested(self) -> bool:
        with self._lock:
            return self._checkpoint_now

    def take_checkpoint_request(self) -> None:
        with self._lock:
            self._checkpoint_now = False


def stuck_in_collective(stuck_s: float, generation: int, masters_generation: int, hang_s: float,
                        deadline_s: float) -> bool:
    """Give up on a collective: stuck past the deadline, or past ``hang_s`` while the master moved on."""
    return stuck_s > deadline_s or (stuck_s > hang_s and masters_generation != generation)


class Heartbeat:
    """One heartbeat after another (each waits up to 1 s on the master for a reason to stop)."""

    def __init__(self, link: TrainerLink, trainer_id: str, progress: Progress, control: Control, *,
                 on_stuck: Callable[[], None], deadline_s: float = COLLECTIVE_DEADLINE_S,
                 hang_s: float = COLLECTIVE_HANG_S, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep, on_master_lost: Callable[[], None] | None = None,
                 master_lost_s: float = MASTER_LOST_S,
                 on_answer: Callable[[HeartbeatAnswer], None] = lambda answer: None) -> None:
        self.link = link
        self.id = trainer_id
        self.progress = progress
        self.control = control
        self.on_stuck = on_stuck  # exits the process: the launcher replaces it
        self.deadline_s = deadline_s
        self.hang_s = hang_s
        self.clock = clock
        self.sleep = sleep
        self.on_master_lost = on_master_lost or on_stuck  # exits the process
        self.master_lost_s = master_lost_s
        self.on_answer = on_answer  # what else the loop keeps from each answer (its task ledger's trim)
        self.last_answer = clock()  # the master's last answer (or the start)

    def run(self, alive: Callable[[], bool]) -> None:
        while alive():
            self.beat()

    def beat(self) -> None:
        p = self.progress
        since = p.in_collective_since
        try:
            r = self.link.heartbeat(self.id, generation=p.generation, step=p.step, safe_cursor=p.safe_cursor,
                                    loss=p.loss, wait_s=1.0,
                                    in_collective_s=None if since is None else max(0.0, self.clock() - since),
                                    store_port=p.store_port, heard=self.control.heard())
        except EdlError:
            if master_lost(self.last_answer, self.clock(), self.master_lost_s):
                log.error("master unreachable for %.0f s: trainer %s ending itself", self.master_lost_s, self.id)
                self.on_master_lost()
                return
            self.sleep(0.2)  # the master is away: try again shortly
            return
        self.last_answer = self.clock()
        since = p.in_collective_since
        stuck = self.clock() - since if since is not None else 0.0
        if r.abort and r.master_uid == self.control.master_uid:
            # The loop leaves its collective on this answer (a woken trainer the master dropped
            # among them: it is told so and leaves), so the watchdog has nothing to do.
            self.control.learn(r)
            return
        if stuck > self.hang_s and not r.known and r.master_uid != self.control.master_uid:
            # Our master restarted (its node lost, say) while we waited on a collective that cannot end
            # (a peer went with it): leave the collective and join the new master, not the process.
            log.warning("trainer %s: master restarted while stuck in generation %d for %.0f s; leaving it",
                        self.id, p.generation, stuck)
            self.control.leave(p.generation)
            self.control.learn(r)
            return
        if stuck_in_collective(stuck, p.generation, r.generation, self.hang_s, self.deadline_s):
            log.error("trainer %s stuck in generation %d for %.0f s; exiting", self.id, p.generation, stuck)
            self.on_stuck()
            return
        self.control.learn(r)
        self.on_answer(r)
        if not r.known:
            self.sleep(0.1)
