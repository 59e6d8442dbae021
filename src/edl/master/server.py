"""The master's HTTP+JSON API (Starlette), its Prometheus metrics and its clock.

Every route but ``/healthz`` and ``/metrics`` needs the job's token
(``Authorization: Bearer TOKEN``); without it the answer is 401 and nothing
changes. The job state lives in one ``Job`` object that only the event loop
touches, so no locks are needed; long polls wait on one ``asyncio.Condition``.

The routes come in groups over one ``Master`` (the job, its clock, its
notifications): open (health, metrics), trainer (membership and tasks),
checkpoint and outcome (cuts, commits, the job's end), control (the launcher,
the sidecar and the CLI). Answers are the types of ``edl.api.master`` in their
JSON form; a ``UserError`` is a 400 with its message, a ``StaleError`` a 409.

Starlette, not FastAPI: a restarted master is back sooner when it imports less (FastAPI and
pydantic took 40 % of the master's start-up). Bodies are frozen ``msgspec.Struct`` types
(``Body.read``), which msgspec decodes and checks in one pass and imports in milliseconds;
a body that does not fit is a 400 naming the field.
"""

from __future__ import annotations

import asyncio
import bisect
import hmac
import json
import logging
import time
import zlib
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from typing import Any, TypeVar

import msgspec
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import BaseRoute, Route

from edl.api.cluster import SizeCause, SizeReason
from edl.api.data import CursorJSON, cursor_from_json
from edl.api.master import (
    BudgetView,
    CheckpointRecord,
    HeartbeatAnswer,
    JobStatus,
    NoAssignment,
    Reason,
    ResumeReport,
    SyncReport,
    Unassigned,
    UserCodeFailure,
    assignment_to_json,
    cursors_from_json,
    next_task_to_json,
    to_json,
)
from edl.errors import StaleError, UserError
from edl.master.deadman import LauncherState
from edl.master.job import Job

log = logging.getLogger("edl.master")


B = TypeVar("B", bound="Body")
MAX_PLANNED_NODES = 10_000  # a plan names one node per trainer
MAX_REASON_CHARS = 1_000  # a reason is one line for a person
MAX_STATUS_WAIT_S = 10.0  # the longest long poll of the status
T = TypeVar("T")

# The seconds the request being handled spent waiting in long polls (``Master.wait_for``), summed.
_WAITED: ContextVar[list[float] | None] = ContextVar("edl_waited", default=None)


class RequestTimes:
    """How long the master took over each route's requests, their long polls' waits left out: what a
    trainer waits on besides the network. Counted here in a histogram's buckets and exported at scrape
    time as ``edl_master_request_seconds{route}``, so that nothing is imported for it before a scrape."""

    BUCKETS = (0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)

    def __init__(self) -> None:
        self.counts: dict[str, list[int]] = {}  # per route: per bucket (the last: above every bound)
        self.sums: dict[str, float] = {}

    def observe(self, route: str, seconds: float) -> None:
        counts = self.counts.get(route)
        if counts is None:
            counts = self.counts[route] = [0] * (len(self.BUCKETS) + 1)
        counts[bisect.bisect_left(self.BUCKETS, seconds)] += 1
        self.sums[route] = self.sums.get(route, 0.0) + seconds

    def family(self):
        from prometheus_client.core import HistogramMetricFamily

        h = HistogramMetricFamily("edl_master_request_seconds",
                                  "Time the master took over a request, its long polls' waits left out",
                                  labels=["route"])
        for route, counts in sorted(self.counts.items()):
            cumulative, total = [], 0
            for bound, n in zip((*map(str, self.BUCKETS), "+Inf"), counts):
                total += n
                cumulative.append((bound, total))
            h.add_metric([route], cumulative, self.sums[route])
        return h


class Body(msgspec.Struct, frozen=True):
    """A request body, decoded and checked against its fields' types by msgspec (what a client may leave out
    has a default; ints are taken for floats; fields it does not know are ignored). A body that is not JSON,
    or does not fit, is a 400 naming the route and the field."""

    @classmethod
    async def read(cls: type[B], request: Request) -> B:
        where = request.url.path
        try:
            # The standard parser first: Python clients send a non-finite metric (an evaluation loss of
            # inf) as `Infinity`, which msgspec's own decoder refuses; msgspec then checks the types.
            data = json.loads(await request.body())
        except ValueError as e:
            raise UserError(f"{where}: the body is not JSON ({e})") from e
        try:
            return msgspec.convert(data, type=cls)
        except msgspec.ValidationError as e:  # e.g. "Expected `int`, got `str` - at `$.trainers`"
            raise UserError(f"{where}: {e}") from e


