"""How many trainers one master serves: simulated trainers that speak the real protocol and train nothing.

    python bench/master_scale.py [--trainers 64 256 1024] [--duration 60] [--step-s 0.5] [--batch 64]
                                 [--clients 0] [--ramp-s 5] [--checkpoint-interval 30] [--py-spy PATH]

One run per N of ``--trainers``. Each starts a real ``edl master`` as the local launcher starts it
(``LocalProcesses.spawn``, the job's flags from ``spec_to_argv``, the token in ``EDL_TOKEN``) on a data
set generated once (``prepare_synthetic``: ``--rows`` rows, 4 features, 8 shards), with
``--min-trainers`` = ``--max-trainers`` = ``--trainers`` N, so the job keeps one generation of N. This
process plays the launcher (a beat a second, the long poll of the status, as ``edl.launcher`` does),
and ``--clients`` processes of this script (one per 128 trainers unless given; asyncio and aiohttp, JSON only) play the N
trainers, each the way ``edl.trainer`` talks to its master: ``GET /v1/spec``, register (spread over
``--ramp-s``), long-poll for its assignment (``wait_s`` 10); a heartbeat after another, each waiting up
to 1 s on the master (``edl.trainer.heartbeat``), with the trainer's step, loss and safe cursor; the
prefetch's ``next_task`` whenever it holds under two batches, at the moment ``AskPace`` picks
(``edl.trainer.prefetch``: a random share of half the time the held rows last). The trainers
step in lockstep on a shared clock every ``--step-s`` seconds through ``--batch`` rows of their tasks,
the last fifth of each step counting as their all-reduce (the heartbeat's ``in_collective_s``); a
trainer's safe cursor is its position one step back, as the real loop's. Rank 0 reports its first step
and cuts and commits a checkpoint every ``--checkpoint-interval`` seconds (the master's half only: no
model is written). A trainer told to stop reports its step (``sync``) and asks for the next assignment.

Once the master's generation holds all N trainers and ``--settle`` seconds passed, ``--duration``
seconds of steady state are measured:

- per call kind: count, p50/p99/max latency (a heartbeat's also past its 1 s wait), and the p99 of the
  client's own part (until the request was written: a client busy with a burst delays its requests);
- tasks handed out per second, against what N trainers need; steps that found fewer rows than a batch;
- the master's CPU (user + system from /proc/PID/stat over the window, in cores) and peak RSS (VmHWM),
  and how long a ``GET /healthz`` (no work) waits for its event loop, probed four times a second from
  this process (which has little else to do);
- the master's own time per heartbeat and task request, long-poll waits left out, from its
  ``edl_master_request_seconds`` histogram over the window (p50/p99 as the bucket bounds that hold them):
  the part of the latency that is the master's, whatever the clients' own delays;
- the client processes' CPU and their event loops' lag (a 50 Hz probe): whether the clients, not the
  master, were the bottleneck. All trainers step in lockstep, so every fourth step (a task is four
  batches) all N ask for a task at once, as real data-parallel ranks do: a burst the client
  processes must send and read too, on the same cores as the master;
- any trainer the master dropped: its status, its log, and what the trainers were told.

Targets: heartbeat (past its wait) and task p99 at most 100 ms, master CPU at most 1 core, no trainer
dropped. With ``--py-spy PATH`` the master is sampled over the window and its hottest functions listed.

Prints a table per N and a summary, and writes bench/results/master_scale.json (per N: the figures
above, the final status, what the trainers were told, the master's log lines about drops). Everything
it starts (master, client processes, py-spy) is stopped and its temporary directory removed, also on
Ctrl-C; ``--keep`` keeps the directory: data, the master's log, the clients' raw samples (JSON).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import json
import math
import os
import random
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import aiohttp
import httpx
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import write_result  # noqa: E402

from edl.api.data import Cursor, Task, cursor_to_json  # noqa: E402
from edl.trainer.prefetch import ASK_SHARE, AskPace  # noqa: E402
from edl.api.master import (  # noqa: E402
    Assignment,
    HeartbeatAnswer,
    JobStatus,
    JobView,
    Next,
    Phase,
    Prepared,
    Registration,
    Source,
    TrainerState,
    Unassigned,
    assignment_from_json,
    next_task_from_json,
)

# What the real trainer does (edl.trainer.*), by the numbers.
HEARTBEAT_WAIT_S = 1.0  # heartbeat.py: Heartbeat.beat's wait_s
HEARTBEAT_RETRY_S = 0.2  # heartbeat.py: after a failed beat
HEARTBEAT_TIMEOUT_S = 10.0  # worker.py: Links.http's heartbeat link
ASSIGNMENT_WAIT_S = 10.0  # worker.py: Trainer.run's long poll
LOOP_TIMEOUT_S = 15.0  # masterlink.py: HttpMaster's default timeout (the loop's link)
LOOP_GIVE_UP_S = 300.0  # masterlink.py: default_give_up_s
PREFETCH_TIMEOUT_S = 10.0  # worker.py: Links.http's prefetch link
PREFETCH_RETRY_S = 0.2  # prefetch.py: after a failed request
PREFETCH_WAIT_S = 0.05  # prefetch.py: after Next.WAIT
COLLECTIVE_SHARE = 0.2  # the last fifth of each simulated step is its all-reduce
CHECKPOINT_WRITE_S = 0.5  # the simulated write between rank 0's cut and its commit
# What the launcher does (edl.launcher.core, edl.launcher.watch).
BEAT_EVERY_S = 1.0
STATUS_WAIT_S = 1.0
PROBE_EVERY_S = 0.25  # the bench's own probe of the master's event loop (GET /healthz)
LAG_PROBE_S = 0.02  # a client process's probe of its own event loop

MAIN_KINDS = ("register", "assignment", "heartbeat", "next_task")
TARGET_P99_S = 0.100
TARGET_MASTER_CORES = 1.0


# ====================================================================== shared by both sides
class Samples:
    """Every call's start (wall clock, comparable across processes), latency, outcome and how long it took
    the client to send it (its own queue: a busy client delays its requests), by kind."""

    def __init__(self) -> None:
        self.t: dict[str, list[float]] = defaultdict(list)
        self.lat: dict[str, list[float]] = defaultdict(list)
        self.out: dict[str, list[str]] = defaultdict(list)
        self.sent: dict[str, list[float]] = defaultdict(list)

    def add(self, kind: str, t: float, latency_s: float, outcome: str, sent_s: float) -> None:
        self.t[kind].append(round(t, 4))
        self.lat[kind].append(round(latency_s, 6))
        self.out[kind].append(outcome)
        self.sent[kind].append(round(sent_s, 6))

    def to_json(self) -> dict[str, dict[str, list]]:
        return {k: {"t": self.t[k], "lat": self.lat[k], "out": self.out[k], "sent": self.sent[k]} for k in self.t}

    def merge_json(self, d: dict[str, dict[str, list]]) -> None:
        for k, v in d.items():
            self.t[k].extend(float(x) for x in v["t"])
            self.lat[k].extend(float(x) for x in v["lat"])
            self.out[k].extend(str(x) for x in v["out"])
            self.sent[k].extend(float(x) for x in v["sent"])


class Rejected(Exception):
    """The master answered 4xx (409: a stale generation)."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(f"{status}: {detail}")
        self.status = status


class Unavailable(Exception):
    """The master did not answer, or answered 5xx."""


async def timed_call(http: httpx.AsyncClient, samples: Samples, kind: str, method: str, path: str, *,
                     body: dict | None = None, params: dict | None = None, timeout_s: float = LOOP_TIMEOUT_S,
                     outcome: Callable[[Any], str] = lambda d: "ok") -> Any:
    """One request as ``HttpMaster._once`` makes it (JSON body, bearer token on the client), timed and recorded,
    with the moment its last byte was written (httpcore's trace): what came before is the client's own delay."""
    t, t0 = time.time(), time.perf_counter()
    sent = [0.0]

    async def trace(event: str, info: dict) -> None:
        if event == "http11.send_request_body.complete":
            sent[0] = time.perf_counter() - t0

    try:
        r = await http.request(method, path, json=body, params=params, extensions={"trace": trace},
                               timeout=httpx.Timeout(timeout_s, connect=min(2.0, timeout_s)))
    except httpx.TransportError as e:
        samples.add(kind, t, time.perf_counter() - t0, f"error:{type(e).__name__}", sent[0])
        raise Unavailable(type(e).__name__) from e
    latency = time.perf_counter() - t0
    if r.status_code >= 500:
        samples.add(kind, t, latency, f"error:{r.status_code}", sent[0])
        raise Unavailable(str(r.status_code))
    if r.status_code >= 400:
        samples.add(kind, t, latency, f"error:{r.status_code}", sent[0])
        raise Rejected(r.status_code, r.text[:200])
    data = r.json()
    samples.add(kind, t, latency, outcome(data), sent[0])
    return data


