"""Checkpoints and data on a real S3 endpoint (moto's server on loopback), through the minio client."""

from __future__ import annotations

import io
import json
import time

import pytest

from edl.errors import StorageError, UserError
from edl.storage.checkpoint import CheckpointStore
from edl.storage.modelsource import model_def_source
from edl.storage.store import S3Store, open_store
from tests.conftest import run_edl

pytestmark = pytest.mark.timeout(240)


def test_s3_store_round_trip_and_corrupt_checkpoint_skipped(s3):
    store = open_store("s3://ckpts/job-a", "--checkpoint-uri")
    assert isinstance(store, S3Store)
    store.check()  # creates the bucket
    ck = CheckpointStore(store, keep=2)
    for step in (5, 6, 7):
        ck.write(step, {"x.json": json.dumps({"step": step}).encode()})
    names = sorted({o.object_name.split("/")[1] for o in s3.client().list_objects("ckpts", "job-a/", recursive=True)})
    assert names == ["ckpt-000000000006", "ckpt-000000000007"]
    s3.client().put_object("ckpts", "job-a/ckpt-000000000007/x.json", io.BytesIO(b"tampered"), 8)
    warned: list[str] = []
    found = ck.latest(warn=warned.append)
    assert found[0].step == 6 and "checksum mismatch" in warned[0]


@pytest.mark.parametrize("kind", ["file", "s3"])
def test_a_listing_takes_a_string_prefix_on_both_stores(kind, s3, tmp_path):
    """S3's prefixes are strings, not folders; the file store lists the same keys for the same prefix
    (the checkpoints list ``ckpt-`` only, never the audit log's object per trainer step beside them)."""
    store = open_store(str(tmp_path / "job") if kind == "file" else "s3://lists/job", "URI")
    store.check()
    keys = ["audit/t1/00001.jsonl", "ckpt-000000000006/MANIFEST.json", "ckpt-000000000006/x.json",
            "ckpt-000000000007/x.json", "ckpt.txt", "model/params.npz"]
    for k in keys:
        store.put(k, b"x")
    assert store.list("") == keys
    assert store.list("ckpt-") == keys[1:4]
    assert store.list("ckpt") == keys[1:5]
    assert store.list("ckpt-000000000006/") == keys[1:3]
    assert store.list("ckpt-000000000006/x.json") == [keys[2]]
    assert store.list("audit/") == keys[:1] and store.list("nothing/") == [] and store.list("nothing") == []
    assert CheckpointStore(store, keep=3).committed() == ["ckpt-000000000006"]


# A user's own model, as a file the trainers' Python does not have: each trainer reads it from S3.
USER_MODEL = b"""from edl.zoo.digits import collate, loss, model, optimizer

TRAINED_FROM = __file__
"""


