"""The master's HTTP API in-process (Starlette's test client): token, refusals, metrics."""

from __future__ import annotations

import asyncio
import gc
import time

import msgspec
from starlette.testclient import TestClient

from edl.api.spec import JobSpec
from edl.master.job import Job
from edl.master.server import HeartbeatBody, Master, build_app, heartbeat_wait_s
from edl.api.data import Shard

TOKEN = "s3cret"


def make_client(clock=time.monotonic) -> tuple[TestClient, Job]:
    spec = JobSpec(job="api", model_def="m", data="d", epochs=1, batch_size=4, min_trainers=1, max_trainers=3,
                   trainers=1, checkpoint_uri="/tmp/x")
    # Started now on the master's clock (the wall clock): its launcher's dead-man switch has not tripped.
    job = Job(spec, [Shard("a.parquet", 40)], master_uid="1", now=time.monotonic())
    loop = asyncio.new_event_loop()
    master = loop.run_until_complete(_make_master(job, clock))
    return TestClient(build_app(master)), job


async def _make_master(job: Job, clock=time.monotonic) -> Master:
    return Master(job, TOKEN, clock)


def test_requests_without_the_token_get_401_and_change_nothing():
    client, job = make_client()
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
        r = client.post("/v1/scale", json={"trainers": 3}, headers=headers)
        assert r.status_code == 401
        r = client.post("/v1/trainers/t1/register", json={"pid": 1, "host": "h", "store_port": 1}, headers=headers)
        assert r.status_code == 401
    assert job.desired == 1 and not job.membership.trainers


def test_scale_outside_range_is_refused_with_the_reason():
    client, job = make_client()
    auth = {"Authorization": f"Bearer {TOKEN}"}
    r = client.post("/v1/scale", json={"trainers": 7}, headers=auth)
    assert r.status_code == 400 and "outside this job's range 1..3" in r.json()["detail"]
    assert client.post("/v1/scale", json={"trainers": 2}, headers=auth).json() == {"desired_trainers": 2}


def test_scale_carries_the_planned_nodes_to_the_status_and_refuses_more_nodes_than_trainers():
    client, job = make_client()
    auth = {"Authorization": f"Bearer {TOKEN}"}
    r = client.post("/v1/scale", json={"trainers": 3, "nodes": ["n0", "n0", "n1"]}, headers=auth)
    assert r.json() == {"desired_trainers": 3}
    assert client.get("/v1/status", headers=auth).json()["node_hints"] == ["n0", "n0", "n1"]
    assert client.post("/v1/scale", json={"trainers": 1, "nodes": ["n0", "n1"]}, headers=auth).status_code == 400
    client.post("/v1/scale", json={"trainers": 2}, headers=auth)  # a size alone (edl scale): anywhere
    assert client.get("/v1/status", headers=auth).json()["node_hints"] == []


def test_unschedulable_reports_lower_the_desired_count_and_checkpoints_can_be_requested():
    client, job = make_client()
    auth = {"Authorization": f"Bearer {TOKEN}"}
    client.post("/v1/scale", json={"trainers": 3}, headers=auth)
    assert client.post("/v1/unschedulable", json={"count": 1}, headers=auth).json() == {"desired_trainers": 2}
    assert client.post("/v1/unschedulable", json={"count": 5}, headers=auth).json() == {"desired_trainers": 1}
    st = client.get("/v1/status", headers=auth).json()
    assert st["desired_trainers"] == 1 and st["unschedulable_at"] is not None
    assert client.post("/v1/unschedulable", json={"count": 1}, headers={}).status_code == 401
    assert not job.checkpoint_requested
    client.post("/v1/checkpoints/request", headers=auth)
    assert job.checkpoint_requested and job.heartbeat_answer("t1").checkpoint is True


def test_scale_carries_the_reason_to_the_status_and_its_changes_to_the_summary():
    client, job = make_client()
    auth = {"Authorization": f"Bearer {TOKEN}"}
    assert client.get("/v1/status", headers=auth).json()["reason"] is None  # nobody has said yet
    client.post("/v1/scale", json={"trainers": 1, "reason": {"cause": "no_room", "text": "full"}}, headers=auth)
    assert client.get("/v1/status", headers=auth).json()["reason"] == {"cause": "no_room", "text": "full"}
    client.post("/v1/scale", json={"trainers": 1, "reason": {"cause": "no_room", "text": "still full"}}, headers=auth)
    client.post("/v1/scale", json={"trainers": 2}, headers=auth)  # by hand
    st = client.get("/v1/status", headers=auth).json()
    assert st["reason"] == {"cause": "fixed", "text": "set to 2 by hand (edl scale)"}
    client.post("/v1/unschedulable", json={"count": 1}, headers=auth)
    reasons = client.get("/v1/summary", headers=auth).json()["size_reasons"]
    # Each change of cause once, with its first text: a new text of the same cause is not a new event.
    assert [(r["cause"], r["text"]) for r in reasons] == [
        ("no_room", "full"), ("fixed", "set to 2 by hand (edl scale)"),
        ("no_room", "1 trainer(s) could not be scheduled: lowered to 1")]
    assert all(r["t"] >= 0 for r in reasons)
    r = client.post("/v1/scale", json={"trainers": 1, "reason": {"cause": "bored", "text": "x"}}, headers=auth)
    assert r.status_code == 400 and "unknown reason cause 'bored'" in r.json()["detail"]
    assert job.desired == 1