def _request_sent(trace: aiohttp.TraceConfig) -> aiohttp.TraceConfig:
    """Marks when a request's headers, then each chunk of its body, were written: ``[t0, sent]``, the
    request's own ``trace_request_ctx``."""
    async def sent(session: aiohttp.ClientSession, ctx: Any, params: Any) -> None:
        mark = ctx.trace_request_ctx
        if mark is not None:
            mark[1] = time.perf_counter() - mark[0]

    trace.on_request_headers_sent.append(sent)
    trace.on_request_chunk_sent.append(sent)
    return trace


async def timed_trainer_call(session: aiohttp.ClientSession, samples: Samples, kind: str, method: str, path: str, *,
                             body: dict | None = None, params: dict | None = None, timeout_s: float = LOOP_TIMEOUT_S,
                             outcome: Callable[[Any], str] = lambda d: "ok") -> Any:
    """``timed_call`` for the simulated trainers, on aiohttp: the same request (JSON body, bearer token on the
    session), at a third of httpx's client CPU, so that 1,024 trainers' clients leave the master its share
    of this machine's cores."""
    t, t0 = time.time(), time.perf_counter()
    mark = [t0, 0.0]
    query = None if params is None else {k: str(v) for k, v in params.items()}
    try:
        async with session.request(method, path, json=body, params=query, trace_request_ctx=mark,
                                   timeout=aiohttp.ClientTimeout(total=timeout_s, connect=min(2.0, timeout_s))) as r:
            status, raw = r.status, await r.read()
    except (aiohttp.ClientError, asyncio.TimeoutError) as e:
        samples.add(kind, t, time.perf_counter() - t0, f"error:{type(e).__name__}", mark[1])
        raise Unavailable(type(e).__name__) from e
    latency = time.perf_counter() - t0
    if status >= 500:
        samples.add(kind, t, latency, f"error:{status}", mark[1])
        raise Unavailable(str(status))
    if status >= 400:
        samples.add(kind, t, latency, f"error:{status}", mark[1])
        raise Rejected(status, raw[:200].decode(errors="replace"))
    data = json.loads(raw)
    samples.add(kind, t, latency, outcome(data), mark[1])
    return data


def die_with_parent() -> None:
    """SIGKILL when this process dies: a benchmark leaves no simulated trainer behind."""
    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


# ====================================================================== the client side: simulated trainers
@dataclass(frozen=True)
class WorkerConfig:
    """What one client process simulates (written as JSON by the parent; the token comes in EDL_TOKEN)."""

    index: int
    address: str
    trainers: list[str]
    orders: list[int]  # each trainer's place among all N (its registration time in the ramp)
    total: int  # N
    step_s: float
    batch: int
    checkpoint_interval_s: float
    ramp_s: float
    start_at: float  # wall clock: the ramp starts here
    max_run_s: float  # a safety net: stop on our own after this long
    out: str  # where the results go (JSON)
    ask_share: float = ASK_SHARE  # the trainers' AskPace share (0: every ask at once)


