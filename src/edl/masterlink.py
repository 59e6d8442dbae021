"""The one HTTP client of the master (httpx, retried with tenacity): both links of ``edl.api.master``.

It imports nothing of ``edl.master``: the launcher, the trainers, the autoscale sidecar and a
standby master all reach a job's master over it, side by side, none of them above the master.

Answers map to errors the same way for every caller: an unreachable master or a 5xx is
temporary (retried until the client's give-up time), 401 is a ``UserError`` naming the token,
400 a ``UserError`` with the master's reason, 409 a ``StaleError`` (the request named a
generation that is no longer current), any other 4xx a ``PermanentError``.

A registration (a trainer joining, or joining again after its master restarted) makes every link
of this process to that address drop its kept-alive connections before its next request: a
Service routes a new connection to the master it has now, but a kept-alive one stays with the
old master, which may live on beside its successor until the run lock fences it. Each link
reconnects in the thread that uses it.
"""

from __future__ import annotations

import os
import threading
from typing import Any, Callable

import httpx
from tenacity import retry, retry_if_exception_type, stop_after_delay, wait_exponential

from edl.api.cluster import MasterEndpoint, SizeReason
from edl.api.data import Cursor, Task, cursor_to_json
from edl.api.master import (
    Assignment,
    BudgetView,
    HeartbeatAnswer,
    JobView,
    Next,
    NoAssignment,
    Prepared,
    Registration,
    ResumeReport,
    SyncReport,
    UserCodeFailure,
    assignment_from_json,
    cursors_to_json,
    next_task_from_json,
    to_json,
)
from edl.api.spec import JobSpec
from edl.errors import PermanentError, StaleError, TemporaryError, UserError


class MasterUnavailable(TemporaryError):
    """The master did not answer, or answered 5xx (it may be restarting)."""


_registrations: dict[str, int] = {}  # base URL -> registrations sent there by this process
_registrations_lock = threading.Lock()


def _registered(base: str, new: bool = False) -> int:
    with _registrations_lock:
        if new:
            _registrations[base] = _registrations.get(base, 0) + 1
        return _registrations.get(base, 0)


def default_give_up_s() -> float:
    return float(os.environ.get("EDL_MASTER_GIVE_UP_S", "300"))


