"""The master's HTTP+JSON API (FastAPI), its Prometheus metrics and its clock.

Every route but ``/healthz`` and ``/metrics`` needs the job's token
(``Authorization: Bearer TOKEN``); without it the answer is 401 and nothing
changes. The job state lives in one ``Job`` object that only the event loop
touches, so no locks are needed; long polls wait on one ``asyncio.Condition``.

The routes come in groups over one ``Master`` (the job, its clock, its
notifications): open (health, metrics), trainer (membership and tasks),
checkpoint and outcome (cuts, commits, the job's end), control (the launcher,
the sidecar and the CLI). Answers are the types of ``edl.api.master`` in their
JSON form; a ``UserError`` is a 400 with its message, a ``StaleError`` a 409.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from collections.abc import Callable

from fastapi import APIRouter, Depends, FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from pydantic import BaseModel, Field

from edl.api.data import CursorJSON, cursor_from_json
from edl.api.master import (
    CheckpointRecord,
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


class RegisterBody(BaseModel):
    pid: int
    host: str
    store_port: int
    resume: dict | None = None  # ``ResumeReport``: where the trainer stopped under the master that restarted


class HeartbeatBody(BaseModel):
    generation: int = 0
    step: int = 0
    safe_cursor: CursorJSON = None
    wait_s: float = 0.0
    loss: float | None = None  # mean training loss of the trainer's last step
    in_collective_s: float | None = None  # waiting in its generation's collective this long (None: not in one)


class TaskBody(BaseModel):
    request_id: str
    safe_cursor: CursorJSON = None


class TaskFailedBody(BaseModel):
    task_id: int
    reason: str


class SyncBody(BaseModel):
    generation: int
    step: int
    cursors: dict[str, CursorJSON]
    store_port: int
    failed: bool = False


class StepBody(BaseModel):
    generation: int


class ScaleBody(BaseModel):
    trainers: int
    nodes: list[str] = Field(default_factory=list, max_length=10_000)  # the plan's node per trainer


class UnschedulableBody(BaseModel):
    count: int


class ExitBody(BaseModel):
    code: int


class FatalBody(BaseModel):
    message: str
    user: bool = False  # because of the user's input: the launcher exits 2


class UserCodeFailedBody(BaseModel):
    step: int
    part: str
    fingerprint: str
    log: str
    rows: list[tuple[str, int, int]] = []


class CutBody(BaseModel):
    generation: int
    step: int
    cursors: dict[str, CursorJSON]


class CommittedBody(BaseModel):
    generation: int
    step: int
    uri: str
    write_s: float


class FinishBody(BaseModel):
    step: int
    final_model_uri: str | None = None
    metrics: dict[str, float] = {}


class _JobCollector:
    """Prometheus metrics read from the job state at scrape time (no double bookkeeping)."""

    def __init__(self, master: "Master") -> None:
        self.master = master

    def collect(self):
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
        for g in v.generations:
            counts[g.reason.value] = counts.get(g.reason.value, 0) + 1
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


class Master:
    """Binds a ``Job`` to the event loop: clock, notifications, logging."""

    def __init__(self, job: Job, token: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.job = job
        self.token = token
        self.clock = clock
        self.changed = asyncio.Condition()
        self.shutdown_requested = asyncio.Event()
        self._logged_generations = 0
        self._logged_status = JobStatus.RUNNING
        self._logged_abandoned = False
        self._logged_excluded = 0

    async def notify(self) -> None:
        self._log_events()
        async with self.changed:
            self.changed.notify_all()

    async def wait_for(self, predicate: Callable[[], bool], timeout: float) -> bool:
        """Until ``predicate()`` holds after a change, or ``timeout`` seconds (the event loop's clock)."""
        try:
            async with asyncio.timeout(timeout):
                async with self.changed:
                    await self.changed.wait_for(predicate)
            return True
        except TimeoutError:
            return predicate()

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
                "generation %d formed: world size %d (%s), base step %d, state from %s, rank 0 %s",
                g.id, g.world_size, g.reason.value, g.base_step, g.source.value, g.members[0],
            )
        if self.job.abandoned and not self._logged_abandoned:
            self._logged_abandoned = True
            d = self.job.deadman
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
            before = (self.job.membership.phase, len(self.job.membership.history), self.job.status, self.job.abandoned)
            self.job.tick(self.clock())
            after = (self.job.membership.phase, len(self.job.membership.history), self.job.status, self.job.abandoned)
            if before != after:
                await self.notify()
            if self.job.launcher(self.clock()) is LauncherState.OVER and not self.shutdown_requested.is_set():
                log.warning("job %s abandoned by its launcher: master exiting", self.job.spec.job)
                self.shutdown_requested.set()