class SimBuffer:
    """``edl.trainer.data.TaskBuffer`` without the rows: held tasks in order, rows consumed of the first."""

    def __init__(self, low_rows: int) -> None:
        self.tasks: list[Task] = []
        self.offset = 0
        self.cursor: Cursor | None = None
        self.low_rows = low_rows  # the prefetch wants more below this
        self.low = asyncio.Event()  # set while under ``low_rows``
        self.low.set()
        self.short = asyncio.Event()  # set while under one batch (half of ``low_rows``): ask at once
        self.short.set()
        self.rows_taken = 0  # ``TaskBuffer.rows_taken``
        self.lineage = 0  # ``TaskBuffer``'s: bumped whenever the held tasks are replaced

    def remaining(self) -> int:
        return sum(t.size for t in self.tasks) - self.offset

    def _changed(self) -> None:
        held = self.remaining()
        for event, below in ((self.low, self.low_rows), (self.short, self.low_rows // 2)):
            if held < below:
                event.set()
            else:
                event.clear()

    def add(self, task: Task) -> bool:
        if any(t.id == task.id for t in self.tasks):
            return False
        self.tasks.append(task)
        self._changed()
        return True

    def take(self, n: int) -> int:
        """Up to ``n`` rows, crossing task boundaries; the rows taken."""
        taken = self._take(n)
        self.rows_taken += taken
        self._changed()
        return taken

    def _take(self, n: int) -> int:
        taken = 0
        while n > 0 and self.tasks:
            t = self.tasks[0]
            k = min(n, t.size - self.offset)
            n, taken, self.offset = n - k, taken + k, self.offset + k
            self.cursor = Cursor(t.id, self.offset)
            if self.offset >= t.size:
                self.tasks.pop(0)
                self.offset = 0
        return taken

    def reposition(self, cursor: Cursor | None, held: list[Task], offset: int) -> None:
        self.tasks, self.offset, self.cursor = list(held), offset if held else 0, cursor
        self.lineage += 1
        self._changed()

    def clear(self) -> None:
        self.reposition(None, [], 0)


class Control:
    """What the heartbeat learned (``edl.trainer.heartbeat.Control``, without threads)."""

    def __init__(self) -> None:
        self.master_uid: str | None = None
        self.reset(None)

    def reset(self, master_uid: str | None) -> None:
        self.master_uid = master_uid
        self.stop_generation = -1
        self.abort_through = -1
        self.job_done = False
        self.master_changed = False
        self.dropped = False
        self.checkpoint = False
        self.prepared: tuple[int, bool] = (0, False)

    def learn(self, a: HeartbeatAnswer) -> None:
        if self.master_uid is not None and a.master_uid != self.master_uid:
            self.master_changed = self.master_changed or not a.known
            return
        if a.stop:
            self.stop_generation = a.generation
        if a.abort:
            self.abort_through = max(self.abort_through, a.abort_through)
        self.prepared = (0, False) if a.prepared is None else (a.prepared.generation, a.prepared.go)
        self.dropped = self.dropped or a.state is TrainerState.FAILED
        self.job_done = self.job_done or a.job_status is not JobStatus.RUNNING or a.abandoned
        self.checkpoint = a.checkpoint

    def stops(self, generation: int) -> bool:
        return self.stop_generation == generation or self.master_changed or self.job_done

    def aborts(self, generation: int) -> bool:
        return generation <= self.abort_through


class Worker:
    """One client process: its trainers, their HTTP clients (three each), the step clock they share."""

    def __init__(self, cfg: WorkerConfig, token: str) -> None:
        self.cfg = cfg
        self.samples = Samples()
        self.base_url, self.headers = f"http://{cfg.address}", {"Authorization": f"Bearer {token}"}
        self.links: list[aiohttp.ClientSession] = []
        self.trace = _request_sent(aiohttp.TraceConfig())
        self.alive = True
        self.stop = asyncio.Event()
        self.cursors: dict[str, Cursor | None] = {}  # every trainer's cursor at its last step (its slots)
        self.events: list[dict[str, Any]] = []
        self.ticks: dict[str, list[float]] = {"t": [], "lag": [], "stepping": [], "short": [], "empty": []}
        self.lags: dict[str, list[float]] = {"t": [], "lag": []}  # the event loop's, LAG_PROBE_S apart
        self.trainers = [SimTrainer(self, tid, order) for tid, order in zip(cfg.trainers, cfg.orders)]
        self.background: set[asyncio.Task] = set()

    def event(self, trainer: str, what: str, detail: str = "") -> None:
        self.events.append({"t": round(time.time(), 3), "trainer": trainer, "what": what, "detail": detail})

    def spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self.background.add(task)
        task.add_done_callback(self.background.discard)

    def link(self) -> aiohttp.ClientSession:
        """A client of its own, as each of a trainer's links (``HttpMaster``) is: its own connections."""
        session = aiohttp.ClientSession(base_url=self.base_url, headers=self.headers,
                                        connector=aiohttp.TCPConnector(limit=4), trace_configs=[self.trace])
        self.links.append(session)
        return session

    async def call(self, link: aiohttp.ClientSession, kind: str, method: str, path: str, **kw: Any) -> Any:
        return await timed_trainer_call(link, self.samples, kind, method, path, **kw)

    async def loop_call(self, link: aiohttp.ClientSession, kind: str, method: str, path: str, **kw: Any) -> Any:
        """A link that retries while the master is unavailable (``HttpMaster._request``)."""
        deadline, wait = time.monotonic() + LOOP_GIVE_UP_S, 0.05
        while True:
            try:
                return await self.call(link, kind, method, path, **kw)
            except Unavailable:
                if not self.alive or time.monotonic() > deadline:
                    raise
                await asyncio.sleep(wait)
                wait = min(1.0, wait * 2)

    async def clock(self) -> None:
        """The shared step clock: every stepping trainer takes its step at each multiple of ``step_s``
        (wall clock: the client processes step together, as the ranks of an all-reduce do)."""
        step_s = self.cfg.step_s
        k = math.ceil(time.time() / step_s)
        while self.alive:
            await asyncio.sleep(max(0.0, k * step_s - time.time()))
            now = time.time()
            stepping = [t for t in self.trainers if t.stepping]
            short = empty = 0
            for t in stepping:
                rows = t.tick(now)
                short += rows < self.cfg.batch
                empty += rows == 0
            for t in stepping:  # once all stepped: the cursors of this step are every rank's (the slots)
                t.after_step()
            for key, value in (("t", round(now, 3)), ("lag", round(now - k * step_s, 5)),
                               ("stepping", len(stepping)), ("short", short), ("empty", empty)):
                self.ticks[key].append(value)
            k = max(k + 1, math.ceil(time.time() / step_s))  # a late clock skips the steps it missed

    async def lag_probe(self) -> None:
        """How late this process's event loop wakes a sleeper: while it is busy (say sending a burst of
        requests, or reading their answers), every request and answer of its trainers waits that long too."""
        while self.alive:
            t0 = time.perf_counter()
            await asyncio.sleep(LAG_PROBE_S)
            self.lags["t"].append(round(time.time(), 3))
            self.lags["lag"].append(round(time.perf_counter() - t0 - LAG_PROBE_S, 5))

    async def run(self) -> None:
        loop = asyncio.get_running_loop()

        def told() -> None:  # a line, or EOF (the parent went away)
            loop.remove_reader(sys.stdin.fileno())
            self.stop.set()

        loop.add_reader(sys.stdin.fileno(), told)
        loop.call_later(self.cfg.max_run_s, self.stop.set)
        self.spawn(self.clock())
        self.spawn(self.lag_probe())
        for t in self.trainers:
            self.spawn(t.run())
        await self.stop.wait()
        self.alive = False
        for task in list(self.background):
            task.cancel()
        await asyncio.gather(*self.background, return_exceptions=True)
        await asyncio.gather(*(link.close() for link in self.links), return_exceptions=True)
        Path(self.cfg.out).write_text(json.dumps({
            "index": self.cfg.index, "trainers": len(self.trainers), "samples": self.samples.to_json(),
            "ticks": self.ticks, "lags": self.lags, "events": self.events,
            "joined": sum(t.joined for t in self.trainers), "gone": sum(t.gone for t in self.trainers),
        }))


class SimTrainer:
    """One trainer as the master sees it: ``edl.trainer.worker.Trainer``'s calls, with a simulated step."""

    def __init__(self, worker: Worker, trainer_id: str, order: int) -> None:
        self.w = worker
        self.id = trainer_id
        self.order = order
        self.base = f"/v1/trainers/{trainer_id}"
        self.store_port = 20000 + order % 40000  # never listened on: nobody forms a collective here
        # The trainer's links (``Links.http``): the loop's (its reports too), the heartbeat's, the prefetch's.
        self.loop, self.hb_link, self.prefetch_link = worker.link(), worker.link(), worker.link()
        self.ctl = Control()
        self.buffer = SimBuffer(2 * worker.cfg.batch)
        self.pace = AskPace(share=worker.cfg.ask_share)
        self.assignment: Assignment | None = None
        self.generation = 0
        self.step = 0
        self.loss: float | None = None
        self.safe_cursor: Cursor | None = None
        self.prev_own: Cursor | None = None
        self.stepping = False
        self.aborting = False
        self.last_rows = 0
        self.first_step_pending = False
        self.last_checkpoint = time.monotonic()  # ``Checkpointer._last``: since the trainer started
        self.finished_in: int | None = None  # the buffer's lineage in which the master handed out every task
        self.request_id = uuid.uuid4().hex
        self.request_lineage = 0  # the buffer's lineage ``request_id`` was made under
        self.in_generation = asyncio.Event()
        self.generation_over = asyncio.Event()
        self.joined = False
        self.gone = False

    # ------------------------------------------------------------ the loop (Trainer.run)
    async def run(self) -> None:
        cfg = self.w.cfg
        await asyncio.sleep(max(0.0, cfg.start_at + cfg.ramp_s * self.order / max(1, cfg.total) - time.time()))
        try:
            await self.w.loop_call(self.loop, "spec", "GET", "/v1/spec")
            await self.register()
            self.w.spawn(self.heartbeat())
            self.w.spawn(self.prefetch())
            after = 0
            while self.w.alive:
                d = await self.w.loop_call(self.loop, "assignment", "GET", f"{self.base}/assignment",
                                           params={"after": max(after, self.generation), "wait_s": ASSIGNMENT_WAIT_S},
                                           timeout_s=ASSIGNMENT_WAIT_S + LOOP_TIMEOUT_S,
                                           outcome=lambda d: str(d["status"]))
                a = assignment_from_json(d)
                if isinstance(a, Assignment):
                    self.join(a)
                    await self.generation_over.wait()
                    continue
                if isinstance(a, Prepared):
                    # A graceful change: not simulated (the job's size is fixed), so it does not come.
                    self.w.event(self.id, "prepared", f"generation {a.generation}")
                    after = a.generation
                    continue
                if a.why is Unassigned.WAIT:
                    continue
                if a.why is Unassigned.UNKNOWN:
                    self.w.event(self.id, "unknown", "the master does not know us: registering again")
                    self.generation, self.safe_cursor = 0, None
                    self.in_generation.clear()
                    self.buffer.clear()
                    self.pace.restart()
                    await self.register()
                    continue
                self.w.event(self.id, f"assignment_{a.why.value}",
                             "" if a.job_status is None else a.job_status.value)
                return
        except (Unavailable, Rejected) as e:
            self.w.event(self.id, "gave_up", str(e))
        finally:
            self.stepping = False
            self.gone = True

    async def register(self) -> None:
        body = {"pid": os.getpid(), "host": "127.0.0.1", "store_port": self.store_port}
        d = await self.w.loop_call(self.loop, "register", "POST", f"{self.base}/register", body=body)
        self.ctl.reset(Registration.from_json(d).master_uid)

    @property
    def finished_now(self) -> bool:
        """The master handed out every task, as it said since the buffer was last replaced (``Prefetcher.finished``)."""
        return self.finished_in is not None and self.finished_in == self.buffer.lineage

    def join(self, a: Assignment) -> None:
        """``Trainer._join`` without the collective: keep the data (from a peer) or start from the queue."""
        self.assignment, self.generation = a, a.generation
        self.pace.restart()
        if a.source is Source.PEER:
            self.buffer.reposition(a.cursor, list(a.held), a.held_offset)
        else:
            self.buffer.clear()
            self.safe_cursor = None
        self.prev_own = self.buffer.cursor
        self.first_step_pending = True
        self.aborting = False
        self.generation_over.clear()
        self.in_generation.set()
        self.stepping = True
        self.joined = True

    # ------------------------------------------------------------ one step (on the shared clock)
    def tick(self, now: float) -> int:
        """One training step: a batch from the buffer; the rows it took (a full batch when it aborts)."""
        a = self.assignment
        assert a is not None  # stepping
        if self.ctl.aborts(a.generation):  # a member failed: the step's collective cannot complete
            self.aborting = True
            return self.w.cfg.batch
        rows = self.buffer.take(self.w.cfg.batch)
        self.safe_cursor = self.prev_own  # every rank finished the step before this one
        self.prev_own = self.buffer.cursor
        self.w.cursors[self.id] = self.buffer.cursor
        self.last_rows = rows
        if rows:
            self.step += 1
            self.loss = 1.0 / (1.0 + 0.01 * self.step)
        return rows if rows or not self.finished_now else self.w.cfg.batch

    def after_step(self) -> None:
        """What the step decided (``decide_step``), once every trainer of this process took it."""
        a = self.assignment
        assert a is not None
        if self.aborting:
            self.end_generation(failed=True)
            return
        if a.rank == 0:
            self.rank0_duties(a, self.last_rows > 0)
        if self.last_rows == 0 and self.finished_now:
            # Out of data: training is done; rank 0 ends the job (``Trainer._finish``, without a model).
            self.w.event(self.id, "out_of_data", f"step {self.step}")
            self.stepping = False
            if a.rank == 0:
                self.w.spawn(self.once("finish", "/v1/finish",
                                       {"step": self.step, "final_model_uri": None, "metrics": {}}))
        elif self.ctl.stops(a.generation):
            self.end_generation(failed=False)

    def rank0_duties(self, a: Assignment, stepped: bool) -> None:
        if self.first_step_pending and stepped:
            self.first_step_pending = False
            self.w.spawn(self.once("first_step", f"{self.base}/first-step", {"generation": a.generation}))
        interval = self.w.cfg.checkpoint_interval_s
        if (interval > 0 and time.monotonic() - self.last_checkpoint >= interval) or self.ctl.checkpoint:
            self.last_checkpoint = time.monotonic()
            self.ctl.checkpoint = False
            cursors = {m: cursor_to_json(self.w.cursors.get(m)) for m in a.members}
            self.w.spawn(self.checkpoint(a.generation, self.step, cursors))

    async def once(self, kind: str, path: str, body: dict) -> Any:
        """A report tried once (the trainer's ``once`` link)."""
        with contextlib.suppress(Unavailable, Rejected):
            return await self.w.call(self.loop, kind, "POST", path, body=body)
        return None

    async def checkpoint(self, generation: int, step: int, cursors: dict[str, Any]) -> None:
        """Rank 0's checkpoint as ``Checkpointer.save`` makes it: the cut, the write, the commit."""
        cut = await self.once("checkpoint_cut", "/v1/checkpoints/cut",
                              {"generation": generation, "step": step, "cursors": cursors})
        if cut is None:
            return
        await asyncio.sleep(CHECKPOINT_WRITE_S)
        with contextlib.suppress(Unavailable, Rejected):
            await self.w.loop_call(self.loop, "checkpoint_committed", "POST", "/v1/checkpoints/committed",
                                   body={"generation": generation, "step": step, "write_s": CHECKPOINT_WRITE_S,
                                         "uri": f"sim://checkpoints/step-{step:08d}"})

    def end_generation(self, failed: bool) -> None:
        """Stop at this step and report it with the cursors this process knows (``Trainer._report``)."""
        a = self.assignment
        assert a is not None
        self.stepping = False
        self.w.event(self.id, "abort" if failed else "stop", f"generation {a.generation} step {self.step}")
        body = {"generation": a.generation, "step": self.step, "store_port": self.store_port, "failed": failed,
                "cursors": {m: cursor_to_json(self.w.cursors.get(m)) for m in a.members}, "switched_to": 0}

        async def report() -> None:
            try:
                await self.w.loop_call(self.loop, "sync", "POST", f"{self.base}/sync", body=body)
            except (Unavailable, Rejected) as e:
                self.w.event(self.id, "sync_failed", str(e))
            self.generation_over.set()

        self.w.spawn(report())

    # ------------------------------------------------------------ beside the loop
    def in_collective_s(self) -> float | None:
        """How long the simulated step has been in its all-reduce (its last ``COLLECTIVE_SHARE``), or None."""
        if not self.stepping:
            return None
        step_s = self.w.cfg.step_s
        into = time.time() % step_s
        start = (1.0 - COLLECTIVE_SHARE) * step_s
        return into - start if into >= start else None

    async def heartbeat(self) -> None:
        """``Heartbeat.run``: one beat after the other, each waiting up to 1 s for news."""
        while self.w.alive and not self.gone:
            heard = self.ctl.prepared
            body = {"generation": self.generation, "step": self.step, "wait_s": HEARTBEAT_WAIT_S,
                    "safe_cursor": cursor_to_json(self.safe_cursor), "loss": self.loss,
                    "in_collective_s": self.in_collective_s(), "store_port": self.store_port,
                    "prepared": heard[0], "go": heard[1]}

            def outcome(d: dict) -> str:
                told = (0, False) if d["prepared"] is None else (d["prepared"]["generation"], d["prepared"]["go"])
                return "news" if d["stop"] or d["abort"] or not d["known"] or told != heard else "waited"

            try:
                d = await self.w.call(self.hb_link, "heartbeat", "POST", f"{self.base}/heartbeat", body=body,
                                      timeout_s=HEARTBEAT_TIMEOUT_S, outcome=outcome)
            except (Unavailable, Rejected):
                await asyncio.sleep(HEARTBEAT_RETRY_S)
                continue
            a = HeartbeatAnswer.from_json(d)
            if a.state is TrainerState.FAILED and not self.ctl.dropped:
                self.w.event(self.id, "dropped", "the heartbeat's answer: state failed")
            self.ctl.learn(a)
            if not a.known:
                await asyncio.sleep(0.1)

    async def prefetch(self) -> None:
        """``Prefetcher.run``: a task whenever the buffer holds under two batches, asked for at the moment
        ``AskPace`` picks (at once while the buffer holds under a batch)."""
        while self.w.alive and not self.gone:
            if self.finished_now:
                return
            if self.generation == 0:
                await self.in_generation.wait()  # the real one looks again every 10 ms (no requests)
                continue
            if not self.buffer.low.is_set():
                # The real one wakes every FULL_WAIT_S to look at ``alive``; cancelling does that here, and
                # the master sees the same calls either way.
                await self.buffer.low.wait()
                continue
            self.pace.observe(time.monotonic(), self.buffer.rows_taken)
            delay = self.pace.delay_s(self.buffer.remaining(), random.random())
            if delay > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.buffer.short.wait(), delay)
            lineage = self.buffer.lineage  # ``TaskBuffer.ticket``, as the trainer's prefetch
            if lineage != self.request_lineage:
                self.request_id, self.request_lineage = uuid.uuid4().hex, lineage
            body = {"request_id": self.request_id, "safe_cursor": cursor_to_json(self.safe_cursor),
                    "master_uid": self.ctl.master_uid, "generation": self.generation}
            try:
                d = await self.w.call(self.prefetch_link, "next_task", "POST", f"{self.base}/task", body=body,
                                      timeout_s=PREFETCH_TIMEOUT_S, outcome=lambda d: str(d["status"]))
            except (Unavailable, Rejected):
                await asyncio.sleep(PREFETCH_RETRY_S)  # the same request id next time
                continue
            self.request_id = uuid.uuid4().hex
            r = next_task_from_json(d)
            if isinstance(r, Task):
                if lineage == self.buffer.lineage:
                    self.buffer.add(r)
            elif r is Next.FINISHED:
                self.finished_in = lineage
            else:
                await asyncio.sleep(PREFETCH_WAIT_S)


def worker_main(config_path: str) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's: it stops us
    cfg = WorkerConfig(**json.loads(Path(config_path).read_text()))
    token = os.environ["EDL_TOKEN"]
    try:
        import uvloop  # the client's own overhead as low as it goes (uvicorn uses it too, where installed)

        runner: Callable[..., Any] = uvloop.run
    except ImportError:
        runner = asyncio.run

    async def main() -> None:
        await Worker(cfg, token).run()

    runner(main())
    return 0


# ====================================================================== the parent: master, launcher, analysis
def cpu_s(pid: int) -> float:
    """User + system CPU seconds of one process (0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def vm_kib(pid: int, key: str) -> int:
    """A ``/proc/PID/status`` memory figure (VmHWM: peak RSS; VmRSS) in KiB; 0 once the process is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def pct(values: list[float], q: float) -> float:
    """The nearest-rank ``q`` quantile (0 for no values)."""
    if not values:
        return 0.0
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


@dataclass
class Launcher:
    """This process as the job's launcher: a beat a second, and the long poll of the status."""

    http: httpx.AsyncClient
    samples: Samples
    latest: JobView | None = None
    tasks: list[asyncio.Task] = field(default_factory=list)

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self.tasks = [loop.create_task(self._beat()), loop.create_task(self._watch()), loop.create_task(self._probe())]

    async def stop(self) -> None:
        for t in self.tasks:
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)

    async def _beat(self) -> None:
        while True:
            with contextlib.suppress(Unavailable, Rejected):
                await timed_call(self.http, self.samples, "launcher_beat", "POST", "/v1/launcher/beat", timeout_s=5.0)
            await asyncio.sleep(BEAT_EVERY_S)

    async def _probe(self) -> None:
        """Not the launcher's: ``GET /healthz`` (no work in the master) four times a second, whose latency is the
        time a request waits for the master's event loop (a Kubernetes liveness probe asks the same)."""
        while True:
            with contextlib.suppress(Unavailable, Rejected):
                await timed_call(self.http, self.samples, "healthz_probe", "GET", "/healthz", timeout_s=10.0)
            await asyncio.sleep(PROBE_EVERY_S)

    async def _watch(self) -> None:
        after = 0
        while True:
            params = {"after": after, "wait_s": STATUS_WAIT_S} if after else None
            try:
                d = await timed_call(self.http, self.samples, "status", "GET", "/v1/status", params=params,
                                     timeout_s=STATUS_WAIT_S + 10.0)
            except (Unavailable, Rejected):
                await asyncio.sleep(0.1)
                continue
            self.latest = JobView.from_json(d)
            after = self.latest.control_version