def test_training_with_s3_data_checkpoints_and_model_def(s3, digits, tmp_path):
    r = run_edl("data", "prepare", "digits", "--out", "s3://data/digits")
    assert r.returncode == 0, r.stderr
    models = open_store("s3://models/team", "URI")
    models.check()  # creates the bucket
    models.put("digits.py", USER_MODEL)
    args = ["train", "--model-def", "s3://models/team/digits.py", "--data", "s3://data/digits", "--epochs", "3",
            "--batch-size", "32", "--min-trainers", "1", "--max-trainers", "2", "--trainers", "2",
            "--checkpoint-uri", "s3://ckpts/digits-job", "--checkpoint-interval", "0.5", "--job-name", "s3job",
            "--audit", "--summary-out", str(tmp_path / "s.json")]
    r = run_edl(*args, timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    s = json.loads((tmp_path / "s.json").read_text())
    assert s["status"] == "succeeded" and s["lost_samples"] == 0 and s["duplicate_samples"] == 0
    assert s["audited_samples_per_epoch"] == [1438] * 3  # every training row once per epoch, read back from S3
    assert s["final_model_uri"] == "s3://ckpts/digits-job/model"
    keys = {o.object_name for o in s3.client().list_objects("ckpts", "digits-job/", recursive=True)}
    # The audit log lives in the checkpoint store (as trainer pods on a cluster write it), not on a disk.
    audit = {k for k in keys if k.startswith("digits-job/audit/")}
    assert {"s3job-t1", "s3job-t2"} <= {k.split("/")[2] for k in audit}
    assert any(k.endswith("MANIFEST.json") for k in keys)
    assert any(k.startswith("digits-job/model/inference") for k in keys)
    assert s["metrics"]["accuracy"] > 0.5
    # Running the same command again resumes from the final checkpoint and has nothing left to do.
    r = run_edl(*args, timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    s2 = json.loads((tmp_path / "s.json").read_text())
    assert s2["resumed_from"].startswith("s3://ckpts/digits-job/ckpt-")


def test_storage_outage_is_retried_while_training_continues(s3, digits, tmp_path, job_runner, monkeypatch):
    # 24 epochs (2160 steps): the outage and its recovery (3 s, moto's restart, at most 5 s of back-off)
    # take a few hundred steps; 60 epochs only made the job go on long after.
    job = job_runner("outage", [
        "--model-def", "edl.zoo.digits", "--data", str(digits), "--epochs", "24", "--batch-size", "16",
        "--trainers", "1", "--checkpoint-uri", "s3://ckpts/outage", "--checkpoint-interval", "0.5",
        "--summary-out", str(tmp_path / "s.json"),
    ], env=s3.env).start()
    job.wait_for(lambda s: len(s["checkpoints"]) >= 1, what="a first checkpoint")
    s3.stop()
    st = job.wait_for(lambda s: True, what="status")
    step_at_outage = st["step"]
    n_ckpt = len(st["checkpoints"])
    time.sleep(3)
    during = job.status()
    assert during["step"] > step_at_outage + 20  # training did not wait for storage
    assert len(during["checkpoints"]) == n_ckpt
    s3.start()
    s3.client().make_bucket("ckpts")  # moto keeps nothing across restarts
    job.wait_for(lambda s: len(s["checkpoints"]) > n_ckpt, what="checkpoints after the outage")
    assert job.wait() == 0, job.output()
    assert "cannot reach S3 endpoint" in (job.home / "jobs" / "outage" / "logs" / "outage-t1.log").read_text()


def test_a_model_def_in_s3_is_read_whole_and_a_wrong_one_is_named(s3):
    from edl.modeldef import load_model_def

    store = open_store("s3://models/team", "URI")
    store.check()
    store.put("digits.py", USER_MODEL)
    store.put("latin1.py", "# caf\xe9\n".encode("latin-1"))
    md = load_model_def("s3://models/team/digits.py", model_def_source("s3://models/team/digits.py"))
    assert md.module.TRAINED_FROM == "s3://models/team/digits.py" and callable(md.collate)
    assert model_def_source("edl.zoo.digits") is None and model_def_source("/tmp/my_model.py") is None
    for spec, why in (("s3://models/team/nothing.py", "no such object"), ("s3://models/team", "a .py object"),
                      ("s3://models/team/latin1.py", "not UTF-8"), ("s3://models/team/digits.txt", "a .py object")):
        with pytest.raises(UserError, match=why) as e:
            model_def_source(spec)
        assert spec in str(e.value) and "\n" not in str(e.value)


def test_s3_errors_are_storage_errors(monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "k")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s")
    monkeypatch.setenv("EDL_STORAGE_RETRY_S", "0.5")
    store = open_store("s3://bkt/p")
    with pytest.raises(StorageError, match="cannot reach S3 endpoint"):
        store.check()


def test_the_first_publish_creates_the_registry_bucket(s3, tmp_path):
    """Found running the CronWorkflow through Argo on real MinIO: publishing into a bucket that
    does not exist yet failed (NoSuchBucket), so a first scheduled run could never publish."""
    from edl.pipeline.tasks import publish_model, published

    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "inference.json").write_text("{}")
    uri = publish_model(str(tmp_path / "model"), 0.9, "s3://fresh-registry/digits")
    assert uri == "s3://fresh-registry/digits/current"
    assert published("s3://fresh-registry/digits")["accuracy"] == 0.9


def test_the_run_lock_and_owner_record_on_s3_conditional_writes(s3):
    """The same claims as on files, through S3 If-None-Match/If-Match (moto honours both, like S3 and MinIO)."""
    from edl.api.spec import JobSpec
    from edl.errors import UserError
    from edl.storage.claim import LOCK_KEY, OWNER_KEY, Holder, LockRecord, PrefixClaim

    def spec(job: str) -> JobSpec:
        return JobSpec(job=job, model_def="edl.zoo.digits", data="/d", epochs=1, batch_size=16, min_trainers=1,
                       max_trainers=1, trainers=1, checkpoint_uri="s3://ckpts/claimed")

    store = open_store("s3://ckpts/claimed")
    store.check()
    assert store.put_if("k", b"1", None) and store.put_if("k", b"2", None) is None
    first = PrefixClaim(store, spec("a"))
    first.acquire(Holder.of_this_process("token-1"))
    assert store.exists(OWNER_KEY)
    renewing: list[float] = []  # the first run renews while the other watches

    def watch(s: float) -> None:
        renewing.append(s)
        first.renew()

    with pytest.raises(UserError, match="job 'a' is already running"):
        PrefixClaim(store, spec("a"), clock=lambda: sum(renewing), sleep=watch).acquire(
            Holder("other-run", 1, "elsewhere", "h"))
    assert sum(renewing) <= 2.0  # refused once seen renewed
    with pytest.raises(UserError, match="belongs to job 'a'"):
        PrefixClaim(store, spec("b")).check_owner()
    assert first.renew()
    # The run dies without releasing; once its lock has gone unrenewed for its TTL, the next run takes it over.
    stale = LockRecord(Holder("dead-run", 1, "elsewhere", "h"), "a").to_bytes()
    s3.client().put_object("ckpts", f"claimed/{LOCK_KEY}", io.BytesIO(stale), len(stale))
    assert not first.renew()  # its version is gone: it lost the lock
    waited: list[float] = []
    second = PrefixClaim(store, spec("a"), clock=lambda: sum(waited), sleep=waited.append)
    second.acquire(Holder("next-run", 2, "elsewhere", "h"))  # after watching it unchanged for its TTL
    assert 20.0 <= sum(waited) <= 22.0
    assert LockRecord.from_bytes(store.get(LOCK_KEY)).holder.id == "next-run"
    second.release()
    assert not store.exists(LOCK_KEY)
