"""When an exception in the user's code fails the job (``edl.master.usercode``), and its route."""

from __future__ import annotations

import asyncio
import time

from starlette.testclient import TestClient

from edl.api.data import Shard
from edl.api.master import UserCodeFailure
from edl.api.spec import JobSpec
from edl.master.job import Job
from edl.master.server import Master, build_app
from edl.master.usercode import UserCodeFailures

SHAPE = "ValueError: (InvalidArgument) In operator matmul, the [1] dimension of Input(X) must be equal"
FORWARD = "the model's forward"


def failure(trainer: str, step: int = 0, fingerprint: str = SHAPE, part: str = FORWARD,
            rows: tuple[tuple[str, int, int], ...] = ()) -> UserCodeFailure:
    return UserCodeFailure(trainer, step, part, fingerprint, f"/logs/{trainer}.log", rows)


def test_one_failure_is_relaunched_the_same_from_a_second_trainer_is_the_user_s():
    judge = UserCodeFailures("my/model.py")
    assert judge.judge(failure("t1")) is None  # could be a fluke: relaunch
    error = judge.judge(failure("t2"))  # its replacement (or a peer) at the same step: the code
    assert error == (f"--model-def my/model.py: the model's forward raised {SHAPE} (trainers t1 and t2, before "
                     "the first step; full traceback in the trainer's log: /logs/t2.log)")
    assert "\n" not in error


def test_the_same_trainer_reporting_again_counts_once():
    judge = UserCodeFailures("m")
    assert judge.judge(failure("t1", 4)) is None
    assert judge.judge(failure("t1", 4)) is None
    assert len(judge.seen) == 1


def test_another_step_another_exception_or_another_part_keeps_relaunching():
    judge = UserCodeFailures("m")
    assert judge.judge(failure("t1", 3)) is None
    assert judge.judge(failure("t2", 5)) is None  # the same message at another step: not proven
    assert judge.judge(failure("t3", 3, "RuntimeError: flaky read")) is None
    assert judge.judge(failure("t4", 3, part="collate()")) is None
    error = judge.judge(failure("t5", 5))  # but the step-5 failure again: the code
    assert error is not None and "trainers t2 and t5, at step 5" in error


def test_the_same_rows_at_another_step_are_the_same_place():
    """A rollback, or a task handed to a peer, may batch the rows that raise one step apart."""
    judge = UserCodeFailures("m")
    bad = "ValueError: record 17: cannot decode"
    assert judge.judge(failure("t1", 13, bad, "collate()", (("a.parquet", 96, 112),))) is None
    assert judge.judge(failure("t2", 20, bad, "collate()", (("b.parquet", 96, 112),))) is None  # other rows
    assert judge.judge(failure("t3", 21, bad, "collate()", (("a.parquet", 0, 10), ("a.parquet", 112, 118)))) is None
    error = judge.judge(failure("t4", 14, bad, "collate()", (("a.parquet", 100, 116),)))
    assert error is not None and "(trainers t1 and t4, at steps 13 and 14, on the same rows;" in error


def test_with_nothing_left_to_retry_the_first_failure_fails_the_job():
    judge = UserCodeFailures("m")
    error = judge.judge(failure("t1", 90, "KeyError: 'accuracy'", "metrics()"), can_retry=False)
    assert error is not None and error.startswith("--model-def m: metrics() raised KeyError: 'accuracy'")
    assert "after the last step" in error


def make_job() -> tuple[TestClient, Job]:
    spec = JobSpec(job="uc", model_def="bad.py", data="d", epochs=1, batch_size=4, min_trainers=1, max_trainers=3,
                   trainers=2, checkpoint_uri="/tmp/x")
    job = Job(spec, [Shard("a.parquet", 40)], master_uid="1", now=time.monotonic())
    master = asyncio.new_event_loop().run_until_complete(_master(job))
    return TestClient(build_app(master)), job


async def _master(job: Job) -> Master:
    return Master(job, "tok")


def test_the_route_fails_the_job_as_a_user_error_and_the_status_and_summary_say_so():
    client, job = make_job()
    auth = {"Authorization": "Bearer tok"}
    body = {"step": 0, "part": FORWARD, "fingerprint": SHAPE, "log": "/logs/x.log"}
    r = client.post("/v1/trainers/uc-t1/user-code-failed", json=body, headers=auth)
    assert r.json() == {"user_error": False, "error": None}
    assert client.get("/v1/status", headers=auth).json()["status"] == "running"
    r = client.post("/v1/trainers/uc-t2/user-code-failed", json=body, headers=auth)
    assert r.json()["user_error"] is True and r.json()["error"].startswith("--model-def bad.py: the model's forward")
    st = client.get("/v1/status", headers=auth).json()
    assert st["status"] == "failed" and st["user_error"] is True
    summary = client.get("/v1/summary", headers=auth).json()
    assert summary["user_error"] is True and summary["error"] == r.json()["error"]
    assert client.post("/v1/trainers/uc-t1/user-code-failed", json=body, headers={}).status_code == 401


def test_a_fatal_report_says_whether_it_is_the_user_s():
    client, job = make_job()
    auth = {"Authorization": "Bearer tok"}
    client.post("/v1/fatal", json={"message": "--init-model x: does not match"}, headers=auth)
    assert job.status.value == "failed" and not job.user_error
    client, job = make_job()
    client.post("/v1/fatal", json={"message": "--init-model x: does not match", "user": True}, headers=auth)
    assert job.user_error and job.summary(time.monotonic())["user_error"] is True