class HttpMaster:
    """A job's master at ``address`` (``host:port`` or a URL), with the job token.

    Calls retry while the master is unavailable, for up to ``give_up_s`` (0: one attempt; default
    ``$EDL_MASTER_GIVE_UP_S`` or 300 s); the polled ``healthy``/``status``/``summary`` try once.
    ``name`` is how error messages call the master (default: "master at ADDRESS").
    """

    def __init__(self, address: str, token: str, *, timeout_s: float = 15.0, give_up_s: float | None = None,
                 name: str | None = None) -> None:
        self.base = address if address.startswith("http") else f"http://{address}"
        self.name = name or f"master at {self.base}"
        self.give_up_s = default_give_up_s() if give_up_s is None else give_up_s
        self._token, self._timeout_s = token, timeout_s
        self._http = self._client()
        self._joined = _registered(self.base)  # the registrations its connections have seen

    def close(self) -> None:
        """Close its connections (a link no longer used)."""
        self._http.close()

    def _client(self) -> httpx.Client:
        return httpx.Client(
            base_url=self.base,
            headers={"Authorization": f"Bearer {self._token}"},
            timeout=httpx.Timeout(self._timeout_s, connect=min(2.0, self._timeout_s)),
        )

    # ------------------------------------------------------------------ transport
    def _once(self, method: str, path: str, body: dict | None, params: dict | None) -> httpx.Response:
        if (joined := _registered(self.base)) != self._joined:
            # Someone here (re)registered since: whoever answers at the address now is the master.
            self._joined, old, self._http = joined, self._http, self._client()
            old.close()
        try:
            r = self._http.request(method, path, json=body, params=params)
        except httpx.TransportError as e:
            raise MasterUnavailable(f"{self.name} unreachable: {type(e).__name__}") from e
        if r.status_code >= 500:
            raise MasterUnavailable(f"{self.name}: error {r.status_code} on {path}")
        return r

    def _request(self, method: str, path: str, body: dict | None = None, params: dict | None = None,
                 once: bool = False) -> httpx.Response:
        if once or self.give_up_s <= 0:
            return self._once(method, path, body, params)
        return retry(
            retry=retry_if_exception_type(MasterUnavailable),
            wait=wait_exponential(multiplier=0.05, max=1.0),
            stop=stop_after_delay(self.give_up_s),
            reraise=True,
        )(self._once)(method, path, body, params)

    def _answer(self, r: httpx.Response, path: str) -> Any:
        if r.status_code == 401:
            raise UserError(f"{self.name} refused our job token (401)")
        if r.status_code == 400:
            raise UserError(_detail(r))
        if r.status_code == 409:
            raise StaleError(f"{self.name} on {path}: {_detail(r)} (409)")
        if r.status_code >= 400:
            raise PermanentError(f"{self.name} answered {r.status_code} on {path}: {r.text[:200]}")
        return r.json()

    def _call(self, method: str, path: str, body: dict | None = None, params: dict | None = None) -> Any:
        return self._answer(self._request(method, path, body, params), path)

    def _poll(self, path: str, params: dict | None = None) -> Any | None:
        """One GET; ``None`` while the master is unavailable."""
        try:
            return self._answer(self._request("GET", path, params=params, once=True), path)
        except MasterUnavailable:
            return None

    # ------------------------------------------------------------------ ControlLink
    def healthy(self) -> bool:
        """The master answers (a spare master pod that was not woken yet does not count)."""
        try:
            r = self._request("GET", "/healthz", once=True)
        except MasterUnavailable:
            return False
        return r.status_code == 200 and not r.json().get("standby")

    def status(self, after: int = 0, wait_s: float = 0.0) -> JobView | None:
        """The job's status; with ``after`` (a ``JobView.control_version``) and ``wait_s``, a long poll:
        the answer comes once what the launcher acts on differs from ``after``, or after ``wait_s``."""
        params = {"after": after, "wait_s": wait_s} if after and wait_s > 0 else None
        d = self._poll("/v1/status", params)
        return None if d is None else JobView.from_json(d)

    def summary(self) -> dict[str, Any] | None:
        return self._poll("/v1/summary")

    def scale(self, trainers: int, nodes: tuple[str, ...] = (), reason: SizeReason | None = None,
              released: tuple[str, ...] | None = None) -> int:
        body: dict[str, object] = {"trainers": trainers}
        if nodes:
            body["nodes"] = list(nodes)
        if reason is not None:
            body["reason"] = reason.to_json()
        if released is not None:
            body["released"] = list(released)
        return int(self._call("POST", "/v1/scale", body)["desired_trainers"])

    def report_unschedulable(self, count: int) -> int:
        return int(self._call("POST", "/v1/unschedulable", {"count": count})["desired_trainers"])

    def report_exit(self, trainer: str, code: int, preempted: bool = False) -> None:
        self._call("POST", f"/v1/trainers/{trainer}/exited", {"code": code, "preempted": preempted})

    def drain(self, trainer: str) -> bool:
        path = f"/v1/trainers/{trainer}/drain"
        r = self._request("POST", path, {})
        if r.status_code == 400:
            return False  # no trainer by that name: it never registered
        self._answer(r, path)
        return True

    def request_checkpoint(self) -> None:
        self._call("POST", "/v1/checkpoints/request")

    def fail_job(self, message: str, user: bool = False) -> None:
        self._call("POST", "/v1/fatal", {"message": message, "user": user})

    def shutdown(self) -> None:
        self._call("POST", "/v1/shutdown")

    def wake_standby(self, await_handover_s: float = 0.0) -> None:
        """Wake the spare master at this address (``edl master --standby http``): it serves the job next,
        after waiting up to ``await_handover_s`` for its stopping predecessor's run lock. One attempt."""
        self._answer(self._request("POST", "/v1/standby/start", {"await_handover_s": await_handover_s}, once=True),
                     "/v1/standby/start")

    def launcher_beat(self, budgets: dict[str, BudgetView] | None = None) -> None:
        self._call("POST", "/v1/launcher/beat", {"budgets": to_json(budgets or {})})

    # ------------------------------------------------------------------ TrainerLink
    def spec(self) -> JobSpec:
        return JobSpec(**self._call("GET", "/v1/spec"))

    def register(self, trainer: str, pid: int, host: str, store_port: int,
                 resume: ResumeReport | None = None) -> Registration:
        body: dict[str, Any] = {"pid": pid, "host": host, "store_port": store_port}
        if resume is not None:
            body["resume"] = resume.to_json()
        _registered(self.base, new=True)
        return Registration.from_json(self._call("POST", f"/v1/trainers/{trainer}/register", body))

    def assignment(self, trainer: str, after: int, wait_s: float) -> Assignment | Prepared | NoAssignment:
        d = self._call("GET", f"/v1/trainers/{trainer}/assignment", params={"after": after, "wait_s": wait_s})
        return assignment_from_json(d)

    def heartbeat(self, trainer: str, *, generation: int, step: int, safe_cursor: Cursor | None,
                  loss: float | None, wait_s: float, in_collective_s: float | None = None,
                  store_port: int | None = None, heard: tuple[int, bool] = (0, False)) -> HeartbeatAnswer:
        body = {"generation": generation, "step": step, "wait_s": wait_s, "safe_cursor": cursor_to_json(safe_cursor),
                "loss": loss, "in_collective_s": in_collective_s, "store_port": store_port, "prepared": heard[0],
                "go": heard[1]}
        return HeartbeatAnswer.from_json(self._call("POST", f"/v1/trainers/{trainer}/heartbeat", body))

    def prepared_ready(self, trainer: str, generation: int) -> None:
        self._call("POST", f"/v1/trainers/{trainer}/prepared", {"generation": generation})

    def leave(self, trainer: str) -> None:
        self._call("POST", f"/v1/trainers/{trainer}/leave")

    def next_task(self, trainer: str, request_id: str, safe_cursor: Cursor | None, *, master_uid: str | None = None,
                  generation: int | None = None) -> Task | Next:
        body = {"request_id": request_id, "safe_cursor": cursor_to_json(safe_cursor), "master_uid": master_uid,
                "generation": generation}
        return next_task_from_json(self._call("POST", f"/v1/trainers/{trainer}/task", body))

    def task_failed(self, trainer: str, task_id: int, reason: str) -> None:
        self._call("POST", f"/v1/trainers/{trainer}/task-failed", {"task_id": task_id, "reason": reason})

    def sync(self, report: SyncReport) -> None:
        body = {"generation": report.generation, "step": report.step, "store_port": report.store_port,
                "failed": report.failed, "cursors": cursors_to_json(report.cursors), "switched_to": report.switched_to}
        self._call("POST", f"/v1/trainers/{report.trainer}/sync", body)

    def first_step(self, trainer: str, generation: int) -> None:
        self._call("POST", f"/v1/trainers/{trainer}/first-step", {"generation": generation})

    def checkpoint_cut(self, generation: int, step: int, cursors: dict[str, Cursor | None]) -> dict[str, Any]:
        body = {"generation": generation, "step": step, "cursors": cursors_to_json(cursors)}
        return self._call("POST", "/v1/checkpoints/cut", body)

    def checkpoint_committed(self, generation: int, step: int, uri: str, write_s: float) -> bool:
        body = {"generation": generation, "step": step, "uri": uri, "write_s": write_s}
        return bool(self._call("POST", "/v1/checkpoints/committed", body)["ok"])

    def user_code_failed(self, failure: UserCodeFailure) -> str | None:
        body = {"step": failure.step, "part": failure.part, "fingerprint": failure.fingerprint, "log": failure.log,
                "rows": [list(r) for r in failure.rows]}
        d = self._call("POST", f"/v1/trainers/{failure.trainer}/user-code-failed", body)
        return d["error"] if d["user_error"] else None

    def finish(self, step: int, final_model_uri: str | None, metrics: dict[str, float]) -> None:
        self._call("POST", "/v1/finish", {"step": step, "final_model_uri": final_model_uri, "metrics": metrics})