def test_status_and_metrics():
    client, job = make_client()
    auth = {"Authorization": f"Bearer {TOKEN}"}
    r = client.post("/v1/trainers/t1/register", json={"pid": 11, "host": "127.0.0.1", "store_port": 5}, headers=auth)
    assert r.status_code == 200
    st = client.get("/v1/status", headers=auth).json()
    for key in ("job", "generation", "world_size", "desired_trainers", "epoch", "trainers"):
        assert key in st
    assert st["generation"] == 1 and st["world_size"] == 1
    assert st["trainers"] == [{"id": "t1", "rank": 0, "pid": 11, "state": "active", "step": 0}]
    text = client.get("/metrics").text
    assert 'edl_world_size{job="api"} 1.0' in text
    assert 'edl_generation_changes_total{job="api",reason="start"} 1.0' in text


def test_the_metrics_time_each_route_leaving_out_the_long_polls_wait():
    # The master's clock stands just past t1's moment of the period (``heartbeat_wait_s``).
    now, phase = time.monotonic(), heartbeat_wait_s("t1", 0.0, 0.4)
    at = now - (now - phase) % 0.4 + 0.001
    client, _ = make_client(clock=lambda: at)
    auth = {"Authorization": f"Bearer {TOKEN}"}
    client.post("/v1/trainers/t1/register", json={"pid": 11, "host": "127.0.0.1", "store_port": 5}, headers=auth)
    # Nothing to tell t1: its heartbeat waits a whole period (0.399 s), which its time leaves out.
    r = client.post("/v1/trainers/t1/heartbeat", json={"step": 1, "wait_s": 0.4}, headers=auth)
    assert r.status_code == 200 and r.elapsed.total_seconds() >= 0.39
    text = client.get("/metrics").text
    beat = 'route="/v1/trainers/{trainer}/heartbeat"'
    assert f"edl_master_request_seconds_count{{{beat}}} 1.0" in text
    assert f'edl_master_request_seconds_bucket{{le="0.25",{beat}}} 1.0' in text
    assert 'edl_master_request_seconds_count{route="/v1/trainers/{trainer}/register"} 1.0' in text
    assert "/healthz" not in text  # probes are not the job's traffic


def test_heartbeats_that_arrive_together_are_answered_spread_over_the_period():
    # 1,024 trainers' beats arrive in the same instant (a burst answered late, a change that woke them
    # all): without news each is answered at its trainer's own moment of the 1 s period, so their answers,
    # and the beats that follow them, spread evenly instead of coming back together.
    names = [f"job-trainer-{i}" for i in range(1024)]
    waits = [heartbeat_wait_s(n, 5000.25, 1.0) for n in names]
    assert all(0 < w <= 1.0 for w in waits)
    per_tenth = [sum(1 for w in waits if k / 10 < w <= (k + 1) / 10) for k in range(10)]
    assert max(per_tenth) < 1.5 * 1024 / 10, per_tenth
    # The next beat of each, sent as the answer arrives, waits the rest of the period: one a second.
    again = [heartbeat_wait_s(n, 5000.25 + w + 0.002, 1.0) for n, w in zip(names, waits)]
    assert all(abs(a - 0.998) < 1e-6 for a in again)


def test_the_launchers_beat_carries_its_failure_budgets_to_the_status():
    client, _ = make_client()
    auth = {"Authorization": f"Bearer {TOKEN}"}
    assert client.get("/v1/status", headers=auth).json()["budgets"] == {}
    budgets = {"master_restarts": {"spent": 1, "limit": 10, "total": 4, "refunded": 3}}
    assert client.post("/v1/launcher/beat", json={"budgets": budgets}, headers=auth).status_code == 200
    assert client.get("/v1/status", headers=auth).json()["budgets"] == budgets
    assert client.post("/v1/launcher/beat", headers=auth).status_code == 200  # a bare beat keeps them
    assert client.get("/v1/status", headers=auth).json()["budgets"] == budgets
    bad = {"master_restarts": {"spent": "one", "limit": 10, "total": 4, "refunded": 3}}
    r = client.post("/v1/launcher/beat", json={"budgets": bad}, headers=auth)
    assert r.status_code == 400 and "Expected `int`, got `str` - at `$.budgets[...].spent`" in r.json()["detail"]


