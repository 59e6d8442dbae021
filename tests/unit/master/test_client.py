"""The one HTTP client of the master against the real app in-process: typed answers, the error mapping."""

from __future__ import annotations

import asyncio

import pytest
from starlette.testclient import TestClient

from edl.api.data import Cursor, Shard
from edl.api.cluster import SizeCause, SizeReason
from edl.api.master import Assignment, JobStatus, JobView, NoAssignment, Phase, Source, TrainerState, Unassigned
from edl.api.spec import JobSpec
from edl.errors import StaleError, TemporaryError, UserError
from edl.masterlink import HttpMaster
from edl.master.job import Job
from edl.master.server import Master, build_app
from tests.clock import FakeClock, FakeClockLoop

TOKEN = "s3cret"


@pytest.fixture
def job() -> Job:
    spec = JobSpec(job="api", model_def="m", data="d", epochs=1, batch_size=4, min_trainers=1, max_trainers=3,
                   trainers=1, checkpoint_uri="/tmp/x")
    return Job(spec, [Shard("a.parquet", 40)], master_uid="1", now=0.0)


def link_to(job: Job, token: str = TOKEN, clock: FakeClock | None = None) -> tuple[HttpMaster, TestClient]:
    """A link to the app in-process; with ``clock``, the app's event loop runs on it (``FakeClockLoop``)."""
    async def make() -> Master:
        return Master(job, TOKEN, clock=lambda: 1.0)

    app = build_app(asyncio.new_event_loop().run_until_complete(make()))
    link = HttpMaster("testserver", token, give_up_s=0.0)
    options = {} if clock is None else {"loop_factory": lambda: FakeClockLoop(clock)}

    def client() -> TestClient:
        return TestClient(app, base_url=link.base, headers={"Authorization": f"Bearer {token}"},
                          backend_options=options)

    link._client = client  # type: ignore[method-assign]  # the app in-process instead of a socket
    link._http = client()  # (a registration makes the link open a new one: see edl.masterlink)
    return link, client()


def test_typed_answers_round_trip_their_json(job):
    link, http = link_to(job)
    with http:
        assert link.healthy()
        assert link.spec() == job.spec
        reg = link.register("t1", 11, "127.0.0.1", 5)
        assert reg.master_uid == "1" and reg.job_status is JobStatus.RUNNING
        a = link.assignment("t1", after=0, wait_s=0.0)
        assert isinstance(a, Assignment) and (a.rank, a.world_size, a.source) == (0, 1, Source.INIT)
        assert link.assignment("t1", after=a.generation, wait_s=0.0) == NoAssignment(Unassigned.WAIT)
        beat = link.heartbeat("t1", generation=1, step=0, safe_cursor=None, loss=None, wait_s=0.0)
        assert beat.known and beat.state is TrainerState.ACTIVE and not beat.stop
        wire = http.get("/v1/status").json()
        st = link.status()
        assert isinstance(st, JobView) and st.to_json() == wire
        assert st.phase is Phase.RUNNING and st.trainers[0].state is TrainerState.ACTIVE
        assert link.scale(2) == 2 and link.report_unschedulable(1) == 1
        why = SizeReason(SizeCause.AT_MAX, "at its maximum of 3 trainers")
        assert link.scale(3, ("n0",), why) == 3 and link.status().reason == why


def test_errors_map_to_one_line_kinds(job):
    link, http = link_to(job)
    with http:
        with pytest.raises(UserError, match="outside this job's range 1..3"):
            link.scale(7)  # 400: the master's reason
        assert link.drain("nobody") is False  # 400 on a drain: the master does not know it
        link.register("t1", 11, "127.0.0.1", 5)
        with pytest.raises(StaleError, match="409"):
            link.checkpoint_cut(7, 3, {"t1": Cursor(0, 4)})  # not the current generation
        cut = link.checkpoint_cut(1, 3, {"t1": Cursor(0, 4)})
        assert cut["step"] == 3 and link.checkpoint_committed(1, 3, "file:///c", 0.5)
        assert not link.checkpoint_committed(1, 3, "file:///c", 0.5)  # committed once
    wrong, http = link_to(job, token="wrong")
    with http, pytest.raises(UserError, match="refused our job token"):
        wrong.status()


