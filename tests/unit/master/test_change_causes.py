"""What began each change, as the job's records give it (the launcher's Event and ``edl status`` show it):
the trainer, how the master heard of it, and when, on the wall clock as well as the master's own."""

from __future__ import annotations

import json

from edl.api.master import GenerationSummary, to_json
from edl.master.job import Job
from tests.unit.master.test_leave_at_min import report_all
from tests.unit.master.test_leave_at_min import started as started_at_min


def started(trainers: int = 3) -> Job:
    job = started_at_min(trainers, min_trainers=1)
    job.wall_offset = 1_700_000_000.0
    return job


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
