"""What began each change, as the job's records give it (the launcher's Event and ``edl status`` show it):
the trainer, how the master heard of it, and when, on the wall clock as well as the master's own."""

from __future__ import annotations

import json

from edl.api.data import Cursor, Shard
from edl.api.master import GenerationSummary, SyncReport, TrainerState, to_json
from edl.api.spec import JobSpec
from edl.master.job import Job, Timeouts


def started(trainers: int = 3) -> Job:
    spec = JobSpec(job="m", model_def="m", data="d", epochs=1, batch_size=4, min_trainers=1,
                   max_trainers=4, trainers=trainers, checkpoint_uri="/tmp/x")
    job = Job(spec, [Shard("a.parquet", 4000)], master_uid="1", now=0.0, timeouts=Timeouts(prepare=False),
              wall_offset=1_700_000_000.0)
    for i in range(trainers):
        job.register(f"t{i}", i + 1, "h", 9000 + i, now=0.0)
    job.tick(0.1)
    return job


def report_all(job: Job, step: int, now: float) -> None:
    m = job.membership
    for t in m.members():
        if m.trainers[t].state in (TrainerState.ACTIVE, TrainerState.DRAINING):
            job.sync(SyncReport(t, m.current.id, step, {t: Cursor(1, 2)}, 7000, True), now)


def test_an_exit_the_launcher_saw_and_a_trainer_told_to_stop_are_each_a_generations_cause():
    job = started(3)
    job.trainer_exited("t2", 137, 5.0)
    report_all(job, 20, 5.2)
    job.leave("t1", 8.0)
    report_all(job, 30, 8.3)
    causes = [g.cause for g in job.generation_summaries()]
    assert causes == ["the job started", "t2 ended (exit 137; seen by the launcher)",
                      "t1 told to stop (SIGTERM: its pod deleted or preempted)"]


def test_a_generations_record_gives_its_change_on_the_wall_clock_and_survives_json():
    job = started(2)
    job.trainer_exited("t1", 137, 5.0)
    report_all(job, 20, 5.25)
    g = job.generation_summaries()[-1]
    assert g.wall_at == 1_700_000_005.0 and g.chain() == {"stopped": 0.25, "formed": 0.25}
    back = GenerationSummary.from_json(json.loads(json.dumps(to_json(g))))
    assert back == g
    assert back.describe() == ("generation 2 (failure, 1 trainers): t1 ended (exit 137; seen by the launcher); "
                               "stopped +0.25 s, formed +0.25 s")



def test_the_run_summary_gives_each_generations_cause_wall_clock_time_and_chain():
    job = started(2)
    job.trainer_exited("t1", 137, 5.0)
    report_all(job, 20, 5.25)
    last = job.summary(6.0)["generations"][-1]
    assert last["cause"] == "t1 ended (exit 137; seen by the launcher)" and last["source"] == "peer"
    assert last["wall_at"] == 1_700_000_005.0 and last["chain"] == {"stopped": 0.25, "formed": 0.25}