class FollowedMaster:
    """A ``SizeLink`` to whichever master a launcher follows now (``endpoint``; ``None`` before it has one):
    the link of the autoscale sidecar, a thread of the launcher. A new link (and no kept-alive connection)
    whenever the launcher's endpoint changes: a recreated master, at another address with ``pod-ip``, while
    the old one may live on behind the same Service until it is fenced."""

    def __init__(self, endpoint: Callable[[], MasterEndpoint | None], timeout_s: float = 5.0,
                 give_up_s: float = 10.0) -> None:
        self._endpoint = endpoint
        self._timeout_s, self._give_up_s = timeout_s, give_up_s
        self._followed: MasterEndpoint | None = None
        self._link: HttpMaster | None = None
        self._closed = False

    def close(self) -> None:
        """Follow no master any more: ``status`` answers ``None`` and ``scale`` raises from now on (a
        stopped sidecar whose decision was still in flight sets nothing)."""
        self._closed = True

    def _current(self) -> HttpMaster | None:
        endpoint = None if self._closed else self._endpoint()
        if endpoint is not self._followed:  # replaced, not changed in place: every recreate is a new one
            if self._link is not None:
                self._link.close()
            self._followed = endpoint
            self._link = None if endpoint is None else HttpMaster(endpoint.address, endpoint.token,
                                                                  timeout_s=self._timeout_s, give_up_s=self._give_up_s)
        return self._link

    def status(self) -> JobView | None:
        link = self._current()
        return None if link is None else link.status()

    def scale(self, trainers: int, nodes: tuple[str, ...] = (), reason: SizeReason | None = None,
              released: tuple[str, ...] | None = None) -> int:
        link = self._current()
        if link is None:
            raise MasterUnavailable("the launcher follows no master (not yet, or no more)")
        return link.scale(trainers, nodes, reason, released)


def _detail(r: httpx.Response) -> str:
    try:
        return str(r.json().get("detail", r.text))
    except ValueError:
        return r.text[:200]