@dataclass
class RunConfig:
    trainers: int
    clients: int
    duration_s: float
    settle_s: float
    step_s: float
    batch: int
    rows_per_task: int
    checkpoint_interval_s: float
    ramp_s: float
    ready_timeout_s: float
    py_spy: str | None
    ask_share: float = ASK_SHARE


class Started:
    """What one run started, stopped in ``close`` whatever happened (also on Ctrl-C)."""

    def __init__(self) -> None:
        self.master: Any = None  # edl.cluster.local.Proc
        self.workers: list[subprocess.Popen] = []
        self.spy: subprocess.Popen | None = None
        self.files: list[Any] = []

    def close(self) -> None:
        from edl.cluster.local import LocalProcesses

        for p in self.workers:
            if p.poll() is None and p.stdin is not None:
                with contextlib.suppress(OSError):
                    p.stdin.close()  # EOF: the client stops
        if self.spy is not None and self.spy.poll() is None:
            self.spy.send_signal(signal.SIGINT)  # py-spy stops sampling and exits
        for p in [*self.workers, *([self.spy] if self.spy else [])]:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        if self.master is not None:
            LocalProcesses.stop_all([self.master], grace_s=5.0)
        for f in self.files:
            f.close()


async def wait_until(pred: Callable[[], bool], timeout_s: float, what: str, alive: Callable[[], str | None]) -> float:
    """Poll ``pred`` until it holds; the seconds it took. ``alive`` names a process that died (then: fail)."""
    t0 = time.monotonic()
    while not pred():
        if (dead := alive()) is not None:
            raise RuntimeError(f"{dead} while waiting for {what}")
        if time.monotonic() - t0 > timeout_s:
            raise TimeoutError(f"{what}: not within {timeout_s:.0f} s")
        await asyncio.sleep(0.1)
    return time.monotonic() - t0


