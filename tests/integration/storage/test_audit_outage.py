"""An audited local job through an outage of its S3 store (a real MinIO, stopped and started again):
training does not wait for the store, a trainer killed while it is away loses none of its records
(they wait in the job's directory, and the launcher moves them when the job ends), and the verdict
counts every record once."""

from __future__ import annotations

import json
import os
import signal

import pytest

from tests.integration.launcher.test_elastic_jobs import job_args
from tests.plane import build
from tests.plane.fixtures import built
from tests.plane.s3 import MinioServer

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def minio(tmp_path):
    built(build.MINIO, "MinIO")
    server = MinioServer(tmp_path / "minio").start()
    try:
        server.client().make_bucket("ckpts")
        yield server
    finally:
        server.stop()


def test_an_audited_job_trains_through_an_s3_outage_and_a_trainer_killed_in_it(minio, digits, tmp_path, job_runner):
    args = job_args(digits, tmp_path, epochs=30, trainers=2, max_t=2, interval=0.5)
    args[args.index("--checkpoint-uri") + 1] = "s3://ckpts/audited"
    job = job_runner("audited", args, env=minio.env).start()
    st = job.wait_for(lambda s: len(s["checkpoints"]) >= 1 and s["world_size"] == 2, what="a first checkpoint")
    minio.stop()
    before = job.wait_for(lambda s: True, what="status")["step"]
    # Training goes on while S3 is down (it stays down until then): the records wait in the job's directory.
    st = job.wait_for(lambda s: s["step"] > before + 10, timeout=60, what="steps while S3 is down")
    victim = next(t for t in st["trainers"] if t["rank"] == 1)
    spool = job.home / "jobs" / "audited" / "audit-spool"
    os.kill(victim["pid"], signal.SIGKILL)  # its records since the outage are only in the job's directory
    assert any(p.is_file() for p in (spool / "audit" / victim["id"]).rglob("*.jsonl"))
    job.wait_for(lambda s: any(g["reason"] == "failure" for g in s["generations"]), what="the kill seen")
    minio.start()
    assert job.wait(240) == 0, job.output()
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["status"] == "succeeded" and s["lost_samples"] == 0 and s["duplicate_samples"] == 0, s
    assert "records the trainers kept" in job.output()
    assert not any(p.is_file() for p in spool.rglob("*.jsonl"))
    logs = (job.home / "jobs" / "audited" / "logs").glob("audited-t*.log")
    assert any("records wait in" in p.read_text() for p in logs)
