"""The retraining pipeline run by kfp.local (SubprocessRunner, use_venv=False) with the local backend."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from edl.errors import PermanentError, UserError
from tests.conftest import run_edl

pytestmark = pytest.mark.timeout(400)


def test_edl_demo_runs_the_pipeline_and_writes_summary_and_timeline(tmp_path):
    out = tmp_path / "demo"
    r = run_edl("demo", "--out", str(out), timeout=360)  # as ./dev demo runs it
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    s = json.loads((out / "summary.json").read_text())
    assert s["status"] == "succeeded" and s["epochs_completed"] == 150
    # The story the README tells: the tenants take a slot and the job hands it back, then grows back once
    # they return it, or the demo's table says why it did not.
    reasons = [g["reason"] for g in s["generations"]]
    assert "scale_down" in reasons, s["generations"]
    assert "scale_up" in reasons[reasons.index("scale_down"):] or "not grown back" in r.stdout, r.stdout
    assert [x["cause"] for x in s["size_reasons"]][:3] == ["growing", "at_max", "handed_back"], s["size_reasons"]
    assert s["lost_samples"] == 0 and s["duplicate_samples"] == 0
    assert s["evaluation"]["accuracy"] > 0.9 and s["published"] is True
    assert (out / "timeline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (out / "timeline.html").read_text().startswith("<!DOCTYPE html>")
    assert (out / "registry" / "current" / "params.npz").exists()
    assert "exactly-once" in r.stdout and "held-out accuracy" in r.stdout
    # Logs for people: no third-party request lines (there were 277 `HTTP Request: GET .../v1/status`),
    # a line per step and per training event; kfp.local's dumps in the log file whose path it prints.
    everything = r.stdout + r.stderr
    assert "HTTP Request:" not in everything
    assert "step elastic-train started" in r.stdout and "step elastic-train: success" in r.stdout
    assert "generation 1: 0 → " in r.stdout
    named = [ln for ln in r.stdout.splitlines() if ln.startswith("the steps' output")]
    assert len(named) == 1, r.stdout
    log = Path(named[0].rsplit(": ", 1)[1])
    assert log.is_file() and log.parent == out
    text = log.read_text()
    assert "Got executor_input:" in text and "'elastic-train'" in text  # the executors' dumps, kfp's task lines
    assert "Got executor_input:" not in everything and "HTTP Request:" not in text
    assert "Cleaned up workspace" in text and not r.stderr.strip(), r.stderr  # kfp's logs too, none on stderr
    assert len(r.stdout.splitlines()) < 80, r.stdout
    # The demo ends with the published model in use: served by edl serve, held-out records sent over HTTP.
    assert (out / "registry" / "current" / "model.onnx").exists()
    served = s["served"]
    assert served["requests"] >= 2 and served["records"] == 359
    assert served["accuracy"] == pytest.approx(s["evaluation"]["accuracy"], abs=1.5 / served["records"])
    assert "held-out accuracy (served" in r.stdout


def test_edl_demo_runs_the_same_pipeline_with_pytorch(tmp_path):
    out = tmp_path / "demo"
    r = run_edl("demo", "--out", str(out), "--epochs", "12", "--framework", "torch", timeout=360)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "edl.zoo.torch.digits" in r.stdout
    s = json.loads((out / "summary.json").read_text())
    assert s["status"] == "succeeded" and s["epochs_completed"] == 12
    assert s["lost_samples"] == 0 and s["duplicate_samples"] == 0
    assert s["evaluation"]["accuracy"] > 0.9 and s["published"] is True
    current = out / "registry" / "current"
    assert (current / "model.pt2").exists() and (current / "model.onnx").exists() and (current / "params.npz").exists()
    served = s["served"]
    assert served["accuracy"] == pytest.approx(s["evaluation"]["accuracy"], abs=1.5 / served["records"])


def test_retraining_warm_starts_from_the_published_model_and_publishes_only_if_better(tmp_path):
    from kfp import local

    from edl.pipeline.retrain import retrain
    from edl.pipeline.tasks import published

    root, registry = tmp_path / "kfp", tmp_path / "registry"
    root.mkdir()
    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(root), raise_on_error=True)
    args = dict(registry_uri=str(registry), checkpoint_uri=str(tmp_path / "checkpoints"), epochs=3, batch_size=32,
                learning_rate=0.003, min_trainers=1, max_trainers=1, sidecar_period_s=2.0, sidecar_jitter_s=0.0)
    retrain(**args)
    first = published(str(registry))
    assert first is not None
    run1 = max((p for p in root.iterdir() if p.is_dir()), key=lambda p: p.stat().st_mtime)
    model1 = _artifact(run1, "elastic-train", "model")
    assert first["source"] == model1["uri"]  # the registry remembers the run's Model artifact
    assert _artifact(run1, "warm-start-from", "model")["metadata"]["published"] is False  # nothing yet
    # An impossible bar: the second run (warm-started) must not replace a better model.
    (registry / "current.json").write_text(json.dumps({**first, "accuracy": 1.01}))
    retrain(**args)
    runs = sorted((p for p in root.iterdir() if p.is_dir()), key=lambda p: p.stat().st_mtime)
    warm = json.loads((runs[-1] / "warm-start-from" / "executor_output.json").read_text())
    assert warm["parameterValues"]["Output"] == model1["uri"]  # the published model's own artifact, not a copy
    assert published(str(registry))["accuracy"] == 1.01  # not beaten: not published
    assert not (runs[-1] / "publish").exists()
    # What the KFP UI shows (part 4 of issue 15): training's warm start is the first run's Model artifact,
    # imported by its URI (link-warm-start); the new model's metadata names it as its parent, and what it is.
    lookup = _artifact(runs[-1], "warm-start-from", "model")
    assert lookup["metadata"]["published"] is True and lookup["metadata"]["source"] == model1["uri"]
    assert lookup["metadata"]["warm_start"] == model1["uri"]
    model2 = _artifact(runs[-1], "elastic-train", "model")
    meta = model2["metadata"]
    assert meta["warm_start"] == model1["uri"] and meta["framework"] == "paddlepaddle"
    assert meta["job"].startswith("run-") and meta["data"].endswith("dataset") and meta["model_def"] == "edl.zoo.digits"
    model_dir = Path(model2["uri"])
    assert ("onnx" in meta) == (model_dir / "model.onnx").exists()
    if "onnx" in meta:
        assert meta["onnx"] == f"{model2['uri']}/model.onnx"
    from edl.pipeline.timeline import embedded_png

    timeline = Path(_artifact(runs[-1], "elastic-train", "timeline")["uri"]).read_text()
    assert timeline.startswith("<!DOCTYPE html>") and embedded_png(timeline)[:8] == b"\x89PNG\r\n\x1a\n"
    matrix = _artifact(runs[-1], "evaluate", "classification")["metadata"]["confusionMatrix"]
    assert [c["displayName"] for c in matrix["annotationSpecs"]] == [str(i) for i in range(10)]
    held_out = sum(sum(r["row"]) for r in matrix["rows"])
    correct = sum(r["row"][i] for i, r in enumerate(matrix["rows"]))
    accuracy = _artifact(runs[-1], "evaluate", "metrics")["metadata"]["accuracy"]
    assert held_out > 0 and abs(correct / held_out - accuracy) < 1e-9  # the matrix is the evaluation's
    # Each run its own job and checkpoint prefix, named after the pipeline job's id (review #1, #7).
    prefixes = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert len(prefixes) == 2 and all(name.startswith("run-") for name in prefixes), prefixes


def _artifact(run: Path, task: str, name: str) -> dict:
    """One output artifact of a task of a kfp.local run (its uri and metadata), from its executor output."""
    out = json.loads((run / task / "executor_output.json").read_text())
    (art,) = out["artifacts"][name]["artifacts"]
    return art


def test_a_warm_start_model_that_does_not_match_fails_with_a_message(tmp_path, digits):
    from edl.pipeline.step import TrainParams, run_elastic_train

    bad = tmp_path / "bad-model"
    bad.mkdir()
    np.savez(bad / "params.npz", **{"fc1.weight": np.zeros((3, 3), dtype="float32")})
    p = TrainParams(data_uri=str(digits), epochs=1, batch_size=32, max_trainers=1, job_name="warmbad",
                    sidecar_period_s=2.0, sidecar_jitter_s=0.0, warm_start_uri=str(bad))
    # The trainer refuses the model; the job fails with its message (and no model is output).
    with pytest.raises((UserError, PermanentError), match="does not match --model-def edl.zoo.digits"):
        run_elastic_train(p, tmp_path / "model", tmp_path / "summary.json", work_dir=tmp_path / "work")
    missing = TrainParams(data_uri=str(digits), epochs=1, batch_size=32, max_trainers=1, job_name="warmnone",
                          sidecar_period_s=2.0, sidecar_jitter_s=0.0, warm_start_uri=str(tmp_path / "nowhere"))
    with pytest.raises(UserError, match="init-model"):
        run_elastic_train(missing, tmp_path / "model2", tmp_path / "summary2.json", work_dir=tmp_path / "work2")
    assert not Path(tmp_path / "model").exists()