class WakeBody(Body, frozen=True):
    await_handover_s: float = 0.0  # how long the woken spare waits for its stopping predecessor's lock


class RegisterBody(Body, frozen=True):
    pid: int
    host: str
    store_port: int
    resume: dict | None = None  # ``ResumeReport``: where the trainer stopped under the master that restarted


class HeartbeatBody(Body, frozen=True):
    generation: int = 0
    step: int = 0
    safe_cursor: CursorJSON = None
    wait_s: float = 0.0
    loss: float | None = None  # mean training loss of the trainer's last step
    in_collective_s: float | None = None  # waiting in its generation's collective this long (None: not in one)
    store_port: int | None = None  # where its store would listen for a generation it leads next
    prepared: int = 0  # the prepared generation the trainer last heard of (0: none) ...
    go: bool = False  # ... and whether it had the go: an answer that says otherwise comes at once


class TaskBody(Body, frozen=True):
    request_id: str
    safe_cursor: CursorJSON = None
    master_uid: str | None = None  # the master and generation the trainer's tasks are for (None: any)
    generation: int | None = None


class TaskFailedBody(Body, frozen=True):
    task_id: int
    reason: str


class SyncBody(Body, frozen=True):
    generation: int
    step: int
    cursors: dict[str, CursorJSON]
    store_port: int
    failed: bool = False
    switched_to: int = 0  # the prepared generation the trainer went on into (0: it waits for the next)


class StepBody(Body, frozen=True):
    generation: int


class ReasonBody(Body, frozen=True):
    cause: str
    text: str


class ScaleBody(Body, frozen=True):
    trainers: int
    nodes: list[str] = msgspec.field(default_factory=list)  # the plan's node per trainer (at most MAX_PLANNED_NODES)
    reason: ReasonBody | None = None  # why (the sidecar's); none: set by hand
    # The held trainers the decision saw (``JobView.held_replacements``); none: all of them (by hand).
    released: list[str] | None = None


class BudgetBody(Body, frozen=True):
    spent: int
    limit: int
    total: int
    refunded: int


class LauncherBeatBody(Body, frozen=True):
    budgets: dict[str, BudgetBody] = msgspec.field(default_factory=dict)


class UnschedulableBody(Body, frozen=True):
    count: int


class ExitBody(Body, frozen=True):
    code: int
    preempted: bool = False


class FatalBody(Body, frozen=True):
    message: str
    user: bool = False  # because of the user's input: the launcher exits 2


class UserCodeFailedBody(Body, frozen=True):
    step: int
    part: str
    fingerprint: str
    log: str
    rows: list[tuple[str, int, int]] = msgspec.field(default_factory=list)


class CutBody(Body, frozen=True):
    generation: int
    step: int
    cursors: dict[str, CursorJSON]


class CommittedBody(Body, frozen=True):
    generation: int
    step: int
    uri: str
    write_s: float


class FinishBody(Body, frozen=True):
    step: int
    final_model_uri: str | None = None
    metrics: dict[str, float] = msgspec.field(default_factory=dict)


class _JobCollector:
    """Prometheus metrics read from the job state at scrape time (no double bookkeeping)."""

    def __init__(self, master: "Master") -> None:
        self.master = master

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        job = self.master.job
        v = job.status_view(self.master.clock())
        labels = ["job"]
        for name, doc, value in (
            ("edl_world_size", "Trainers in the current generation", v.world_size),
            ("edl_desired_trainers", "Desired trainer count", v.desired_trainers),
            ("edl_generation", "Current generation id", v.generation),
            ("edl_epoch", "Oldest epoch not yet done", v.epoch),
            ("edl_step", "Last completed training step seen by the master", v.step),
            ("edl_todo_tasks", "Tasks waiting to be handed out", len(job.queue.todo)),
        ):
            g = GaugeMetricFamily(name, doc, labels=labels)
            g.add_metric([job.spec.job], value)
            yield g
        done = CounterMetricFamily("edl_samples_done", "Samples committed, all epochs", labels=labels)
        done.add_metric([job.spec.job], sum(v.done_rows))
        yield done
        gens = CounterMetricFamily("edl_generation_changes", "Generations formed, by reason", labels=["job", "reason"])
        counts: dict[str, int] = {}
        for gen in v.generations:
            counts[gen.reason.value] = counts.get(gen.reason.value, 0) + 1
        for reason, n in counts.items():
            gens.add_metric([job.spec.job, reason], n)
        yield gens
        pause = GaugeMetricFamily("edl_last_pause_seconds", "Pause of the newest generation change", labels=labels)
        paused = [g.pause_s for g in v.generations if g.pause_s is not None]
        pause.add_metric([job.spec.job], paused[-1] if paused else 0.0)
        yield pause
        ck = CounterMetricFamily("edl_checkpoints", "Checkpoints committed", labels=labels)
        ck.add_metric([job.spec.job], len(v.checkpoints))
        yield ck
        yield self.master.request_times.family()