def build_app(master: Master) -> FastAPI:
    app = FastAPI(title="edl master", docs_url=None, redoc_url=None, openapi_url=None)

    def authorized(request: Request) -> None:
        header = request.headers.get("authorization", "")
        scheme, _, given = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.encode(), master.token.encode()):
            raise HTTPException(status_code=401, detail="missing or wrong job token")

    @app.exception_handler(UserError)
    async def user_error(_: Request, exc: UserError) -> JSONResponse:
        return JSONResponse(status_code=400, content={"detail": str(exc)})

    @app.exception_handler(StaleError)
    async def stale(_: Request, exc: StaleError) -> JSONResponse:
        return JSONResponse(status_code=409, content={"detail": str(exc)})

    auth = [Depends(authorized)]
    app.include_router(_open_routes(master))
    app.include_router(_trainer_routes(master), dependencies=auth)
    app.include_router(_checkpoint_routes(master), dependencies=auth)
    app.include_router(_control_routes(master), dependencies=auth)
    return app


def _open_routes(master: Master) -> APIRouter:
    """Health and metrics: no token (probes and Prometheus)."""
    routes = APIRouter()
    registry = CollectorRegistry()
    registry.register(_JobCollector(master))

    @routes.get("/healthz")
    async def healthz() -> dict:
        return {"ok": True, "master_uid": master.job.master_uid}

    @routes.get("/metrics")
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(generate_latest(registry).decode(), media_type="text/plain; version=0.0.4")

    return routes


def _trainer_routes(master: Master) -> APIRouter:
    """What trainers call to join, stay in and leave generations, and to get their data."""
    routes = APIRouter(prefix="/v1/trainers/{trainer}")
    job = master.job

    @routes.post("/register")
    async def register(trainer: str, body: RegisterBody) -> dict:
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
    async def heartbeat(trainer: str, body: HeartbeatBody) -> dict:
        answer = job.heartbeat(trainer, body.step, cursor_from_json(body.safe_cursor), master.clock(), body.loss,
                               body.generation, body.in_collective_s)
        await master.notify()
        # Wait for a reason to stop, but not when we do not know the trainer: it must learn at once that
        # this master restarted, to stop and re-register with where it is (its pause starts here).
        if body.wait_s > 0 and not answer.stop and answer.known:
            await master.wait_for(lambda: job.heartbeat_answer(trainer).stop, min(body.wait_s, 5.0))
            job.membership.heartbeat(trainer, body.step, master.clock())
            answer = job.heartbeat_answer(trainer)
        return to_json(answer)

    @routes.get("/assignment")
    async def assignment(trainer: str, after: int = 0, wait_s: float = 10.0) -> dict:
        def decided() -> bool:
            answer = job.assignment_answer(trainer, after)
            return not (isinstance(answer, NoAssignment) and answer.why is Unassigned.WAIT)

        await master.wait_for(decided, min(wait_s, 30.0))
        return assignment_to_json(job.assignment_answer(trainer, after))

    @routes.post("/sync")
    async def sync(trainer: str, body: SyncBody) -> dict:
        report = SyncReport(trainer, body.generation, body.step, cursors_from_json(body.cursors), body.store_port,
                            body.failed)
        if body.failed:
            log.warning("trainer %s lost a peer in generation %d after step %d", trainer, body.generation, body.step)
        job.sync(report, master.clock())
        await master.notify()
        return {"ok": True}

    @routes.post("/first-step")
    async def first_step(trainer: str, body: StepBody) -> dict:
        job.first_step(body.generation, master.clock())
        g = job.membership.current
        if g is not None and g.id == body.generation and g.pause_s is not None and g.reason is not Reason.START:
            log.info("generation %d running: pause %.2f s", g.id, g.pause_s)
        await master.notify()
        return {"ok": True}

    @routes.post("/task")
    async def next_task(trainer: str, body: TaskBody) -> dict:
        answer = job.next_task(trainer, body.request_id, cursor_from_json(body.safe_cursor), master.clock())
        return next_task_to_json(answer)

    @routes.post("/user-code-failed")
    async def user_code_failed(trainer: str, body: UserCodeFailedBody) -> dict:
        failure = UserCodeFailure(trainer, body.step, body.part, body.fingerprint, body.log,
                                  tuple(tuple(r) for r in body.rows))
        log.warning("trainer %s: %s raised %s (step %d)", trainer, body.part, body.fingerprint, body.step)
        user_error = job.user_code_failed(failure, master.clock())
        await master.notify()
        return {"user_error": user_error, "error": job.error if user_error else None}

    @routes.post("/task-failed")
    async def task_failed(trainer: str, body: TaskFailedBody) -> dict:
        log.warning("trainer %s could not process task %d: %s", trainer, body.task_id, body.reason)
        job.fail_task(trainer, body.task_id, body.reason, master.clock())
        await master.notify()
        return {"ok": True}

    return routes


