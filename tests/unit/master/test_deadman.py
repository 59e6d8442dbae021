"""The dead-man switch (``edl.master.deadman``) as a pure rule, and what the job answers once it trips."""

from __future__ import annotations

from edl.api.data import Shard
from edl.api.master import JobStatus, NoAssignment, Unassigned
from edl.api.spec import JobSpec
from edl.master.deadman import DeadMan, LauncherState
from edl.master.job import Job


def test_silence_past_the_timeout_after_the_last_beat_abandons_then_the_linger_ends_it():
    d = DeadMan(timeout_s=30, last_beat=100.0, linger_s=10)
    assert d.state(129.9) is LauncherState.WATCHING  # 29.9 s after the master's own start
    d.beat(125.0)
    assert d.state(154.9) is LauncherState.WATCHING  # the beat reset the timeout
    assert d.state(155.0) is LauncherState.ABANDONED and d.abandoned_at == 155.0 and d.silent_s(155.0) == 30.0
    assert d.state(164.9) is LauncherState.ABANDONED
    assert d.state(165.0) is LauncherState.OVER


def test_a_beat_after_the_abandonment_does_not_bring_the_job_back():
    d = DeadMan(timeout_s=30, last_beat=0.0)
    assert d.state(31.0) is LauncherState.ABANDONED
    d.beat(32.0)  # a retried launcher too late: the trainers are already leaving
    assert d.abandoned and d.last_beat == 0.0 and d.state(32.0) is LauncherState.ABANDONED


def test_beats_never_move_the_last_beat_back():
    d = DeadMan(timeout_s=30, last_beat=50.0)
    d.beat(40.0)  # a delayed request
    assert d.last_beat == 50.0


def spec(timeout: float = 30.0) -> JobSpec:
    return JobSpec(job="dm", model_def="m", data="d", epochs=1, batch_size=4, min_trainers=1, max_trainers=2,
                   trainers=1, checkpoint_uri="/tmp/x", launcher_timeout_s=timeout)


def test_a_restarted_master_gives_the_launcher_the_full_timeout_from_its_own_start():
    job = Job(spec(), [Shard("a.parquet", 40)], master_uid="2", now=1000.0)  # the launcher's beats went to the old one
    assert job.launcher(1029.0) is LauncherState.WATCHING and not job.abandoned
    job.launcher_beat(1029.0)  # the (adopting) launcher beats the new master
    assert job.launcher(1058.0) is LauncherState.WATCHING
    assert job.launcher(1059.0) is LauncherState.ABANDONED


def test_an_abandoned_job_tells_every_trainer_to_stop_and_leave():
    job = Job(spec(timeout=10), [Shard("a.parquet", 40)], master_uid="1", now=0.0)
    job.register("t1", 1, "h", 1, now=1.0)
    job.register("t2", 2, "h", 2, now=1.0)
    assert not job.heartbeat("t1", 0, None, now=2.0).abandoned
    assert not isinstance(job.assignment_answer("t1", after=0), NoAssignment)  # in generation 1
    job.tick(11.0)  # no beat since the start
    for t in ("t1", "t2"):
        answer = job.heartbeat(t, 0, None, now=11.5)
        assert answer.stop and answer.abandoned and answer.job_status is JobStatus.RUNNING
        assert job.assignment_answer(t, after=0) == NoAssignment(Unassigned.ABANDONED)
    view = job.status_view(11.5)
    assert view.abandoned and view.status is JobStatus.RUNNING  # not failed: resumable by a later run
    assert job.tick(12.0) is None


def test_a_finished_job_whose_launcher_went_silent_ends_too():
    job = Job(spec(timeout=10), [Shard("a.parquet", 40)], master_uid="1", now=0.0)
    job.finish(5, None, {}, now=3.0)
    assert job.launcher(13.0) is LauncherState.ABANDONED and job.status is JobStatus.SUCCEEDED


def test_the_beat_route_needs_the_token_and_the_ticker_ends_the_master_after_the_linger():
    import asyncio

    from starlette.testclient import TestClient

    from edl.master.server import Master, build_app

    now = [0.0]
    job = Job(spec(timeout=10), [Shard("a.parquet", 40)], master_uid="1", now=0.0)

    async def make() -> Master:
        return Master(job, "tok", clock=lambda: now[0])

    loop = asyncio.new_event_loop()
    master = loop.run_until_complete(make())
    http = TestClient(build_app(master))
    assert http.post("/v1/launcher/beat").status_code == 401
    now[0] = 9.0
    assert http.post("/v1/launcher/beat", headers={"Authorization": "Bearer tok"}).json() == {
        "ok": True, "abandoned": False}
    assert job.deadman.last_beat == 9.0

    async def tick_until_shutdown() -> bool:
        ticker = asyncio.create_task(master.ticker(period=0.01))
        try:
            now[0] = 18.9
            await asyncio.sleep(0.05)
            assert not job.abandoned
            now[0] = 19.0  # 10 s of silence
            await asyncio.sleep(0.05)
            assert job.abandoned and not master.shutdown_requested.is_set()
            now[0] = 29.0  # the linger is over
            await asyncio.wait_for(master.shutdown_requested.wait(), 5)
            return True
        finally:
            ticker.cancel()

    assert loop.run_until_complete(tick_until_shutdown())
