"""Bad input: one clear line on stderr, a non-zero exit, no stack trace, nothing half-written."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.conftest import run_edl
from tests.integration.launcher.test_elastic_jobs import slow_model_def
from tests.waits import wait_for

pytestmark = pytest.mark.timeout(120)


def train(tmp_path, digits, *extra: str, env=None, **over):
    args = {
        "--model-def": "edl.zoo.digits", "--data": str(digits), "--epochs": "1", "--batch-size": "32",
        "--min-trainers": "1", "--max-trainers": "2", "--trainers": "1",
        "--checkpoint-uri": str(tmp_path / "ckpt"), "--job-name": "bad",
    }
    args.update(over)
    argv = ["train"]
    for k, v in args.items():
        argv += [k, v]
    return run_edl(*argv, *extra, env=env)


def assert_one_line_error(r, *needles: str) -> None:
    assert r.returncode != 0, r.stdout + r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("edl: error:")]
    assert len(errors) == 1, r.stderr
    for n in needles:
        assert n in errors[0], errors[0]


def assert_no_checkpoint(tmp_path) -> None:
    ckpt = tmp_path / "ckpt"
    assert not ckpt.exists() or not any(p.name == "MANIFEST.json" for p in ckpt.rglob("*"))


def test_unimportable_model_definition(tmp_path, digits):
    r = train(tmp_path, digits, **{"--model-def": "no_such_pkg.model"})
    assert_one_line_error(r, "no_such_pkg.model", "cannot be imported")
    assert_no_checkpoint(tmp_path)


def test_model_definition_missing_functions(tmp_path, digits):
    f = tmp_path / "m.py"
    f.write_text("def model():\n    return None\n")
    r = train(tmp_path, digits, **{"--model-def": str(f)})
    assert_one_line_error(r, "does not define", "loss")


def test_missing_data_set(tmp_path, digits):
    r = train(tmp_path, digits, **{"--data": str(tmp_path / "nowhere")})
    assert_one_line_error(r, "--data", "nowhere")
    assert not (tmp_path / "ckpt").exists()


def test_empty_data_set(tmp_path, digits):
    (tmp_path / "empty").mkdir()
    r = train(tmp_path, digits, **{"--data": str(tmp_path / "empty")})
    assert_one_line_error(r, "no .parquet files")
    t = pa.table({"id": pa.array([], pa.int64()), "label": pa.array([], pa.int64())})
    pq.write_table(t, tmp_path / "empty" / "part-0.parquet")
    r = train(tmp_path, digits, **{"--data": str(tmp_path / "empty")})
    assert_one_line_error(r, "empty")


def test_corrupt_parquet_shard(tmp_path, digits):
    import shutil

    data = tmp_path / "data"
    shutil.copytree(digits / "train", data)
    (data / "part-00001.parquet").write_bytes(b"PAR1 this is not parquet")
    r = train(tmp_path, digits, **{"--data": str(data)})
    assert_one_line_error(r, "corrupt Parquet shard", "part-00001.parquet")
    assert not (tmp_path / "ckpt").exists()


@pytest.mark.parametrize("over, needle", [
    ({"--min-trainers": "3", "--max-trainers": "2"}, "--min-trainers 3 is greater than --max-trainers 2"),
    ({"--trainers": "5"}, "--trainers 5 is outside"),
    ({"--checkpoint-uri": "gs://bucket/x"}, "unknown URI scheme 'gs'"),
    ({"--data": "ftp://host/x"}, "unknown URI scheme 'ftp'"),
    # Once accepted: every trainer crash-looped ("learning_rate is not set"), or nothing was said at all.
    ({"--learning-rate": "nan"}, "--learning-rate must be a positive number (got nan)"),
    ({"--learning-rate": "inf"}, "--learning-rate must be a positive number (got inf)"),
    ({"--checkpoint-interval": "-1"}, "--checkpoint-interval must be a positive number of seconds"),
    ({"--rows-per-task": "-4"}, "--rows-per-task must be at least 1, or 0 for 4 x --batch-size"),
    ({"--max-trainer-failures": "-1"}, "--max-trainer-failures must be 0 or more"),
    ({"--max-task-failures": "0"}, "--max-task-failures must be at least 1"),
    # Once "cannot reach S3 endpoint ...: ValueError": minio refused the name inside the first request.
    ({"--checkpoint-uri": "s3://ck/x"}, "--checkpoint-uri 's3://ck/x': bucket name 'ck' is not allowed by S3"),
])
def test_bad_flags(tmp_path, digits, over, needle):
    r = train(tmp_path, digits, **over)
    assert_one_line_error(r, needle)
    assert r.returncode == 2
    assert not (tmp_path / "ckpt").exists() and not (tmp_path / "edl-home").exists()


def test_unreachable_s3_endpoint_at_start(tmp_path, digits):
    env = {"AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s"}
    r = train(tmp_path, digits, env=env, **{"--checkpoint-uri": "s3://bucket/ckpt"})
    assert_one_line_error(r, "cannot reach S3 endpoint http://127.0.0.1:9", "Connection refused")


def test_nan_loss_stops_the_job_naming_the_step(tmp_path, digits):
    f = tmp_path / "nan_model.py"
    f.write_text(
        "from edl.zoo.digits import model, optimizer, collate\n"
        "from edl.zoo._classifier import loss as _loss\n"
        "def loss(outputs, labels):\n"
        "    return _loss(outputs, labels) * float('nan')\n"
    )
    r = train(tmp_path, digits, "--summary-out", str(tmp_path / "s.json"), **{"--model-def": str(f)})
    assert_one_line_error(r, "loss is nan at step 1")
    s = json.loads((tmp_path / "s.json").read_text())
    assert s["status"] == "failed" and "step 1" in s["error"]
    assert_no_checkpoint(tmp_path)


def test_wrong_token_is_refused(tmp_path, digits, job_runner, edl_home):
    job = job_runner("tok", [
        "--model-def", slow_model_def(tmp_path, "edl.zoo.digits", 0.02), "--data", str(digits), "--epochs", "200",
        "--batch-size", "16",
        "--checkpoint-uri", str(tmp_path / "ck"),
    ]).start()
    job.wait_for(lambda s: s["world_size"] == 1, what="a running job")
    path = edl_home / "jobs" / "tok" / "job.json"
    # The launcher rewrites the file when it starts a process (its spare master comes 5 s after the
    # master): the token is changed once the spare is up, so it stays changed.
    info = wait_for(lambda: (i := json.loads(path.read_text()))["standby_pid"] and i, 60, "the spare master")
    info["token"] = "not-the-token"
    path.write_text(json.dumps(info))
    r = run_edl("scale", "tok", "--trainers", "2")
    assert_one_line_error(r, "refused our job token (401)")
    r = run_edl("status", "tok", "--json")
    assert_one_line_error(r, "401")


BRACKETED = ("[/paddle/third_party/gloo/gloo/transport/tcp/pair.cc:576] Read error [127.0.0.1]:41235: "
             "Connection reset by peer [bold]x[/] [link=x]y :smile:")


def test_a_trainer_dying_with_brackets_in_its_last_line_is_reported_verbatim(tmp_path, digits):
    """Its last line once raised rich's MarkupError inside ``edl train``: a traceback and no summary."""
    f = tmp_path / "bracket_model.py"
    f.write_text(
        "from edl.zoo.digits import model, optimizer, collate\n"
        "def loss(outputs, labels):\n"
        f"    raise RuntimeError({BRACKETED!r})\n"
    )
    r = train(tmp_path, digits, "--max-trainer-failures", "0", **{"--model-def": str(f)})
    assert "MarkupError" not in r.stdout + r.stderr, r.stdout + r.stderr
    assert_one_line_error(r, BRACKETED)


