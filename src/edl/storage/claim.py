"""One job per checkpoint prefix, one live run per job.

Two small objects beside the checkpoints:

    edl-owner.json   the job that owns the prefix: its name and the fingerprint of the spec fields
                     a resume depends on (written once, by the first run's master)
    edl-lock.json    the run writing there now: a holder id (a hash of the job token, so a master
                     restarted within the same run holds it again), its pid and pid namespace; the
                     master rewrites it every few seconds while it lives

Both are written with conditional puts (``ObjectStore.put_if``: S3 ``If-None-Match``/``If-Match``,
an atomic compare-and-swap for files), so two runs racing for one prefix cannot both win. The
decisions (``owner_problem``, ``lock_verdict``) are pure; ``PrefixClaim`` does the I/O.

Staleness is judged on the reader's own monotonic clock, never by comparing clocks of two machines:
as Kubernetes' leader election does, a lock is stale once its reader has watched it stay unchanged
(the same version) for its TTL; a lock seen to change meanwhile belongs to a live run.

A master restarted within its run takes the lock at once, but may still have a predecessor
alive (a lost node's processes run on until fenced). Its write fences that one: the predecessor's
next renewal fails and it stops. So the successor serves only ``FENCE_S`` after taking the lock
(``fence_s``, pure; ``PrefixClaim.wait_fenced``), unless the predecessor is known gone: its pid
gone on this machine, or the same pod (a container restarted in place: the old one has stopped).
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from edl.api.spec import JobSpec
from edl.errors import StorageError, UserError
from edl.procs import ended
from edl.storage.store import ObjectStore

log = logging.getLogger("edl.storage")

OWNER_KEY = "edl-owner.json"
LOCK_KEY = "edl-lock.json"
LOCK_TTL_S = 20.0  # a run whose lock was not renewed for this long is dead
RENEW_EVERY_S = 5.0
WATCH_EVERY_S = 1.0  # how often a contender reads the lock while it decides
HANDOVER_POLL_S = 0.1  # how often a successor reads the lock while its predecessor hands it over
# How long a launcher (which only asks) watches before leaving the decision to the master: long
# enough to see a live run's renewal.
ASK_FOR_S = RENEW_EVERY_S * 1.6
# A restarted master's wait before it serves: its live predecessor's next renewal, which fails and stops it.
FENCE_S = RENEW_EVERY_S + 1.0
POD_UID_ENV = "EDL_POD_UID"  # the master pod's uid (downward API), where it runs in a pod


# ------------------------------------------------------------------ the owner
def resume_fields(spec: JobSpec) -> dict[str, object]:
    """The spec fields that a checkpoint's model and queue depend on: a resume with other values would
    silently train something else. Trainer counts, intervals, evaluation data and the warm-start model
    (used only when no checkpoint exists) may change between restarts of one job."""
    return {"model_def": spec.model_def, "data": spec.data, "epochs": spec.epochs, "batch_size": spec.batch_size,
            "task_rows": spec.task_rows, "seed": spec.seed, "learning_rate": spec.learning_rate}


def fingerprint(fields: dict[str, object]) -> str:
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]


def owner_record(spec: JobSpec) -> dict:
    fields = resume_fields(spec)
    return {"job": spec.job, "fingerprint": fingerprint(fields), "resume": fields}


def owner_problem(owner: dict | None, spec: JobSpec, where: str) -> str | None:
    """Why ``spec`` may not use the prefix ``where`` that ``owner`` (its record, if any) owns; ``None``: it may."""
    if owner is None:
        return None
    if owner.get("job") != spec.job:
        return (f"--checkpoint-uri {where} belongs to job {owner.get('job')!r}; give job {spec.job!r} "
                "its own --checkpoint-uri")
    mine = resume_fields(spec)
    if owner.get("fingerprint") == fingerprint(mine):
        return None
    theirs = owner.get("resume", {})
    changed = ", ".join(f"{k} {theirs.get(k)!r} -> {v!r}" for k, v in mine.items() if theirs.get(k) != v)
    return (f"--checkpoint-uri {where} holds job {spec.job!r} started with other settings ({changed}); "
            "resume it with its own settings or give the new job its own --checkpoint-uri")


# ------------------------------------------------------------------- the lock
@dataclass(frozen=True)
class Holder:
    """Who holds the lock: ``id`` is the same for every master of one run; ``pid``/``pidns`` tell a
    process on this machine whether the holder is still alive without waiting for the expiry;
    ``pod`` (a pod's uid, or empty) tells a container restarted in place that the holder was its
    own earlier run."""

    id: str
    pid: int
    pidns: str
    host: str
    pod: str = ""

    @classmethod
    def of_this_process(cls, token: str) -> Holder:
        return cls(hashlib.sha256(token.encode()).hexdigest()[:16], os.getpid(), pid_namespace(),
                   socket.gethostname(), os.environ.get(POD_UID_ENV, ""))


@dataclass(frozen=True)
class LockRecord:
    holder: Holder
    job: str
    ttl_s: float = LOCK_TTL_S  # stale once seen unchanged for this long
    renewals: int = 0  # makes every renewal a new object even where versions are content hashes
    # Handed over: its master stopped in the middle of the run (its pod deleted) and writes no more. The
    # next master of the run takes it without a fence; any other run takes it as a free lock.
    released: bool = False

    def to_bytes(self) -> bytes:
        return json.dumps(asdict(self)).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> LockRecord:
        raw = json.loads(data)
        return cls(Holder(**raw["holder"]), raw["job"], float(raw.get("ttl_s", LOCK_TTL_S)),
                   int(raw.get("renewals", 0)), bool(raw.get("released", False)))

    def describe(self) -> str:
        return f"run {self.holder.id} (pid {self.holder.pid} on {self.holder.host})"


class Verdict(enum.Enum):
    TAKE = "take"  # free, ours, or left by a dead run
    REFUSE = "refuse"  # a live run of someone else holds it: seen renewing
    WATCH = "watch"  # someone else's, not yet seen renewed nor stale: read it again


def lock_verdict(current: LockRecord | None, me: str | None, *, holder_dead: bool, changed: bool,
                 unchanged_s: float) -> Verdict:
    """``me``: our holder id (``None``: a launcher that only asks whether a run is live);
    ``holder_dead``: the holder's process is known to be gone (same pid namespace, no such pid);
    ``changed``: the lock's version changed since we first read it; ``unchanged_s``: for how long
    (our monotonic clock) we have seen it without a change."""
    if current is None or current.released or current.holder.id == me or holder_dead:
        return Verdict.TAKE
    if changed:
        return Verdict.REFUSE
    if unchanged_s >= current.ttl_s:
        return Verdict.TAKE
    return Verdict.WATCH


def fence_s(current: LockRecord | None, me: Holder, *, holder_dead: bool) -> float:
    """How long ``me``, having just taken the lock ``current``, waits before it serves. Only a
    predecessor of the same run may still live (another run's lock is taken only once its holder
    is dead or was seen silent for the TTL); it stops at its next renewal, which now fails. One that
    handed the lock over (``released``) has stopped writing."""
    if current is None or current.released or current.holder.id != me.id or holder_dead:
        return 0.0
    current_holder = current.holder
    if (current_holder.pid, current_holder.pidns, current_holder.host) == (me.pid, me.pidns, me.host):
        return 0.0  # this very process took it again
    if current_holder.pod and current_holder.pod == me.pod:
        return 0.0  # the same pod: its container restarted in place, so the old one has stopped
    return FENCE_S


def pid_namespace() -> str:
    """This machine's boot and pid namespace: two processes with the same value see the same pids."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        return f"{boot}/{os.readlink('/proc/self/ns/pid')}"
    except OSError:
        return ""


def holder_dead(holder: Holder) -> bool:
    return bool(holder.pidns) and holder.pidns == pid_namespace() and ended(holder.pid)


# ------------------------------------------------------------- the store I/O
class PrefixClaim:
    """The owner record and the run lock of one checkpoint prefix."""

    def __init__(self, store: ObjectStore, spec: JobSpec, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.store = store
        self.spec = spec
        self.clock = clock
        self.sleep = sleep
        self.version: str | None = None  # of the lock object we hold
        self.record: LockRecord | None = None
        self.serve_after: float | None = None  # on self.clock: a predecessor is fenced by then
        self.predecessor: LockRecord | None = None
        self._stop = threading.Event()

    def check_owner(self) -> None:
        """``UserError`` naming the owner if another job (or this job with other settings) owns the prefix."""
        found = self.store.get_versioned(OWNER_KEY)
        problem = owner_problem(json.loads(found[0]) if found else None, self.spec, self.store.uri)
        if problem:
            raise UserError(problem)

    def _current(self) -> tuple[LockRecord | None, str | None]:
        found = self.store.get_versioned(LOCK_KEY)
        if found is None:
            return None, None
        return LockRecord.from_bytes(found[0]), found[1]

    def _watch(self, me: str | None, limit_s: float) -> tuple[Verdict, LockRecord | None, str | None]:
        """Read the lock until the verdict is TAKE or REFUSE, or ``limit_s`` has passed (then WATCH)."""
        started = self.clock()
        first: str | None = None
        while True:
            current, version = self._current()
            first = first or version
            waited = self.clock() - started
            verdict = lock_verdict(current, me, holder_dead=current is not None and holder_dead(current.holder),
                                   changed=version != first, unchanged_s=waited)
            if verdict is not Verdict.WATCH or waited >= limit_s:
                return verdict, current, version
            self.sleep(WATCH_EVERY_S)

    def check_not_running(self) -> None:
        """``UserError`` naming the run if a live run holds the lock (for a launcher, which never adopts).
        A lock not seen renewed within ``ASK_FOR_S`` is left to the master to judge."""
        verdict, current, _ = self._watch(None, ASK_FOR_S)
        if verdict is Verdict.REFUSE and current is not None:
            raise UserError(self._running(current))

    def _running(self, current: LockRecord) -> str:
        return (f"job {current.job!r} is already running on {self.store.uri}: {current.describe()}; "
                "wait for it to end or stop it")

    def held_by(self, holder_id: str) -> bool:
        """Whether the lock is ``holder_id``'s now: this is a restart within that run (one read, no wait)."""
        current, _ = self._current()
        return current is not None and current.holder.id == holder_id

    def await_handover(self, holder: Holder, limit_s: float) -> None:
        """Up to ``limit_s``, until a predecessor of this run that is stopping (its pod deleted) has
        handed the lock over (``release(handover=True)``): taken then, the lock needs no fence."""
        deadline = self.clock() + limit_s
        while self.clock() < deadline:
            current, _ = self._current()
            if current is None or current.released or current.holder.id != holder.id:
                return
            self.sleep(HANDOVER_POLL_S)

    def acquire(self, holder: Holder) -> bool:
        """Take the lock (free, ours, or stale) and record the owner if none is; ``UserError`` if a
        live run holds it, or if a racing run won the conditional write. ``True`` when the lock was
        already this holder's: a restart within the same run (its master died and came back)."""
        verdict, current, version = self._watch(holder.id, LOCK_TTL_S * 2)
        if verdict is not Verdict.TAKE and current is not None:
            raise UserError(self._running(current))
        record = LockRecord(holder, self.spec.job)
        new = self.store.put_if(LOCK_KEY, record.to_bytes(), version)
        if new is None:
            raced, _ = self._current()
            raise UserError(self._running(raced) if raced else f"lost the race for {self.store.child(LOCK_KEY)}")
        if current is not None and current.holder.id != holder.id:
            log.warning("took over the lock of %s on %s (its process is gone, or it was not renewed for %.0f s)",
                        current.describe(), self.store.uri, current.ttl_s)
        fence = fence_s(current, holder, holder_dead=current is not None and holder_dead(current.holder))
        self.serve_after, self.predecessor = self.clock() + fence, current if fence else None
        self.version, self.record = new, record
        if self.store.get_versioned(OWNER_KEY) is None:
            self.store.put_if(OWNER_KEY, json.dumps(owner_record(self.spec)).encode(), None)
        return current is not None and current.holder.id == holder.id

    def wait_fenced(self) -> None:
        """Until a predecessor of this run that may still live has tried to renew, failed and stopped
        (see ``fence_s``); at once when there is none."""
        if self.serve_after is None:
            return
        left = self.serve_after - self.clock()
        if left > 0 and self.predecessor is not None:
            log.info("waiting %.1f s for the previous master of this run, %s, to see the lock taken and stop",
                     left, self.predecessor.describe())
            self.sleep(left)

    def renew(self) -> bool:
        """Extend our lock; ``False`` if it is no longer ours (a run took it over)."""
        assert self.record is not None
        record = dataclasses.replace(self.record, renewals=self.record.renewals + 1)
        new = self.store.put_if(LOCK_KEY, record.to_bytes(), self.version)
        if new is None and self._current()[0] is None:
            # Gone (a store that lost its objects): nobody holds it, so create it again, conditionally.
            new = self.store.put_if(LOCK_KEY, record.to_bytes(), None)
        if new is None:
            return False
        self.version, self.record = new, record
        return True

    def keep_renewing(self, on_lost: Callable[[], None]) -> threading.Thread:
        """Renew every ``RENEW_EVERY_S`` on a thread until ``release``; ``on_lost`` when another run took it."""

        def run() -> None:
            while not self._stop.wait(RENEW_EVERY_S):
                try:
                    if not self.renew():
                        on_lost()
                        return
                except StorageError as e:
                    log.warning("could not renew the run lock on %s: %s", self.store.uri, e)

        thread = threading.Thread(target=run, name="edl-run-lock", daemon=True)
        thread.start()
        return thread

    def release(self, handover: bool = False) -> None:
        """Stop renewing and remove the lock if it is still ours (the next run need not wait for it);
        ``handover``: the run goes on under a successor (this master was stopped, its job was not
        over): the lock stays the run's, marked released, for the successor to take without a fence."""
        self._stop.set()
        if self.record is None:
            return
        current, version = self._current()
        if current is not None and version == self.version:
            if handover:
                self.store.put_if(LOCK_KEY, dataclasses.replace(self.record, released=True).to_bytes(), version)
            else:
                self.store.delete([LOCK_KEY])
        self.record = None