def _checkpoint_routes(master: Master) -> APIRouter:
    """Rank 0's checkpoints (a fenced cut, then its commit) and the job's outcome."""
    routes = APIRouter()
    job = master.job

    @routes.get("/v1/spec")
    async def spec() -> dict:
        return job.spec.to_dict()

    @routes.post("/v1/checkpoints/cut")
    async def cut(body: CutBody) -> dict:
        return job.checkpoint_cut(body.generation, body.step, cursors_from_json(body.cursors), master.clock())

    @routes.post("/v1/checkpoints/committed")
    async def committed(body: CommittedBody) -> dict:
        ok = job.checkpoint_committed(CheckpointRecord(body.step, body.uri, body.write_s, body.generation))
        if ok:
            log.info("checkpoint committed at step %d: %s (%.2f s)", body.step, body.uri, body.write_s)
        return {"ok": ok}

    @routes.post("/v1/finish")
    async def finish(body: FinishBody) -> dict:
        job.finish(body.step, body.final_model_uri, body.metrics, master.clock())
        await master.notify()
        return {"ok": True}

    @routes.post("/v1/fatal")
    async def fatal(body: FatalBody) -> dict:
        job.fatal(body.message, master.clock(), body.user)
        await master.notify()
        return {"ok": True}

    return routes


def _control_routes(master: Master) -> APIRouter:
    """What the launcher, the sidecar and the CLI call: status, size, trainer exits, shutdown."""
    routes = APIRouter()
    job = master.job

    @routes.get("/v1/status")
    async def status() -> dict:
        return job.status_view(master.clock()).to_json()

    @routes.get("/v1/summary")
    async def summary() -> dict:
        return job.summary(master.clock())

    @routes.post("/v1/scale")
    async def scale(body: ScaleBody) -> dict:
        job.scale(body.trainers, tuple(body.nodes))
        log.info("desired trainers set to %d%s", body.trainers,
                 f" (planned on {len(set(body.nodes))} node(s))" if body.nodes else "")
        await master.notify()
        return {"desired_trainers": job.desired}

    @routes.post("/v1/unschedulable")
    async def unschedulable(body: UnschedulableBody) -> dict:
        job.report_unschedulable(body.count, master.clock())
        log.info("%d trainer(s) unschedulable; desired trainers now %d", body.count, job.desired)
        await master.notify()
        return {"desired_trainers": job.desired}

    @routes.post("/v1/checkpoints/request")
    async def request_checkpoint() -> dict:
        job.request_checkpoint()
        log.info("checkpoint requested")
        return {"ok": True, "committed": len(job.checkpoints)}

    @routes.post("/v1/trainers/{trainer}/exited")
    async def exited(trainer: str, body: ExitBody) -> dict:
        job.trainer_exited(trainer, body.code, master.clock())
        if body.code != 0:
            log.warning("trainer %s exited with code %d", trainer, body.code)
        await master.notify()
        return {"ok": True}

    @routes.post("/v1/trainers/{trainer}/drain")
    async def drain(trainer: str) -> dict:
        job.drain(trainer, master.clock())
        log.info("draining trainer %s", trainer)
        await master.notify()
        return {"ok": True}

    @routes.post("/v1/launcher/beat")
    async def launcher_beat() -> dict:
        job.launcher_beat(master.clock())
        return {"ok": True, "abandoned": job.abandoned}

    @routes.post("/v1/shutdown")
    async def shutdown() -> dict:
        master.shutdown_requested.set()
        return {"ok": True}

    return routes
