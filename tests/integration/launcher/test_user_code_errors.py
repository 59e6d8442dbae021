"""Exceptions in the user's model definition, through real ``edl train`` runs.

The same exception at the same step twice (on two trainers, or on a trainer and its
replacement) is the user's code: the job fails within one relaunch, exit 2, with one
line naming ``--model-def``, the exception's first line and the trainer log holding
its full traceback. A one-off exception is relaunched like any crash and the job
goes on exactly once (``--audit``). And a finishing job starts no fresh trainers.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.conftest import run_edl

pytestmark = pytest.mark.timeout(240)

SHAPE_ERROR = "ValueError: (InvalidArgument) In operator matmul"

# digits has 64 features: a first layer of 63 inputs does not fit its data.
BAD_SHAPE = """
import paddle
from edl.zoo.digits import optimizer, collate, loss

def model():
    return paddle.nn.Sequential(paddle.nn.Linear(63, 10))
"""

# One record the user's collate cannot handle, read mid-epoch (not in the warm-up batch).
BAD_RECORD = """
from edl.zoo.digits import model, optimizer, loss
from edl.zoo.digits import collate as _collate

def collate(table):
    if {bad_id} in table.column("id").to_pylist():
        raise ValueError("record {bad_id}: cannot decode its features\\n(more detail on a second line)")
    return _collate(table)
"""

# A one-off: the first trainer to reach its fifth loss() raises once; the job goes on. metrics() is
# slow, so that rank 0's final evaluation outlasts its peers' exits (the job's last seconds).
FLAKY = """
import os, time
from edl.zoo.digits import model, optimizer, collate
from edl.zoo._classifier import loss as _loss

MARK = {mark!r}
calls = 0

def loss(outputs, labels):
    global calls
    calls += 1
    if calls == 5:
        try:
            os.close(os.open(MARK, os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            pass
        else:
            raise RuntimeError("flaky: a one-off in loss()")
    return _loss(outputs, labels)

def metrics(scores, labels):
    time.sleep(3.0)
    return {{"accuracy": float((scores.argmax(axis=1) == labels).mean())}}
"""


def write_model(tmp_path: Path, name: str, text: str) -> Path:
    f = tmp_path / f"{name}.py"
    f.write_text(text)
    return f


def train(tmp_path: Path, digits: Path, job: str, model: Path, trainers: int, *extra: str):
    return run_edl("train", "--job-name", job, "--model-def", str(model), "--data", str(digits),
                   "--epochs", "2", "--batch-size", "16", "--min-trainers", "1", "--max-trainers", "3",
                   "--trainers", str(trainers), "--checkpoint-uri", str(tmp_path / "ckpt"), "--audit",
                   "--summary-out", str(tmp_path / "summary.json"), *extra, timeout=200)


def trainers_started(edl_home: Path, job: str) -> list[Path]:
    """Every trainer the launcher started has its own log file (names are never reused)."""
    return sorted((edl_home / "jobs" / job / "logs").glob(f"{job}-t*.log"))


def the_error_line(r) -> str:
    assert "Traceback" not in r.stderr, r.stderr
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("edl: error:")]
    assert len(errors) == 1, r.stderr
    return errors[0]


def assert_traceback_in_the_named_log(line: str, logs: list[Path], *needles: str) -> None:
    named = re.search(r"full traceback in the trainer's log: (\S+)\)$", line)
    assert named, line
    path = Path(named.group(1))
    assert path in logs, (path, logs)
    text = path.read_text(errors="replace")
    assert "Traceback (most recent call last)" in text
    for n in needles:
        assert n in text


@pytest.mark.parametrize("trainers", [1, 2])
def test_a_model_that_does_not_fit_its_data_fails_within_one_relaunch(tmp_path, digits, edl_home, trainers):
    model = write_model(tmp_path, "bad_shape", BAD_SHAPE)
    job = f"shape{trainers}"
    r = train(tmp_path, digits, job, model, trainers)
    assert r.returncode == 2, r.stdout + r.stderr
    line = the_error_line(r)
    assert line.startswith(f"edl: error: --model-def {model}: the model's forward raised {SHAPE_ERROR}"), line
    assert "before the first step" in line
    logs = trainers_started(edl_home, job)
    assert len(logs) <= trainers + 1, logs  # the ones asked for, and at most one relaunch
    # The full Paddle message (its hint on a later line) and the user's frames are in the log.
    assert_traceback_in_the_named_log(line, logs, "[Hint: Expected")
    assert not any(p.name == "MANIFEST.json" for p in (tmp_path / "ckpt").rglob("*"))


def test_a_record_the_collate_cannot_handle_fails_at_its_step_after_one_relaunch(tmp_path, digits, edl_home):
    bad_id = pq.read_table(digits / "train" / "part-00001.parquet").column("id")[100].as_py()
    model = write_model(tmp_path, "bad_record", BAD_RECORD.format(bad_id=bad_id))
    r = train(tmp_path, digits, "record", model, 1, "--checkpoint-interval", "600")
    assert r.returncode == 2, r.stdout + r.stderr
    line = the_error_line(r)
    assert f"--model-def {model}: collate() raised ValueError: record {bad_id}: cannot decode" in line
    assert "second line" not in line
    # Mid-training: the replacement redid that step (a rollback may batch the rows a step apart).
    step = re.search(r"trainers record-t1 and record-t2, at steps? (\d+)", line)
    assert step and int(step.group(1)) > 1, line
    logs = trainers_started(edl_home, "record")
    assert len(logs) == 2, logs
    assert_traceback_in_the_named_log(line, logs, "more detail on a second line", "in collate")


def test_a_one_off_exception_is_relaunched_and_the_job_ends_exactly_once(tmp_path, digits, edl_home):
    model = write_model(tmp_path, "flaky", FLAKY.format(mark=str(tmp_path / "flaked")))
    r = train(tmp_path, digits, "flaky", model, 2)
    assert r.returncode == 0, r.stdout + r.stderr
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["status"] == "succeeded" and s["user_error"] is False
    assert s["trainer_failures"] == 1
    assert (s["lost_samples"], s["duplicate_samples"]) == (0, 0)
    assert s["samples_per_epoch"] == [1438, 1438]
    # Two trainers and one replacement; none started while rank 0 wrote and evaluated the model.
    logs = trainers_started(edl_home, "flaky")
    assert len(logs) == 3, logs
    failed = [p for p in logs if "flaky: a one-off in loss()" in p.read_text(errors="replace")]
    assert len(failed) == 1 and "Traceback (most recent call last)" in failed[0].read_text()
    started = [ln for ln in r.stderr.splitlines() if "ScaleUp: started" in ln]
    assert sum(ln.count("flaky-t") for ln in started) == 3, started
    # The launcher's last line is the job's result (wrapped at the console's width).
    assert "job flaky succeeded" in r.stdout
    assert "".join(r.stdout.split()).endswith(s["final_model_uri"]), r.stdout[-500:]