async def run_one(rc: RunConfig, data: Path, epochs: int, tmp: Path, started: Started,
                  console: Console) -> dict[str, Any]:
    """One master, ``rc.trainers`` simulated trainers: the raw measurements of its steady window."""
    from edl.api.spec import JobSpec
    from edl.cluster.local import LocalProcesses
    from edl.jobargs import spec_to_argv
    from edl.jobcheck import prepare_job
    from edl.net import free_port

    n = rc.trainers
    run_dir = tmp / f"n{n}-share{rc.ask_share:g}"
    run_dir.mkdir()
    spec = JobSpec(job=f"master-scale-{n}", model_def="edl.zoo.mlp", data=str(data), epochs=epochs,
                   batch_size=rc.batch, min_trainers=n, max_trainers=n, trainers=n,
                   checkpoint_uri=str(run_dir / "checkpoints"), rows_per_task=rc.rows_per_task,
                   checkpoint_interval_s=rc.checkpoint_interval_s if rc.checkpoint_interval_s > 0 else 1e9)
    spec = prepare_job(spec).spec  # as the launcher does: data resolved, checked, the prefix claimable
    token, port = secrets.token_urlsafe(32), free_port()
    address = f"127.0.0.1:{port}"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    procs = LocalProcesses(run_dir / "logs", env)
    started.master = procs.spawn("master", ["master", *spec_to_argv(spec), "--port", str(port)],
                                 {"EDL_TOKEN": token})
    master_pid = started.master.pid

    def dead() -> str | None:
        if started.master.poll() is not None:
            return f"the master exited (code {started.master.poll()}; log {started.master.log_path})"
        for i, p in enumerate(started.workers):
            if p.poll() is not None:
                return f"client process {i} exited (code {p.returncode}; log {run_dir / f'client-{i}.log'})"
        return None

    samples = Samples()
    http = httpx.AsyncClient(base_url=f"http://{address}", headers={"Authorization": f"Bearer {token}"})
    launcher = Launcher(http, samples)
    result: dict[str, Any] = {"trainers": n, "clients": rc.clients, "epochs": epochs}
    try:
        async def healthy() -> bool:
            with contextlib.suppress(httpx.TransportError):
                return (await http.get("/healthz", timeout=1.0)).status_code == 200
            return False

        t0 = time.monotonic()
        while not await healthy():
            if (d := dead()) is not None:
                raise RuntimeError(d)
            if time.monotonic() - t0 > 60:
                raise TimeoutError("the master did not answer within 60 s")
            await asyncio.sleep(0.1)
        result["master_start_s"] = round(time.monotonic() - t0, 3)
        launcher.start()

        # The client processes: trainer i goes to process i % clients; all start their ramp together.
        start_at = time.time() + 1.0
        ids = [f"t{i:05d}" for i in range(n)]
        for c in range(rc.clients):
            mine = list(range(c, n, rc.clients))
            cfg = WorkerConfig(index=c, address=address, trainers=[ids[i] for i in mine], orders=mine, total=n,
                               step_s=rc.step_s, batch=rc.batch, checkpoint_interval_s=rc.checkpoint_interval_s,
                               ramp_s=rc.ramp_s, start_at=start_at, out=str(run_dir / f"client-{c}.json"),
                               max_run_s=rc.ready_timeout_s + rc.settle_s + rc.duration_s + 120,
                               ask_share=rc.ask_share)
            cfg_path = run_dir / f"client-{c}.config.json"
            cfg_path.write_text(json.dumps(asdict(cfg)))
            log = (run_dir / f"client-{c}.log").open("wb")
            started.files.append(log)
            started.workers.append(subprocess.Popen(
                [sys.executable, str(Path(__file__).resolve()), "--worker", str(cfg_path)],
                stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT,
                env={**env, "EDL_TOKEN": token}, preexec_fn=die_with_parent))

        def formed() -> bool:
            v = launcher.latest
            return v is not None and v.phase is Phase.RUNNING and v.world_size == n

        console.print(f"  {n} trainers: registering over {rc.ramp_s:g} s, waiting for the generation of {n}")
        await wait_until(formed, rc.ready_timeout_s, f"a generation of {n}", dead)
        result["formed_after_ramp_start_s"] = round(time.time() - start_at, 3)
        console.print(f"  generation of {n} formed {result['formed_after_ramp_start_s']:.1f} s after the first "
                      f"registration; settling {rc.settle_s:g} s, then measuring {rc.duration_s:g} s")
        await asyncio.sleep(rc.settle_s)

        pids = {"master": master_pid, **{f"client-{i}": p.pid for i, p in enumerate(started.workers)}}
        cpu0 = {k: cpu_s(p) for k, p in pids.items()}
        self0 = sum(os.times()[:2])
        times0 = await request_times(http)
        w0, m0 = time.time(), time.monotonic()
        if rc.py_spy:
            spy_out = run_dir / "master.pyspy.txt"
            started.spy = subprocess.Popen(
                [rc.py_spy, "record", "--pid", str(master_pid), "--duration", str(int(rc.duration_s)),
                 "--rate", "50", "--format", "raw", "--nonblocking", "--output", str(spy_out)],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=die_with_parent)
        end = m0 + rc.duration_s
        while time.monotonic() < end:
            if (d := dead()) is not None:
                raise RuntimeError(d)
            await asyncio.sleep(min(0.5, max(0.0, end - time.monotonic())))
        w1, m1 = time.time(), time.monotonic()
        cpu1 = {k: cpu_s(p) for k, p in pids.items()}
        self1 = sum(os.times()[:2])
        result["master_side"] = master_side(times0, await request_times(http))
        window = m1 - m0
        result.update(window=[w0, w1], window_s=round(window, 3),
                      cpu_cores={k: round((cpu1[k] - cpu0[k]) / window, 3) for k in pids},
                      launcher_cpu_cores=round((self1 - self0) / window, 3),
                      master_peak_rss_mib=round(vm_kib(master_pid, "VmHWM") / 1024, 1),
                      master_rss_mib=round(vm_kib(master_pid, "VmRSS") / 1024, 1))
        result["final_status"] = await final_status(http)
        if started.spy is not None:
            try:
                started.spy.wait(30)
                result["py_spy"] = summarize_py_spy(run_dir / "master.pyspy.txt")
            except subprocess.TimeoutExpired:
                result["py_spy"] = {"error": "py-spy did not finish"}
    except (RuntimeError, TimeoutError) as e:
        # What was measured before (the registrations, say) is still reported, beside the error.
        console.print(f"  [red]run with {n} trainers failed: {e}[/red]")
        result["error"] = str(e)
        with contextlib.suppress(Unavailable, Rejected, httpx.HTTPError):
            result["final_status"] = await final_status(http)
    finally:
        # Stop the clients first (their results), then the launcher's calls, then the master.
        for p in started.workers:
            with contextlib.suppress(OSError):
                if p.stdin:
                    p.stdin.write(b"stop\n")
                    p.stdin.flush()
        deadline = time.monotonic() + 30
        while any(p.poll() is None for p in started.workers) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        await launcher.stop()
        with contextlib.suppress(Unavailable, Rejected):
            await timed_call(http, samples, "shutdown", "POST", "/v1/shutdown", timeout_s=5.0)
        await http.aclose()
    # The clients' results (JSON files), merged with the launcher's.
    clients: list[dict[str, Any]] = []
    for c in range(rc.clients):
        path = run_dir / f"client-{c}.json"
        if path.exists():
            clients.append(json.loads(path.read_text()))
    for client in clients:
        samples.merge_json(client["samples"])
    result["samples"] = samples
    result["clients_data"] = clients
    result["master_log"] = started.master.log_path.read_text(errors="replace") if started.master else ""
    return result