def test_a_body_that_does_not_fit_is_a_400_naming_the_field_and_changes_nothing():
    client, job = make_client()
    auth = {"Authorization": f"Bearer {TOKEN}"}
    r = client.post("/v1/scale", json={"trainers": "three"}, headers=auth)
    assert r.status_code == 400 and "got `str` - at `$.trainers`" in r.json()["detail"]
    r = client.post("/v1/scale", json={"trainers": True}, headers=auth)  # JSON true is not an int
    assert r.status_code == 400 and "got `bool` - at `$.trainers`" in r.json()["detail"]
    r = client.post("/v1/trainers/t1/register", json={"host": "h", "store_port": 1}, headers=auth)
    assert r.status_code == 400 and "missing required field `pid`" in r.json()["detail"]
    r = client.post("/v1/trainers/t1/register", content=b"{not json", headers=auth)
    assert r.status_code == 400 and "not JSON" in r.json()["detail"]
    r = client.post("/v1/scale", json=[3], headers=auth)  # JSON, but not an object
    assert r.status_code == 400 and "Expected `object`, got `array`" in r.json()["detail"]
    r = client.post("/v1/trainers/t1/sync", json={"generation": 1, "step": 2, "cursors": {"t1": ["x", 0]},
                                                  "store_port": 1}, headers=auth)
    assert r.status_code == 400 and "got `str` - at `$.cursors[...][0]`" in r.json()["detail"]
    r = client.get("/v1/trainers/t1/assignment", params={"after": "soon"}, headers=auth)
    assert r.status_code == 400 and "after='soon'" in r.json()["detail"]
    assert job.desired == 1 and not job.membership.trainers
    # What fits is taken, ints where floats are asked for included, and optional fields may be left out.
    r = client.post("/v1/trainers/t1/register", json={"pid": 1, "host": "h", "store_port": 1}, headers=auth)
    assert r.status_code == 200 and "t1" in job.membership.trainers
    # Fields the master does not know are ignored (a newer trainer may send more).
    r = client.post("/v1/trainers/t1/heartbeat", json={"step": 0, "wait_s": 0, "newer": 1}, headers=auth)
    assert r.status_code == 200 and r.json()["known"] is True
    wait_s = msgspec.convert({"wait_s": 2}, type=HeartbeatBody).wait_s
    assert wait_s == 2.0 and isinstance(wait_s, float)
    # A non-finite figure as Python's json sends it (`NaN`, `Infinity`) is a float, not malformed JSON.
    r = client.post("/v1/trainers/t1/heartbeat", content=b'{"step": 0, "loss": NaN, "wait_s": Infinity}',
                    headers={**auth, "Content-Type": "application/json"})
    assert r.status_code == 200


def test_a_caller_gone_mid_request_is_answered_quietly(caplog):
    # A trainer killed while it sent a heartbeat: the body never comes. That logged Starlette's
    # ClientDisconnect with a traceback in the master's log; it is nobody's error.
    _, job = make_client()
    app = build_app(asyncio.new_event_loop().run_until_complete(_make_master(job)))
    scope = {"type": "http", "method": "POST", "path": "/v1/trainers/t1/heartbeat", "raw_path": b"/v1/trainers/t1/heartbeat",
             "query_string": b"", "headers": [(b"authorization", f"Bearer {TOKEN}".encode()),
                                                (b"content-type", b"application/json")],
             "http_version": "1.1", "scheme": "http", "server": ("test", 80), "client": ("test", 1), "root_path": ""}
    sent: list[dict] = []

    async def receive() -> dict:
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)

    asyncio.new_event_loop().run_until_complete(app(scope, receive, send))
    assert sent[0]["type"] == "http.response.start" and sent[0]["status"] == 400
    assert not [r for r in caplog.records if r.levelname in ("ERROR", "CRITICAL")]


def test_the_master_collects_its_youngest_objects_every_10000_allocations():
    # What a heartbeat's request allocates lives about a second; collected every 700 allocations it was
    # promoted to the oldest generation, whose collections held the loop 100-150 ms at 1,024 trainers.
    from edl.master.main import YOUNG_COLLECTION_EVERY, tune_collector

    before = gc.get_threshold()
    try:
        tune_collector()
        assert gc.get_threshold() == (YOUNG_COLLECTION_EVERY, before[1], before[2]) and YOUNG_COLLECTION_EVERY > 700
    finally:
        gc.set_threshold(*before)
