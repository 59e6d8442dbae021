"""What the KFP UI renders, checked on the compiled pipeline (its IR): the artifact types it draws,
the warm start as a Model artifact (lineage), the optional deploy step; and the pieces behind them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import yaml

REPO = Path(__file__).resolve().parents[3]


def _compiled() -> dict:
    return next(yaml.safe_load_all((REPO / "pipelines" / "retrain.pipeline.yaml").read_text()))


def _outputs(doc: dict, component: str) -> dict[str, str]:
    arts = doc["components"][component]["outputDefinitions"].get("artifacts", {})
    return {name: a["artifactType"]["schemaTitle"] for name, a in arts.items()}


def _inputs(doc: dict, component: str) -> dict[str, str]:
    arts = doc["components"][component]["inputDefinitions"].get("artifacts", {})
    return {name: a["artifactType"]["schemaTitle"] for name, a in arts.items()}


def test_the_ui_gets_an_html_timeline_a_confusion_matrix_and_a_model():
    doc = _compiled()
    assert _outputs(doc, "comp-elastic-train") == {"model": "system.Model", "metrics": "system.Metrics",
                                                   "summary": "system.Artifact", "timeline": "system.HTML"}
    assert _outputs(doc, "comp-evaluate") == {"metrics": "system.Metrics",
                                              "classification": "system.ClassificationMetrics"}


def test_the_warm_start_is_the_parents_model_artifact_imported_so_lineage_links_the_runs():
    doc = _compiled()
    tasks = doc["root"]["dag"]["tasks"]
    assert _outputs(doc, "comp-warm-start-from") == {"model": "system.Model"}
    # The lookup's URI goes into a DAG of its own, whose importer reads it as an input of that DAG
    # (the KFP backend resolves an importer's runtime URI only from there)...
    assert tasks["link-warm-start"]["inputs"]["parameters"]["uri"] == {
        "taskOutputParameter": {"outputParameterKey": "Output", "producerTask": "warm-start-from"}}
    link = doc["components"]["comp-link-warm-start"]["dag"]
    assert link["tasks"]["importer"]["inputs"]["parameters"]["uri"] == {"componentInputParameter": "uri"}
    importer = doc["deploymentSpec"]["executors"]["exec-importer"]["importer"]
    assert importer["artifactUri"] == {"runtimeParameter": "uri"}
    assert importer["typeSchema"]["schemaTitle"] == "system.Model"
    assert not importer.get("reimport", False)  # reuse the artifact the backend holds under that URI
    assert link["outputs"]["artifacts"]["Output"]["artifactSelectors"] == [
        {"outputArtifactKey": "artifact", "producerSubtask": "importer"}]
    # ... and training takes the imported artifact as its warm start: an artifact, not a string.
    assert _inputs(doc, "comp-elastic-train")["warm_start"] == "system.Model"
    train = tasks["elastic-train"]
    assert train["inputs"]["artifacts"]["warm_start"] == {
        "taskOutputArtifact": {"outputArtifactKey": "Output", "producerTask": "link-warm-start"}}
    assert "warm_start_uri" not in train["inputs"].get("parameters", {})
    optional = doc["components"]["comp-elastic-train"]["inputDefinitions"]["artifacts"]["warm_start"]
    assert optional.get("isOptional") is True  # a component used on its own still trains from scratch


def test_deploy_is_a_pipeline_parameter_off_by_default_and_runs_only_after_a_publish():
    doc = _compiled()
    params = doc["root"]["inputDefinitions"]["parameters"]
    assert params["deploy"]["defaultValue"] is False and params["deploy"]["parameterType"] == "BOOLEAN"
    publish_branch = doc["components"]["comp-condition-1"]["dag"]["tasks"]
    deploy_branch = publish_branch["condition-2"]
    assert deploy_branch["triggerPolicy"]["condition"] == "inputs.parameter_values['pipelinechannel--deploy'] == true"
    assert deploy_branch["dependentTasks"] == ["publish"]  # the model is published first
    (task,) = doc["components"][deploy_branch["componentRef"]["name"]]["dag"]["tasks"].values()
    assert task["componentRef"]["name"] == "comp-deploy"
    assert task["inputs"]["artifacts"]["model"]["componentInputArtifact"].endswith("elastic-train-model")
    assert task["inputs"]["parameters"]["job_name"]["runtimeValue"]["constant"] == "run-{{$.pipeline_job_uuid}}"


def test_the_confusion_matrix_counts_true_against_predicted():
    from edl.trainer.export import confusion_matrix

    labels = np.array([0, 0, 1, 2, 2, 2])
    predicted = np.array([0, 1, 1, 2, 0, 2])
    assert confusion_matrix(labels, predicted, 3) == [[1, 1, 0], [0, 1, 0], [1, 0, 2]]
    assert confusion_matrix(np.array([3]), np.array([0]), 2) == [[0] * 4, [0] * 4, [0] * 4, [1, 0, 0, 0]]


def test_the_timeline_page_embeds_its_plot_and_lists_the_generations(tmp_path):
    from edl.pipeline.timeline import embedded_png, write_timeline

    points = [{"t": 0.0, "world_size": 1, "desired": 2, "free_slots": 2, "loss": 2.3},
              {"t": 5.0, "world_size": 2, "desired": 2, "free_slots": 0, "loss": 0.4}]
    summary = {"status": "succeeded", "epochs_completed": 3, "steps": 90,
               "generations": [{"id": 0, "world_size": 1, "reason": "start", "pause_s": None},
                               {"id": 1, "world_size": 2, "reason": "scale <up>", "pause_s": 0.5}]}
    write_timeline(points, summary, tmp_path / "timeline", "job: trainers")
    page = (tmp_path / "timeline").read_text()
    assert page.startswith("<!DOCTYPE html>") and "scale &lt;up&gt;" in page and "<td>0.50</td>" in page
    assert embedded_png(page)[:8] == b"\x89PNG\r\n\x1a\n"
    write_timeline([], summary, tmp_path / "cluster", "job")  # a cluster run: no per-second trace
    assert embedded_png((tmp_path / "cluster").read_text()) is None
    assert "<td>scale &lt;up&gt;</td>" in (tmp_path / "cluster").read_text()


def test_the_model_metadata_names_framework_formats_onnx_data_job_and_parent(tmp_path):
    from edl.pipeline.step import TrainParams, model_metadata

    p = TrainParams(data_uri="s3://data/digits", job_name="run-1")
    summary = {"job": "run-1", "final_model_uri": "s3://c/run-1/model", "epochs_completed": 4}
    meta = model_metadata(tmp_path, "minio://mlpipeline/v2/artifacts/x/model", p, summary, "minio://parent/model")
    assert meta["framework"] == "paddlepaddle" and "onnx" not in meta  # no ONNX file there: none claimed
    assert (meta["data"], meta["job"], meta["warm_start"], meta["source_uri"]) == \
        ("s3://data/digits", "run-1", "minio://parent/model", "s3://c/run-1/model")
    (tmp_path / "model.onnx").write_bytes(b"onnx")
    meta = model_metadata(tmp_path, "minio://mlpipeline/v2/artifacts/x/model/", p, summary, "")
    assert meta["onnx"] == "minio://mlpipeline/v2/artifacts/x/model/model.onnx" and "ONNX" in meta["format"]


def test_the_lookup_names_the_parents_artifact_its_copy_where_that_is_gone_or_itself(tmp_path):
    import json

    from edl.pipeline.tasks import WARM_START_INFO, lookup_warm_start, publish_model

    registry, model = tmp_path / "registry", tmp_path / "model"
    model.mkdir()
    (model / "params.npz").write_bytes(b"weights")
    meta: dict = {}
    own = str(tmp_path / "none")
    assert lookup_warm_start(str(registry), True, tmp_path / "none", meta, own) == own  # nothing published
    assert meta["published"] is False and json.loads((tmp_path / "none" / WARM_START_INFO).read_text()) == meta
    assert [p.name for p in (tmp_path / "none").iterdir()] == [WARM_START_INFO]  # no model in it
    publish_model(str(model), 0.9, str(registry), str(model))  # published by the run whose artifact is `model`
    meta = {}
    assert lookup_warm_start(str(registry), True, tmp_path / "found", meta, "own") == str(model)  # the parent itself
    assert meta["published"] is True and meta["source"] == meta["warm_start"] == str(model)
    assert meta["accuracy"] == 0.9 and meta["registry_uri"].endswith("registry/current")
    (model / "params.npz").unlink()  # the parent's artifact is gone: the registry's copy instead
    meta = {}
    assert lookup_warm_start(str(registry), True, tmp_path / "copy", meta, "own").endswith("registry/current")
    assert (registry / "current" / "params.npz").read_bytes() == b"weights"
    info = json.loads((registry / "current.json").read_text())
    (registry / "current.json").write_text(json.dumps({**info, "source": "gs://elsewhere/model"}))  # unreadable here
    assert lookup_warm_start(str(registry), True, tmp_path / "gs", {}, "own").endswith("registry/current")
    meta = {}
    assert lookup_warm_start(str(registry), False, tmp_path / "off", meta, "own") == "own" and meta["published"] is False


def test_a_warm_start_artifact_without_a_model_means_from_scratch(tmp_path):
    from edl.pipeline.step import _holds_a_model
    from edl.pipeline.tasks import lookup_warm_start

    class Art:  # what KFP hands a component for an Input[Model]: uri, path, metadata
        def __init__(self, path, metadata):
            self.uri, self.path, self.metadata = str(path), str(path), metadata

    meta: dict = {}
    lookup_warm_start(str(tmp_path / "registry"), True, tmp_path / "none", meta, str(tmp_path / "none"))
    assert not _holds_a_model(Art(tmp_path / "none", meta))
    assert not _holds_a_model(Art(tmp_path / "none", {}))  # metadata lost on the way: its warm_start.json says
    assert _holds_a_model(Art(tmp_path / "elsewhere", {}))  # any other Model (an importer's) is a model