async def final_status(http: httpx.AsyncClient) -> dict[str, Any]:
    """The master's status (one plain GET), as much of it as says who is still in the job."""
    d = await timed_call(http, Samples(), "status", "GET", "/v1/status", timeout_s=30.0)
    v = JobView.from_json(d)
    return {
        "status": v.status.value, "phase": v.phase.value, "generation": v.generation, "world_size": v.world_size,
        "step": v.step, "epoch": v.epoch, "trainers_listed": len(v.trainers),
        "trainer_states": dict(Counter(t.state.value for t in v.trainers)),
        "generations": [{"id": g.id, "world_size": g.world_size, "reason": g.reason.value} for g in v.generations],
        "checkpoints": len(v.checkpoints),
    }


ROUTES = {"heartbeat": "/v1/trainers/{trainer}/heartbeat", "next_task": "/v1/trainers/{trainer}/task",
          "status": "/v1/status"}


async def request_times(http: httpx.AsyncClient) -> dict[str, dict[str, float]]:
    """The master's own histogram of its time per request, long-poll waits left out
    (``edl_master_request_seconds``): per route, the cumulative count under each bound, the count and sum."""
    from prometheus_client.parser import text_string_to_metric_families

    r = await http.get("/metrics", timeout=30.0)
    out: dict[str, dict[str, float]] = defaultdict(dict)
    for family in text_string_to_metric_families(r.text):
        if family.name != "edl_master_request_seconds":
            continue
        for sample in family.samples:
            route = sample.labels["route"]
            if sample.name.endswith("_bucket"):
                out[route][sample.labels["le"]] = sample.value
            else:
                out[route][sample.name.rsplit("_", 1)[1]] = sample.value  # count, sum
    return out


def master_side(before: dict[str, dict[str, float]], after: dict[str, dict[str, float]]) -> dict[str, Any]:
    """Over the window, per call kind: requests, the master's mean time, and the bucket bounds that hold
    its p50 and p99 (an upper bound: the histogram's resolution)."""
    out: dict[str, Any] = {}
    for kind, route in ROUTES.items():
        a, b = after.get(route, {}), before.get(route, {})
        n = a.get("count", 0.0) - b.get("count", 0.0)
        if n <= 0:
            continue
        bounds = sorted((float(le), a[le] - b.get(le, 0.0)) for le in a if le not in ("count", "sum"))

        def under(q: float) -> float:
            return next(bound for bound, c in bounds if c >= q * n)

        out[kind] = {"calls": int(n), "mean_ms": round(1000 * (a["sum"] - b.get("sum", 0.0)) / n, 2),
                     "p50_le_ms": 1000 * under(0.5), "p99_le_ms": 1000 * under(0.99)}
    return out


def summarize_py_spy(path: Path, top: int = 15) -> dict[str, Any]:
    """The hottest functions of a py-spy ``--format raw`` profile (collapsed stacks, busy samples only): by
    their own samples, and edl's functions by the samples they are anywhere in the stack of."""
    own: Counter[str] = Counter()
    anywhere: Counter[str] = Counter()
    total = 0
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return {"error": f"no profile at {path}"}
    for line in lines:
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        k = int(count)
        frames = [f.strip() for f in stack.split(";") if f.strip()]
        total += k
        if frames:
            own[frames[-1]] += k
        # The master's own functions (by name and file, all their lines together), wherever in the stack.
        for f in {re.sub(r":\d+\)$", ")", f) for f in frames}:
            if "edl/" in f and not any(skip in f for skip in ("edl/__main__", "edl/cli/", "edl/master/main.py")):
                anywhere[f] += k
    share = (lambda c: [[f, round(k / total, 4)] for f, k in c.most_common(top)]) if total else (lambda c: [])
    return {"samples": total, "own": share(own), "anywhere": share(anywhere)}