class Master:
    """Binds a ``Job`` to the event loop: clock, notifications, logging."""

    def __init__(self, job: Job, token: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.job = job
        self.token = token
        self.clock = clock
        self.changed = asyncio.Condition()  # wakes the long polls of assignments and the status
        self.beats = asyncio.Condition()  # wakes the waiting heartbeats (``Job.beat_revision``)
        self.shutdown_requested = asyncio.Event()
        self._logged_generations = 0
        self._logged_status = JobStatus.RUNNING
        self._logged_abandoned = False
        self._logged_excluded = 0
        self._woken_at: tuple | None = None  # ``Job.revision`` when the long polls were last woken
        self._beats_woken_at: tuple | None = None  # ``Job.beat_revision`` when the heartbeats were
        self.request_times = RequestTimes()

    async def notify(self) -> None:
        """After a change: log what happened, and wake the long polls when anything they wait on moved
        (``Job.revision``). A heartbeat that only reports progress wakes nobody: at N trainers a beat
        each per second, waking every poll each time would cost N x N predicate checks a second."""
        self._log_events()
        revision = self.job.revision()
        if revision == self._woken_at:
            return
        self._woken_at = revision
        async with self.changed:
            self.changed.notify_all()
        beats = self.job.beat_revision()
        if beats != self._beats_woken_at:
            self._beats_woken_at = beats
            async with self.beats:
                self.beats.notify_all()

    async def wait_for(self, predicate: Callable[[], bool], timeout: float,
                       condition: asyncio.Condition | None = None) -> bool:
        """Until ``predicate()`` holds after a change (woken by ``condition``, ``changed`` unless said), or
        ``timeout`` seconds (the event loop's clock)."""
        began = time.perf_counter()
        condition = self.changed if condition is None else condition
        try:
            async with asyncio.timeout(timeout):
                async with condition:
                    await condition.wait_for(predicate)
            return True
        except TimeoutError:
            return predicate()
        finally:
            waited = _WAITED.get()
            if waited is not None:
                waited[0] += time.perf_counter() - began

    def _log_events(self) -> None:
        excluded = self.job.membership.excluded
        while self._logged_excluded < len(excluded):
            trainer, why = excluded[self._logged_excluded]
            self._logged_excluded += 1
            log.warning("trainer %s dropped: %s", trainer, why)
        hist = self.job.membership.history
        while self._logged_generations < len(hist):
            g = hist[self._logged_generations]
            self._logged_generations += 1
            if self._logged_generations == 1 and self.job.resume_note is not None:
                log.info("restarted master: %s", self.job.resume_note)
            log.info(
                "generation %d formed: world size %d (%s), base step %d, state from %s, rank 0 %s%s",
                g.id, g.world_size, g.reason.value, g.base_step, g.source.value, g.members[0],
                "" if g.prepared_s is None else f"; switched into after {g.prepared_s:.2f} s of background preparation",
            )
        if self.job.abandoned and not self._logged_abandoned:
            self._logged_abandoned = True
            d = self.job.deadman
            assert d.abandoned_at is not None  # abandoned: since then
            log.warning("launcher silent for %.0f s: ending job %s (trainers leave; the master exits in %.0f s)",
                        d.abandoned_at - d.last_beat, self.job.spec.job, d.linger_s)
        if self.job.status is not self._logged_status:
            self._logged_status = self.job.status
            if self.job.status is JobStatus.FAILED:
                log.error("job failed: %s", self.job.error)
            else:
                log.info("job %s", self.job.status.value)

    async def ticker(self, period: float = 0.1) -> None:
        while True:
            await asyncio.sleep(period)
            self.job.tick(self.clock())
            await self.notify()  # wakes the polls if a trainer expired, a generation formed, the job ended
            if self.job.launcher(self.clock()) is LauncherState.OVER and not self.shutdown_requested.is_set():
                log.warning("job %s abandoned by its launcher: master exiting", self.job.spec.job)
                self.shutdown_requested.set()


Handler = Callable[[Request], Awaitable[Any]]


class _Routes:
    """One group of routes under ``prefix``, declared with ``@routes.get(path)`` / ``@routes.post(path)``.
    A handler takes the request and returns a JSON-able answer (or a ``Response``). With ``token``
    every route of the group needs ``Authorization: Bearer TOKEN`` (401 otherwise, nothing done)."""

    def __init__(self, prefix: str = "", token: str | None = None, times: RequestTimes | None = None) -> None:
        self.prefix = prefix
        self.token = token
        self.times = times  # where each request's time is counted (none: not counted)
        self.routes: list[BaseRoute] = []

    def get(self, path: str) -> Callable[[Handler], Handler]:
        return self._add(path, "GET")

    def post(self, path: str) -> Callable[[Handler], Handler]:
        return self._add(path, "POST")

    def _add(self, path: str, method: str) -> Callable[[Handler], Handler]:
        route = self.prefix + path

        def add(handler: Handler) -> Handler:
            async def endpoint(request: Request) -> Response:
                if self.token is not None and not _authorized(request, self.token):
                    return JSONResponse({"detail": "missing or wrong job token"}, status_code=401)
                waited = [0.0]
                token = _WAITED.set(waited)
                try:
                    # The whole body first (the handler reads it again from Starlette's cache): the time
                    # counted below is the master's, not a slow sender's.
                    await request.body()
                    began = time.perf_counter()
                    try:
                        answer = await handler(request)
                    finally:
                        if self.times is not None:
                            self.times.observe(route, time.perf_counter() - began - waited[0])
                except ClientDisconnect:
                    # The caller went away mid-request (a trainer killed while it sent a heartbeat): nobody
                    # reads the answer, and it is no error of ours to log.
                    return Response(status_code=400)
                finally:
                    _WAITED.reset(token)
                return answer if isinstance(answer, Response) else JSONResponse(answer)

            self.routes.append(Route(route, endpoint, methods=[method]))
            return handler

        return add


def heartbeat_wait_s(trainer: str, now: float, wait_s: float) -> float:
    """How long a heartbeat that may wait up to ``wait_s`` for news waits without any: until the trainer's
    own moment of each ``wait_s`` (a phase from its name), not ``wait_s`` from its arrival. The trainers'
    beats then end spread evenly over the period whatever bunched their requests (a burst of other
    requests that delayed answers, a change that woke every poll at once): ended together, 1,024 beats
    came back together every second and each such burst kept the event loop from everything else for
    100 ms or more. A trainer beats once per period; the first wait may be shorter."""
    phase = zlib.crc32(trainer.encode()) / 2**32 * wait_s
    return (phase - now) % wait_s or wait_s


def _authorized(request: Request, token: str) -> bool:
    header = request.headers.get("authorization", "")
    scheme, _, given = header.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(given.encode(), token.encode())


def _query(request: Request, name: str, kind: Callable[[str], T], default: T) -> T:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    try:
        return kind(raw)
    except ValueError as e:
        raise UserError(f"{request.url.path}: query parameter {name}={raw!r} is not {kind.__name__}") from e


async def _user_error(_: Request, exc: Exception) -> Response:
    return JSONResponse(status_code=400, content={"detail": str(exc)})


def build_app(master: Master) -> Starlette:
    async def stale(_: Request, exc: Exception) -> Response:
        return JSONResponse(status_code=409, content={"detail": str(exc)})

    routes = (_open_routes(master) + _trainer_routes(master) + _checkpoint_routes(master)
              + _control_routes(master))
    return Starlette(routes=routes, exception_handlers={UserError: _user_error, StaleError: stale})


def standby_app(token: str, wake: Callable[[float], None]) -> Starlette:
    """A spare master pod's server until it is woken (``edl master --standby http``): ``/healthz`` for its
    readiness, ``POST /v1/standby/start`` (the job token) to wake it, with how long to wait for the
    predecessor's lock (``wake``'s argument). Anything else is a 503: a caller that reaches the spare
    before it serves (a trainer, through a Service not yet switched) waits and asks again."""
    open_routes, guarded = _Routes(), _Routes("/v1/standby", token)

    @open_routes.get("/healthz")
    async def healthz(_: Request) -> dict:
        return {"ok": True, "standby": True}

    @guarded.post("/start")
    async def start(r: Request) -> dict:
        wake((await WakeBody.read(r)).await_handover_s)
        return {"ok": True}

    async def not_yet(_: Request) -> Response:
        return JSONResponse({"detail": "a standby master: not serving yet"}, status_code=503)

    catch_all = Route("/{path:path}", not_yet, methods=["GET", "POST"])
    return Starlette(routes=[*open_routes.routes, *guarded.routes, catch_all],
                     exception_handlers={UserError: _user_error})


async def _drain(master: Master, trainer: str, message: str, told_to_stop: bool = False) -> dict:
    """Drain ``trainer`` (asked by the launcher, or by the trainer itself when ``told_to_stop``: it asks
    again until it has left, and the first ask is the one logged)."""
    if not told_to_stop:
        master.job.drain(trainer, master.clock())
        log.info(message, trainer)
    elif master.job.leave(trainer, master.clock()):
        if trainer in master.job.replacing:
            message = ("trainer %s was told to stop (its pod deleted or preempted); the job is at its minimum: "
                       "it trains on until a replacement has joined")
        log.info(message, trainer)
    await master.notify()
    return {"ok": True}


def _open_routes(master: Master) -> list[BaseRoute]:
    """Health and metrics: no token (probes and Prometheus)."""
    routes = _Routes()
    registry: list[Any] = []  # made at the first scrape: prometheus_client is not imported before

    @routes.get("/healthz")
    async def healthz(_: Request) -> dict:
        return {"ok": True, "master_uid": master.job.master_uid}

    @routes.get("/metrics")
    async def metrics(_: Request) -> Response:
        from prometheus_client import CollectorRegistry, generate_latest

        if not registry:
            registry.append(CollectorRegistry())
            registry[0].register(_JobCollector(master))
        return PlainTextResponse(generate_latest(registry[0]).decode(), media_type="text/plain; version=0.0.4")

    return routes.routes


def _trainer_routes(master: Master) -> list[BaseRoute]:
    """What trainers call to join, stay in and leave generations, and to get their data."""
    routes = _Routes("/v1/trainers/{trainer}", master.token, master.request_times)
    job = master.job

    @routes.post("/register")
    async def register(r: Request) -> dict:
        trainer, body = r.path_params["trainer"], await RegisterBody.read(r)
        if job.status is JobStatus.RUNNING:
            resume = None if body.resume is None else ResumeReport.from_json(body.resume)
            job.register(trainer, body.pid, body.host, body.store_port, master.clock(), resume)
            if resume is None:
                log.info("trainer %s registered (pid %d)", trainer, body.pid)
            else:
                log.info("trainer %s registered (pid %d), stopped at step %d of generation %d", trainer, body.pid,
                         resume.step, resume.generation)
            await master.notify()
        return {"master_uid": job.master_uid, "job_status": job.status.value}

    @routes.post("/heartbeat")
    async def heartbeat(r: Request) -> dict:
        trainer = r.path_params["trainer"]
        body = await HeartbeatBody.read(r)
        answer = job.heartbeat(trainer, body.step, cursor_from_json(body.safe_cursor), master.clock(), body.loss,
                               body.generation, body.in_collective_s, body.store_port)
        await master.notify()
        # Wait for a reason to stop or to leave the collective, or news of the prepared generation, but
        # not when we do not know the trainer: it must learn at once that this master restarted, to stop
        # and re-register with where it is (its pause starts here).
        heard = (body.prepared, body.go)

        def news(a: HeartbeatAnswer) -> bool:
            told = (0, False) if a.prepared is None else (a.prepared.generation, a.prepared.go)
            return a.stop or a.abort or told != heard

        if body.wait_s > 0 and not news(answer) and answer.known:
            await master.wait_for(lambda: news(job.heartbeat_answer(trainer)),
                                  heartbeat_wait_s(trainer, master.clock(), min(body.wait_s, 5.0)), master.beats)
            job.membership.heartbeat(trainer, body.step, master.clock())
            answer = job.heartbeat_answer(trainer)
        return to_json(answer)

    @routes.post("/prepared")
    async def prepared(r: Request) -> dict:
        trainer, body = r.path_params["trainer"], await StepBody.read(r)
        job.prepared_ready(trainer, body.generation, master.clock())
        await master.notify()
        return {"ok": True}

    @routes.post("/leave")
    async def leave(r: Request) -> dict:
        return await _drain(master, r.path_params["trainer"],
                            "trainer %s was told to stop (its pod deleted or preempted); draining it",
                            told_to_stop=True)

    @routes.get("/assignment")
    async def assignment(r: Request) -> dict:
        trainer = r.path_params["trainer"]
        after = _query(r, "after", int, 0)
        wait_s = _query(r, "wait_s", float, 10.0)
        def decided() -> bool:
            answer = job.assignment_answer(trainer, after)
            return not (isinstance(answer, NoAssignment) and answer.why is Unassigned.WAIT)

        await master.wait_for(decided, min(wait_s, 30.0))
        return assignment_to_json(job.assignment_answer(trainer, after))

    @routes.post("/sync")
    async def sync(r: Request) -> dict:
        trainer = r.path_params["trainer"]
        body = await SyncBody.read(r)
        report = SyncReport(trainer, body.generation, body.step, cursors_from_json(body.cursors), body.store_port,
                            body.failed, body.switched_to)
        if body.failed:
            log.warning("trainer %s lost a peer in generation %d after step %d", trainer, body.generation, body.step)
        job.sync(report, master.clock())
        await master.notify()
        return {"ok": True}

    @routes.post("/first-step")
    async def first_step(r: Request) -> dict:
        body = await StepBody.read(r)
        job.first_step(body.generation, master.clock())
        g = job.membership.current
        if g is not None and g.id == body.generation and g.pause_s is not None and g.reason is not Reason.START:
            log.info("generation %d running: pause %.2f s", g.id, g.pause_s)
        await master.notify()
        return {"ok": True}

    @routes.post("/task")
    async def next_task(r: Request) -> dict:
        trainer = r.path_params["trainer"]
        body = await TaskBody.read(r)
        answer = job.next_task(trainer, body.request_id, cursor_from_json(body.safe_cursor), master.clock(),
                               master_uid=body.master_uid, generation=body.generation)
        return next_task_to_json(answer)

    @routes.post("/user-code-failed")
    async def user_code_failed(r: Request) -> dict:
        trainer = r.path_params["trainer"]
        body = await UserCodeFailedBody.read(r)
        failure = UserCodeFailure(trainer, body.step, body.part, body.fingerprint, body.log,
                                  tuple(body.rows))  # (shard, first row, end row): tuples already
        log.warning("trainer %s: %s raised %s (step %d)", trainer, body.part, body.fingerprint, body.step)
        user_error = job.user_code_failed(failure, master.clock())
        await master.notify()
        return {"user_error": user_error, "error": job.error if user_error else None}

    @routes.post("/task-failed")
    async def task_failed(r: Request) -> dict:
        trainer = r.path_params["trainer"]
        body = await TaskFailedBody.read(r)
        log.warning("trainer %s could not process task %d: %s", trainer, body.task_id, body.reason)
        job.fail_task(trainer, body.task_id, body.reason, master.clock())
        await master.notify()
        return {"ok": True}

    return routes.routes


def _checkpoint_routes(master: Master) -> list[BaseRoute]:
    """Rank 0's checkpoints (a fenced cut, then its commit) and the job's outcome."""
    routes = _Routes(token=master.token, times=master.request_times)
    job = master.job

    @routes.get("/v1/spec")
    async def spec(_: Request) -> dict:
        return job.spec.to_dict()

    @routes.post("/v1/checkpoints/cut")
    async def cut(r: Request) -> dict:
        body = await CutBody.read(r)
        return job.checkpoint_cut(body.generation, body.step, cursors_from_json(body.cursors), master.clock())

    @routes.post("/v1/checkpoints/committed")
    async def committed(r: Request) -> dict:
        body = await CommittedBody.read(r)
        ok = job.checkpoint_committed(CheckpointRecord(body.step, body.uri, body.write_s, body.generation))
        if ok:
            log.info("checkpoint committed at step %d: %s (%.2f s)", body.step, body.uri, body.write_s)
            await master.notify()  # a launcher waiting for a last checkpoint (a cancel) hears of it now
        return {"ok": ok}

    @routes.post("/v1/finish")
    async def finish(r: Request) -> dict:
        body = await FinishBody.read(r)
        job.finish(body.step, body.final_model_uri, body.metrics, master.clock())
        await master.notify()
        return {"ok": True}

    @routes.post("/v1/fatal")
    async def fatal(r: Request) -> dict:
        body = await FatalBody.read(r)
        job.fatal(body.message, master.clock(), body.user)
        await master.notify()
        return {"ok": True}

    return routes.routes


def _control_routes(master: Master) -> list[BaseRoute]:
    """What the launcher, the sidecar and the CLI call: status, size, trainer exits, shutdown."""
    routes = _Routes(token=master.token, times=master.request_times)
    job = master.job

    @routes.get("/v1/status")
    async def status(r: Request) -> dict:
        # With ``after`` (the ``control_version`` of the caller's last answer) and ``wait_s``: a long poll,
        # answered once something the launcher acts on has changed, or after ``wait_s``.
        after = _query(r, "after", int, 0)
        wait_s = _query(r, "wait_s", float, 0.0)
        if after and wait_s > 0:  # (NaN is not > 0)
            await master.wait_for(lambda: job.control_version() != after, min(wait_s, MAX_STATUS_WAIT_S))
        return job.status_view(master.clock()).to_json()

    @routes.get("/v1/summary")
    async def summary(_: Request) -> dict:
        return job.summary(master.clock())

    @routes.post("/v1/scale")
    async def scale(r: Request) -> dict:
        body = await ScaleBody.read(r)
        if len(body.nodes) > MAX_PLANNED_NODES:
            raise UserError(f"/v1/scale: 'nodes' has {len(body.nodes)} entries, at most {MAX_PLANNED_NODES}")
        reason = None
        if body.reason is not None:
            try:
                reason = SizeReason(SizeCause(body.reason.cause), body.reason.text[:MAX_REASON_CHARS])
            except ValueError:
                raise UserError(f"/v1/scale: unknown reason cause {body.reason.cause!r}") from None
        before = (job.desired, job.node_hints, job.size_reason)
        job.scale(body.trainers, tuple(body.nodes), reason, master.clock(),
                  None if body.released is None else tuple(body.released))
        if before[:2] != (job.desired, job.node_hints):
            log.info("desired trainers set to %d%s", body.trainers,
                     f" (planned on {len(set(body.nodes))} node(s))" if body.nodes else "")
        if job.size_reason is not None and (before[2] is None or before[2].cause is not job.size_reason.cause):
            log.info("size %d: %s", job.desired, job.size_reason.text)
        await master.notify()
        return {"desired_trainers": job.desired}

    @routes.post("/v1/unschedulable")
    async def unschedulable(r: Request) -> dict:
        body = await UnschedulableBody.read(r)
        job.report_unschedulable(body.count, master.clock())
        log.info("%d trainer(s) unschedulable; desired trainers now %d", body.count, job.desired)
        await master.notify()
        return {"desired_trainers": job.desired}

    @routes.post("/v1/checkpoints/request")
    async def request_checkpoint(_: Request) -> dict:
        job.request_checkpoint()
        log.info("checkpoint requested")
        return {"ok": True, "committed": len(job.checkpoints)}

    @routes.post("/v1/trainers/{trainer}/exited")
    async def exited(r: Request) -> dict:
        trainer = r.path_params["trainer"]
        body = await ExitBody.read(r)
        job.trainer_exited(trainer, body.code, master.clock(), preempted=body.preempted)
        if body.code != 0:
            log.warning("trainer %s exited with code %d", trainer, body.code)
        await master.notify()
        return {"ok": True}

    @routes.post("/v1/trainers/{trainer}/drain")
    async def drain(r: Request) -> dict:
        return await _drain(master, r.path_params["trainer"], "draining trainer %s")

    @routes.post("/v1/launcher/beat")
    async def launcher_beat(r: Request) -> dict:
        body = await LauncherBeatBody.read(r) if await r.body() else LauncherBeatBody()  # a bare beat too
        budgets = {k: BudgetView(b.spent, b.limit, b.total, b.refunded) for k, b in body.budgets.items()}
        job.launcher_beat(master.clock(), budgets)
        return {"ok": True, "abandoned": job.abandoned}

    @routes.post("/v1/shutdown")
    async def shutdown(_: Request) -> dict:
        master.shutdown_requested.set()
        return {"ok": True}

    return routes.routes