# A framework absent, simulated: a meta-path finder that answers for its modules as Python does for a
# package that is not installed (ModuleNotFoundError), from `import paddle` and from
# importlib.util.find_spec alike. PYTHONPATH puts it in edl train and in every process it would start.
NO_MODULES = """
import sys

ABSENT = {absent!r}


class Absent:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in ABSENT:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None


sys.meta_path.insert(0, Absent())
"""


def absent_env(tmp_path, *modules: str) -> dict[str, str]:
    site = tmp_path / "absent"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(NO_MODULES.format(absent=sorted(modules)))
    env = {"PYTHONPATH": os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH")) if p)}
    for m in modules:
        probe = subprocess.run([sys.executable, "-c", f"import {m}"], capture_output=True, text=True, timeout=60,
                               env={**os.environ, **env})
        assert probe.returncode == 1 and f"No module named '{m}'" in probe.stderr, probe.stderr  # the simulation holds
    return env


def no_paddle_env(tmp_path) -> dict[str, str]:
    return absent_env(tmp_path, "paddle")


def test_edl_train_without_paddlepaddle_refuses_before_starting_anything(tmp_path, digits, edl_home):
    r = train(tmp_path, digits, env=no_paddle_env(tmp_path))
    assert_one_line_error(r, "PaddlePaddle is not installed", "--model-def edl.zoo.digits imports paddle",
                          "pip install 'edl[paddle]'")
    assert r.returncode == 2
    assert not (edl_home / "jobs").exists()  # no job directory: no master, no trainer, no log was started
    assert not (tmp_path / "ckpt").exists()


def test_edl_launch_does_not_need_paddlepaddle_here(tmp_path):
    """On Kubernetes the trainers run in the trainer image: the launcher goes on to the cluster."""
    r = run_edl("launch", "--job-name", "nopaddle", "--model-def", "edl.zoo.digits", "--data", "s3://data/d",
                "--epochs", "1", "--batch-size", "8", "--checkpoint-uri", "s3://ckpt/x", "--s3-secret", "s3",
                "--kubeconfig", str(tmp_path / "no-kubeconfig"), env=no_paddle_env(tmp_path))
    assert_one_line_error(r, "no Kubernetes configuration")
    assert "edl[paddle]" not in r.stderr


def test_a_trainer_without_any_framework_is_a_user_error_naming_the_extras(tmp_path):
    """Exit 2: the launcher fails the job at once instead of relaunching the trainer (a trainer image without one)."""
    env = {**absent_env(tmp_path, "paddle", "torch"), "EDL_TOKEN": "t"}
    r = run_edl("trainer", "--id", "t1", "--master", "127.0.0.1:9", env=env)
    assert_one_line_error(r, "neither PaddlePaddle nor PyTorch is installed", "pip install 'edl[paddle]'",
                          "pip install 'edl[torch]'")
    assert r.returncode == 2