def test_an_unreachable_master_is_temporary():
    link = HttpMaster("127.0.0.1:1", TOKEN, timeout_s=1.0, give_up_s=0.0)
    assert link.status() is None and not link.healthy()
    with pytest.raises(TemporaryError, match="unreachable"):
        link.scale(2)


def test_a_long_poll_of_the_status_answers_when_what_the_launcher_acts_on_changes(job):
    # The launcher's status watch (``edl.launcher.watch``): a step or a loss (every heartbeat) does not end
    # the wait; a new desired count does, at once. The app's event loop runs on a fake clock: a wait ends
    # on its own only when the test moves the clock past it.
    import threading

    clock = FakeClock()
    link, http = link_to(job, clock=clock)
    with http:
        link._http = http  # one client, one event loop: the long poll and the calls beside it share it
        loop = http.portal.call(asyncio.get_running_loop)
        http.post("/v1/trainers/t1/register", json={"pid": 11, "host": "127.0.0.1", "store_port": 5})
        first = link.status()
        assert first is not None and first.control_version

        def poll(wait_s: float) -> tuple[threading.Thread, list]:
            """A long poll from another thread, once the master waits on it; its answers, each with the time
            it came."""
            answers: list = []
            thread = threading.Thread(target=lambda: answers.append(
                (link.status(after=first.control_version, wait_s=wait_s), clock())))
            thread.start()
            assert loop.wait_deadline(clock() + wait_s), "the long poll is not waiting"
            return thread, answers

        # Nothing changes: the whole wait (the master waits wait_s, and answers once it has passed).
        thread, answers = poll(0.3)
        clock.sleep(0.3)
        thread.join(10.0)
        assert [(same.control_version, at) for same, at in answers] == [(first.control_version, 0.3)]
        # Another count (what a client of a master that restarted holds): at once.
        assert link.status(after=first.control_version + 1, wait_s=5.0).control_version == first.control_version

        thread, answers = poll(5.0)
        r = http.post("/v1/trainers/t1/heartbeat", json={"generation": 1, "step": 7, "loss": 0.5, "wait_s": 0})
        assert r.status_code == 200
        waited = clock()
        assert http.post("/v1/scale", json={"trainers": 2}).status_code == 200
        thread.join(10.0)
        # Answered with the clock standing still: by the new count, not the 5 s wait; and not by the
        # heartbeat before it (that answer would have the old count).
        assert [at for _, at in answers] == [waited]
        view = answers[0][0]
        assert view.desired_trainers == 2 and view.step == 7 and view.control_version > first.control_version


def test_the_control_key_leaves_out_the_step_and_takes_in_what_the_launcher_acts_on(job):
    job.register("t1", 11, "h", 5, 0.0)
    key = job.control_key()
    job.heartbeat("t1", 9, None, 0.5, 0.25, 1, None)  # a step, a loss, a cursor
    assert job.control_key() == key and job.status_view(0.5).step == 9
    job.scale(2)
    assert job.control_key() != key
    key = job.control_key()
    job.register("t2", 12, "h", 6, 0.6)  # a trainer the launcher must not name again
    assert job.control_key() != key


def test_the_sidecars_link_follows_the_master_the_launcher_follows():
    """``FollowedMaster``: no master yet, nothing to ask; a new link (new connections) for every endpoint the
    launcher replaces, even at the same address (a Service: the old master may live on behind it)."""
    from edl.api.cluster import MasterEndpoint
    from edl.masterlink import FollowedMaster

    now: list[MasterEndpoint | None] = [None]
    link = FollowedMaster(lambda: now[0])
    assert link.status() is None
    with pytest.raises(TemporaryError, match="follows no master"):
        link.scale(2)
    now[0] = MasterEndpoint("edl-j-master:8470", TOKEN, adopted=False)
    first = link._current()
    assert first is not None and first.base == "http://edl-j-master:8470" and link._current() is first
    now[0] = MasterEndpoint("edl-j-master:8470", TOKEN, adopted=False)  # recreated: equal, but another
    second = link._current()
    assert second is not None and second is not first and first._http.is_closed
    now[0] = MasterEndpoint("10.0.0.7:8470", TOKEN, adopted=False)  # pod-ip: the successor's own address
    third = link._current()
    assert third is not None and third.base == "http://10.0.0.7:8470"
    link.close()  # a stopped sidecar: nothing more reaches a master
    assert link.status() is None and third._http.is_closed
    with pytest.raises(TemporaryError, match="follows no master"):
        link.scale(2)