def analyze(raw: dict[str, Any], rc: RunConfig) -> dict[str, Any]:
    """The figures of one run from its raw measurements."""
    samples: Samples = raw.pop("samples")
    clients: list[dict[str, Any]] = raw.pop("clients_data")
    master_log: str = raw.pop("master_log")
    out = dict(raw)
    w0, w1 = raw.get("window", [math.inf, math.inf])
    window_s = raw.get("window_s", 0.0) or 1.0
    kinds: dict[str, Any] = {}
    for kind in sorted(samples.t, key=lambda k: (k not in MAIN_KINDS, MAIN_KINDS.index(k) if k in MAIN_KINDS else 0,
                                                   k)):
        rows = list(zip(samples.t[kind], samples.lat[kind], samples.out[kind], samples.sent[kind]))
        steady = [r for r in rows if w0 <= r[0] < w1]
        startup = [r for r in rows if r[0] < w0]

        def figures(rs: list[tuple[float, float, str, float]], per_s: float | None) -> dict[str, Any]:
            ok = [r for r in rs if not r[2].startswith("error")]
            lat = [r[1] for r in ok]
            f: dict[str, Any] = {"calls": len(rs), "errors": len(rs) - len(ok),
                                 "p50_ms": round(1000 * pct(lat, 0.5), 2), "p99_ms": round(1000 * pct(lat, 0.99), 2),
                                 "max_ms": round(1000 * max(lat, default=0.0), 2),
                                 # the client's part (before the request was written), and the rest
                                 "client_send_p99_ms": round(1000 * pct([r[3] for r in ok], 0.99), 2),
                                 "after_send_p99_ms": round(1000 * pct([r[1] - r[3] for r in ok], 0.99), 2),
                                 "outcomes": dict(Counter(r[2] for r in rs))}
            if per_s:
                f["per_s"] = round(len(rs) / per_s, 2)
            return f

        if not steady and not startup:
            continue  # after the window only (the shutdown)
        kinds[kind] = {"steady": figures(steady, window_s), "startup": figures(startup, None)}
        if kind == "heartbeat":
            past = [max(0.0, r[1] - HEARTBEAT_WAIT_S) for r in steady if r[2] == "waited"]
            kinds[kind]["steady"]["past_wait"] = {
                "calls": len(past), "p50_ms": round(1000 * pct(past, 0.5), 2),
                "p99_ms": round(1000 * pct(past, 0.99), 2), "max_ms": round(1000 * max(past, default=0.0), 2)}
    out["calls"] = kinds
    tasks = sum(1 for t, o in zip(samples.t.get("next_task", []), samples.out.get("next_task", []))
                if w0 <= t < w1 and o == "task")
    task_rows = rc.rows_per_task or 4 * rc.batch
    out["tasks_per_s"] = round(tasks / window_s, 2)
    out["tasks_per_s_needed"] = round(rc.trainers * rc.batch / (task_rows * rc.step_s), 2)
    # The step clocks: lag (the clients' own load), and steps short of data (the prefetch fell behind).
    lags, stepping, short, empty = [], 0, 0, 0
    for d in clients:
        tk = d["ticks"]
        for t, lag, s, sh, em in zip(tk["t"], tk["lag"], tk["stepping"], tk["short"], tk["empty"]):
            if w0 <= t < w1:
                lags.append(lag)
                stepping, short, empty = stepping + s, short + sh, empty + em
    out["client_clock_lag_ms"] = {"p50": round(1000 * pct(lags, 0.5), 2), "p99": round(1000 * pct(lags, 0.99), 2),
                                  "max": round(1000 * max(lags, default=0.0), 2)}
    loop_lags = [lag for d in clients for t, lag in zip(d["lags"]["t"], d["lags"]["lag"]) if w0 <= t < w1]
    out["client_loop_lag_ms"] = {"p50": round(1000 * pct(loop_lags, 0.5), 2),
                                 "p99": round(1000 * pct(loop_lags, 0.99), 2),
                                 "max": round(1000 * max(loop_lags, default=0.0), 2),
                                 "busy_share": round(sum(lag > 0.010 for lag in loop_lags) / max(1, len(loop_lags)), 3)}
    out["steps"] = {"trainer_steps": stepping, "short_of_data": short, "without_data": empty,
                    "steps_per_s": round(stepping / window_s, 1)}
    # Who was dropped, by every account: the trainers' (answers), the master's status, its log.
    events = [e for d in clients for e in d["events"]]
    out["events"] = dict(Counter(e["what"] for e in events))
    told_dropped = sorted({e["trainer"] for e in events
                           if e["what"] in ("dropped", "assignment_failed", "abort", "stop", "gave_up")})
    # The master logs drops, lost peers, exits and formed generations (its first, "(start)", is expected).
    log_lines = [ln for ln in master_log.splitlines()
                 if any(s in ln for s in (" dropped", "lost a peer", "exited with", "formed: world size", "Traceback",
                                          "abandoned", "error", "failed"))
                 and "(start)" not in ln]
    fs = raw.get("final_status", {})
    listed_active = fs.get("trainer_states", {}).get("active", 0)
    changes = list(fs.get("generations", [])[1:])
    out["dropped"] = {
        "trainers_told": len(told_dropped), "examples": told_dropped[:10],
        # Once the generation of N formed, a trainer not active in the status has been dropped (or left).
        "missing_from_status": max(0, rc.trainers - listed_active) if fs.get("generation") else None,
        "generation_changes": changes,
        "master_log": log_lines[:20],
    }
    out["joined"] = sum(d["joined"] for d in clients)
    excluded = bool(told_dropped or changes or not fs or listed_active != rc.trainers)
    hb = kinds.get("heartbeat", {}).get("steady", {}).get("past_wait", {}).get("p99_ms")
    task = kinds.get("next_task", {}).get("steady", {}).get("p99_ms")
    master_cores = raw.get("cpu_cores", {}).get("master")
    out["targets"] = {
        "heartbeat_p99_past_wait_ok": hb is not None and kinds["heartbeat"]["steady"]["past_wait"]["calls"] > 0
        and hb <= 1000 * TARGET_P99_S,
        "task_p99_ok": task is not None and kinds["next_task"]["steady"]["calls"] > 0 and task <= 1000 * TARGET_P99_S,
        "master_cpu_ok": master_cores is not None and master_cores <= TARGET_MASTER_CORES,
        "none_dropped": not excluded,
    }
    out["targets"]["all_ok"] = all(out["targets"].values()) and "error" not in raw
    return out


# ====================================================================== output
def ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def mark(ok: bool) -> str:
    return "[green]ok[/green]" if ok else "[red]missed[/red]"


LONG_POLLS = {"assignment": "long poll, up to 10 s", "heartbeat": "waits up to 1 s", "status": "long poll, 1 s"}


def print_run(console: Console, r: dict[str, Any]) -> None:
    t = Table(title=f"{r['trainers']} trainers ({r['clients']} client process(es)): latency in ms, "
                    f"{r.get('window_s', 0):.0f} s steady window, and before it (start-up)")
    t.add_column("call", no_wrap=True)
    for col in ("calls", "/s", "p50", "p99", "max", "p99 to send", "err", "before", "p99", "max"):
        t.add_column(col, justify="right")
    for kind, f in r["calls"].items():
        s, b = f["steady"], f["startup"]
        t.add_row(kind, str(s["calls"]), f"{s.get('per_s', 0):.1f}", ms(s["p50_ms"]), ms(s["p99_ms"]),
                  ms(s["max_ms"]), ms(s["client_send_p99_ms"]), str(s["errors"] + b["errors"]), str(b["calls"]),
                  ms(b["p99_ms"]), ms(b["max_ms"]))
        if "past_wait" in s:
            w = s["past_wait"]
            t.add_row("  past its wait", str(w["calls"]), "", ms(w["p50_ms"]), ms(w["p99_ms"]), ms(w["max_ms"]),
                      "", "", "", "", "")
    console.print(t)
    lag = r["client_loop_lag_ms"]
    console.print("  (" + "; ".join(f"{k}: {v}" for k, v in LONG_POLLS.items()) + "; \"p99 to send\": the client's "
                  f"own delay before the request was written. Client event loop lag p99 {lag['p99']:.1f} ms, max "
                  f"{lag['max']:.1f} ms, over 10 ms {100 * lag['busy_share']:.0f} % of the time)")
    d = r["dropped"]
    if d["master_log"]:
        console.print("  master log:", *[f"    {ln}" for ln in d["master_log"][:8]], sep="\n")
    if r.get("py_spy", {}).get("own"):
        p = Table(title=f"the master with {r['trainers']} trainers: py-spy, {r['py_spy']['samples']} busy samples")
        p.add_column("own", justify="right")
        p.add_column("function (its own time)")
        p.add_column("in stack", justify="right")
        p.add_column("edl function (anywhere in the stack)")
        own, anywhere = r["py_spy"]["own"], r["py_spy"]["anywhere"]
        for i in range(max(len(own), len(anywhere))):
            mine = (str(own[i][0]), float(own[i][1])) if i < len(own) else ("", 0.0)
            below = (str(anywhere[i][0]), float(anywhere[i][1])) if i < len(anywhere) else ("", 0.0)
            p.add_row(f"{100 * mine[1]:.1f} %", mine[0], f"{100 * below[1]:.1f} %", below[0])
        console.print(p)


def summary_rows(r: dict[str, Any]) -> list[str]:
    """One run's column of the summary, in ``SUMMARY``'s order."""
    if "calls" not in r:
        return [f"[red]failed: {r.get('error', '?')[:40]}[/red]"] + [""] * (len(SUMMARY) - 1)
    tg, calls, cores = r["targets"], r["calls"], r.get("cpu_cores", {})
    hb = calls.get("heartbeat", {}).get("steady", {}).get("past_wait", {}).get("p99_ms")
    task = calls.get("next_task", {}).get("steady", {}).get("p99_ms")
    client = sum(v for k, v in cores.items() if k.startswith("client"))
    st, dropped = r["steps"], r["dropped"]
    n_dropped = max(dropped["trainers_told"], dropped["missing_from_status"] or 0)
    changes = len(dropped["generation_changes"])
    return [
        f"{ms(hb)} {mark(tg['heartbeat_p99_past_wait_ok'])}",
        f"{ms(task)} {mark(tg['task_p99_ok'])}",
        f"{cores.get('master', 0):.2f} {mark(tg['master_cpu_ok'])}",
        f"{n_dropped}" + (f" ({changes} changes)" if changes else "") + f" {mark(tg['none_dropped'])}",
        f"{r['tasks_per_s']:.0f} ({r['tasks_per_s_needed']:.0f})",
        f"{calls.get('heartbeat', {}).get('steady', {}).get('per_s', 0):.0f}",
        " / ".join("≤ " + ms(r.get("master_side", {}).get(k, {}).get("p99_le_ms")) for k in ("heartbeat", "next_task")),
        ms(calls.get("healthz_probe", {}).get("steady", {}).get("p99_ms")),
        f"{r.get('master_peak_rss_mib', 0):.0f}",
        f"{client:.2f} ({r['clients']})",
        f"{ms(r['client_loop_lag_ms']['p99'])} / {ms(r['client_loop_lag_ms']['max'])}",
        ms(calls.get("next_task", {}).get("steady", {}).get("client_send_p99_ms")),
        f"{st['short_of_data']} of {st['trainer_steps']}",
        f"{r.get('launcher_cpu_cores', 0):.2f}",
        "[green]all met[/green]" if tg["all_ok"] else "[red]missed[/red]"
        + (f": {r['error'][:40]}" if "error" in r else ""),
    ]


SUMMARY = (("heartbeat p99 past its wait, ms", "<= 100"), ("task p99, ms", "<= 100"), ("master CPU, cores", "<= 1"),
           ("trainers dropped", "0"), ("tasks/s (needed)", ""), ("heartbeats/s", ""),
           ("the master's own time p99, heartbeat / task, ms", ""), ("healthz probe p99 (loop wait), ms", ""), ("master peak RSS, MiB", ""),
           ("client CPU, cores (processes)", ""), ("client event loop lag p99 / max, ms", ""),
           ("task p99 spent in the client before sending, ms", ""),
           ("steps short of data", ""), ("launcher (this process) CPU, cores", ""), ("targets", ""))


def print_summary(console: Console, runs: list[dict[str, Any]]) -> None:
    t = Table(title="one master, N simulated trainers: the steady state")
    t.add_column("", no_wrap=True)
    t.add_column("target", justify="right")
    shares = {r.get("ask_share") for r in runs}
    for r in runs:
        t.add_column(f"N={r['trainers']}" + (f", share {r['ask_share']:g}" if len(shares) > 1 else ""), justify="right")
    columns = [summary_rows(r) for r in runs]
    for i, (name, target) in enumerate(SUMMARY):
        t.add_row(name, target, *[c[i] for c in columns])
    console.print(t)


# ====================================================================== main
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="How many trainers one edl master serves: a real master, simulated trainers (asyncio + aiohttp, "
                    "the real protocol, no framework), one run per N. Writes bench/results/master_scale.json.")
    p.add_argument("--trainers", type=int, nargs="+", default=[64, 256, 1024], metavar="N",
                   help="trainer counts, one master run each (default 64 256 1024)")
    p.add_argument("--duration", type=float, default=60.0,
                   help="seconds of steady state measured per run, once every trainer trains (default 60)")
    p.add_argument("--settle", type=float, default=5.0,
                   help="seconds between the generation's start and the measured window (default 5)")
    p.add_argument("--step-s", type=float, default=0.5,
                   help="simulated training step, seconds: every trainer steps in lockstep on this clock (default 0.5)")
    p.add_argument("--batch", type=int, default=64,
                   help="rows per trainer per step: the job's --batch-size (default 64)")
    p.add_argument("--rows-per-task", type=int, default=0,
                   help="the job's --rows-per-task; 0: the master's default, 4 x --batch (default 0)")
    p.add_argument("--checkpoint-interval", type=float, default=30.0,
                   help="rank 0 cuts and commits a checkpoint this often, seconds (the master's half only: no model "
                        "is written); 0: never (default 30, the job's default)")
    p.add_argument("--ramp-s", type=float, default=5.0,
                   help="the trainers' registrations are spread evenly over this many seconds, as trainer processes "
                        "or pods come up one after another; 0: all at once (default 5)")
    p.add_argument("--clients", type=int, default=0,
                   help="client processes the trainers are spread over; 0: one per 128 trainers (default 0)")
    p.add_argument("--rows", type=int, default=500_000,
                   help="rows of the generated data set (4 features, 8 shards; 10 %% held out); the job's epochs are "
                        "set so that the data outlasts the run (default 500000)")
    p.add_argument("--ask-share", type=float, nargs="+", default=[ASK_SHARE], metavar="S",
                   help="the share of the time its held rows last over which a trainer spreads its ask for a task "
                        "(edl.trainer.prefetch.AskPace); one run per N and share, side by side; 0: every trainer asks "
                        f"at once (default {ASK_SHARE:g}, the trainers')")
    p.add_argument("--ready-timeout", type=float, default=300.0,
                   help="seconds to wait for the generation of all N trainers before the run is given up (default 300)")
    p.add_argument("--py-spy", metavar="PATH", default=None,
                   help="a py-spy executable: sample the master over the window and list its hottest functions")
    p.add_argument("--keep", action="store_true",
                   help="keep the temporary directory (data, master and client logs, raw client results)")
    p.add_argument("--worker", metavar="CONFIG", default=None,
                   help="internal: run as one client process with this JSON config (the benchmark starts these)")
    a = p.parse_args(argv)
    if a.worker is None:
        problems = [f"--trainers {n}: at least 1" for n in a.trainers if n < 1]
        problems += [f"--ask-share {s:g}: from 0 to 1" for s in a.ask_share if not 0 <= s <= 1]
        problems += [f"{flag} must be positive" for flag, v in (("--duration", a.duration), ("--step-s", a.step_s),
                                                                 ("--batch", a.batch), ("--rows", a.rows))
                     if v <= 0]
        problems += [f"{flag} must be 0 or more" for flag, v in (("--settle", a.settle), ("--ramp-s", a.ramp_s),
                                                                  ("--clients", a.clients),
                                                                  ("--rows-per-task", a.rows_per_task),
                                                                  ("--checkpoint-interval", a.checkpoint_interval))
                     if v < 0]
        if problems:
            p.error("; ".join(problems))
    return a


async def run_all(a: argparse.Namespace, tmp: Path, console: Console) -> list[dict[str, Any]]:
    from edl.data.prepare import prepare_synthetic

    data = tmp / "data"
    t0 = time.monotonic()
    info = prepare_synthetic(str(data), rows=a.rows, features=4, classes=2, shards=8)
    console.print(f"data: {info['train_rows']} training rows in 8 shards ({time.monotonic() - t0:.1f} s)")
    runs: list[dict[str, Any]] = []
    for n, share in ((n, share) for n in a.trainers for share in a.ask_share):
        # Each real trainer is a process of its own; a client process plays many, and one playing 512 spent
        # up to 300 ms sending a burst of their requests (its own delay, counted in their latency).
        clients = a.clients or max(1, math.ceil(n / 128))
        rc = RunConfig(trainers=n, clients=min(clients, n), duration_s=a.duration, settle_s=a.settle,
                       step_s=a.step_s, batch=a.batch, rows_per_task=a.rows_per_task,
                       checkpoint_interval_s=a.checkpoint_interval, ramp_s=a.ramp_s,
                       ready_timeout_s=a.ready_timeout, py_spy=a.py_spy, ask_share=share)
        # Enough epochs that the data outlasts the run, twice over (the queue makes an epoch's tasks when needed).
        run_s = a.ramp_s + a.ready_timeout / 4 + a.settle + a.duration + 30
        epochs = max(1, math.ceil(2 * n * a.batch * run_s / a.step_s / info["train_rows"]))
        console.print(f"[bold]{n} trainers[/bold] ({rc.clients} client process(es), {epochs} epochs, "
                      f"asks spread over {share:g} of the held rows' time)")
        started = Started()
        try:
            r = analyze(await run_one(rc, data, epochs, tmp, started, console), rc)
        except (RuntimeError, TimeoutError, OSError, httpx.HTTPError, Unavailable, Rejected) as e:
            console.print(f"  [red]run with {n} trainers failed: {e}[/red]")
            r = {"trainers": n, "clients": rc.clients, "error": str(e)}
        finally:
            started.close()
        r["ask_share"] = share
        r["config"] = asdict(rc)
        runs.append(r)
        if "calls" in r:
            print_run(console, r)
    return runs


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    if a.worker is not None:
        return worker_main(a.worker)
    console = Console()
    tmp = Path(tempfile.mkdtemp(prefix="edl-master-scale-"))
    try:
        runs = asyncio.run(run_all(a, tmp, console))
    except KeyboardInterrupt:
        console.print("[yellow]interrupted: everything started is stopped[/yellow]")
        return 130
    finally:
        if a.keep:
            console.print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    print_summary(console, runs)
    result = {"machine_cores": os.cpu_count(), "step_s": a.step_s, "batch": a.batch, "duration_s": a.duration,
              "targets": {"p99_ms": 1000 * TARGET_P99_S, "master_cores": TARGET_MASTER_CORES, "dropped": 0},
              "runs": runs}
    console.print(f"written to {write_result('master_scale', result)}")
    return 0 if all(r.get("targets", {}).get("all_ok") for r in runs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
