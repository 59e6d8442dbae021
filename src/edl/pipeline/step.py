"""The elastic-train step: what the KFP component runs, on a cluster or on this machine.

One function for both: as a task of a KFP run (``in_cluster``: KFP's driver sets
``KFP_POD_NAME`` in every task's pod) it runs ``edl launch`` (master, sidecar and
trainers as pods); anywhere else (``kfp.local`` on a laptop, or in a Kubeflow
notebook's pod) it runs the local backend with the autoscale sidecar following a
capacity schedule of other tenants. Either way it copies the
exported model into the step's Model artifact, logs the metrics and writes the
run summary and its timeline (``timeline.py``).

Parameters are validated first, with messages that name the *pipeline
parameter* (``min_trainers``), not a command-line flag.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from pathlib import Path
from collections.abc import Iterator
from typing import Any, Callable

from edl.api.images import DEFAULT_IMAGES
from edl.api.spec import (
    JobSpec,
    K8sOptions,
    Naming,
    Problem,
    job_problems,
    kubernetes_problems,
    local_autoscale_problems,
    pod_problems,
    with_trainer_images,
)
from edl.autoscale.policy import POLICY_NAMES
from edl.console import quiet_third_party_logs
from edl.errors import UserError
from edl.modeldef import framework_of_source
from edl.pipeline.artifacts import artifact_uri  # the components' bodies import it from here (compiled as such)
from edl.pipeline.params import TRAIN_DEFAULTS, TRAIN_PARAMETERS
from edl.pipeline.timeline import write_timeline
from edl.storage.checkpoint import ONNX_FILE

# The parameters that only the local path uses (trainer slots of this machine, other tenants over time).
LOCAL_ONLY = ("capacity_slots", "capacity_schedule")

# How the step names the fields of JobSpec and K8sOptions: by the component's parameters.
PARAMETER_NAMES = Naming(
    {"job": "job_name", "trainers": "initial_trainers", "init_model": "warm_start_uri",
     "autoscale_slots": "capacity_slots", "image": "runtime_image"},
    "pipeline parameter {name}:", hints={"data": "connect a Dataset or set data_uri"})


class _TrainParamsMethods:
    """What the step does with its parameters: the fields are the component's (``TrainParams``)."""

    def job(self) -> str:
        """``job_name``; else, locally, one per process. A cluster needs a name: the step's process id is
        the same in every container, so two runs would adopt (and delete) each other's job."""
        if self.job_name:
            return self.job_name
        if in_cluster():
            raise PARAMETER_NAMES.error(Problem("job", "empty: on a cluster name the job after the run (the same "
                                                "for its retries), e.g. f'run-{dsl.PIPELINE_JOB_ID_PLACEHOLDER}'"))
        return f"train-{os.getpid()}"

    def job_spec(self, checkpoint_uri: str) -> JobSpec:
        return JobSpec(job=self.job(), model_def=self.model_def, data=self.data_uri, epochs=self.epochs,
                       batch_size=self.batch_size, min_trainers=self.min_trainers, max_trainers=self.max_trainers,
                       trainers=self.initial_trainers or self.min_trainers, checkpoint_uri=checkpoint_uri,
                       learning_rate=self.learning_rate, init_model=self.warm_start_uri or None,
                       audit=self.audit)

    def pod_options(self, namespace: str) -> K8sOptions:
        """The pods' options; empty trainer images are edl's for the framework ``model_def`` imports."""
        opts = K8sOptions(namespace=namespace, trainer_cpu=self.trainer_cpu, trainer_memory=self.trainer_memory,
                          trainer_gpu=self.trainer_gpu, image=self.runtime_image or DEFAULT_IMAGES.runtime,
                          trainer_image=self.trainer_image, trainer_gpu_image=self.trainer_gpu_image,
                          trainer_node_selector=self.trainer_node_selector,
                          trainer_tolerations=self.trainer_tolerations, scratch_size=self.scratch_size,
                          priority_class=self.priority_class or None,
                          s3_secret=self.s3_secret or None, sidecar_policy=self.sidecar_policy,
                          sidecar_period_s=self.sidecar_period_s, sidecar_jitter_s=self.sidecar_jitter_s)
        return with_trainer_images(opts, framework_of_source(self.model_def))

    def validate(self) -> None:
        """Every rule of ``edl.api.spec`` that applies where the step runs, in the parameters' names."""
        spec = self.job_spec(self.checkpoint_uri)
        opts = self.pod_options(self.namespace or K8sOptions.namespace)  # else the pod's own: valid
        if in_cluster():
            PARAMETER_NAMES.check(job_problems(spec), kubernetes_problems(spec, opts, POLICY_NAMES),
                                  self.local_only_problems())
        else:
            PARAMETER_NAMES.check(job_problems(spec), pod_problems(opts, POLICY_NAMES),
                                  local_autoscale_problems(self.capacity_slots or self.max_trainers,
                                                           self.capacity_schedule, self.sidecar_period_s,
                                                           self.min_trainers))

    def local_only_problems(self) -> Iterator[Problem]:
        """On a cluster the real scheduler is the capacity: a local capacity setting would be ignored."""
        for name in LOCAL_ONLY:
            if getattr(self, name) != TRAIN_DEFAULTS[name]:
                yield Problem(name, f"{getattr(self, name)!r}: only matters locally (kfp.local), where it "
                                    "simulates other tenants; on a cluster leave it at its default "
                                    f"({TRAIN_DEFAULTS[name]!r})")


# The component's parameters as a dataclass, plus ``namespace``: on a cluster the step's pod's own
# namespace, which callers outside KFP (tests) set.
TrainParams = dataclasses.make_dataclass(
    "TrainParams",
    [*((p.name, p.annotation, dataclasses.field(default=p.default)) for p in TRAIN_PARAMETERS),
     ("namespace", str, dataclasses.field(default=""))],
    bases=(_TrainParamsMethods,))
TrainParams.__module__ = __name__


# "kubernetes" or "local": where the step runs its job, whatever ``in_cluster`` would find.
BACKEND_ENV = "EDL_STEP_BACKEND"


def in_cluster() -> bool:
    """Whether the step runs as a task of a KFP run on the cluster (then its job runs as pods).

    Only a workflow's task pod has ``KFP_POD_NAME`` (KFP's driver sets it in every task's pod, and
    the launcher owns the job's pods by it); ``KUBERNETES_SERVICE_HOST`` alone is any pod, e.g. a
    Kubeflow notebook running ``edl demo`` with ``kfp.local``, which must stay local.
    ``EDL_STEP_BACKEND=kubernetes|local`` decides instead where neither rule fits."""
    forced = os.environ.get(BACKEND_ENV, "").strip().lower()
    if forced:
        if forced not in ("kubernetes", "local"):
            raise UserError(f"{BACKEND_ENV}={forced!r}: use kubernetes or local (or leave it unset)")
        return forced == "kubernetes"
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST") and os.environ.get("KFP_POD_NAME"))


def run_component(model: Any, metrics: Any, summary: Any, timeline: Any, data: Any = None, warm_start: Any = None,
                  **parameters: Any) -> None:
    """The elastic_train component: its artifacts (KFP's ``Output``/``Input`` objects) and parameters.

    ``warm_start``: a Model artifact to start from (the parent run's, imported by the pipeline); the
    registry lookup's own artifact, whose ``warm_start.json`` says ``published: false``, when there is
    none (train from scratch). The output Model's metadata says what it
    is (framework, formats, the ONNX file's URI), what it was trained on and by which job, and its parent."""
    quiet_third_party_logs()  # KFP's executor set up logging at INFO: one line per status poll otherwise
    if data is not None:
        parameters["data_uri"] = artifact_uri(data.uri, data.path)
    parent = ""
    if warm_start is not None and _holds_a_model(warm_start):
        parameters["warm_start_uri"] = artifact_uri(warm_start.uri, warm_start.path)
        parent = warm_start.metadata.get("source") or warm_start.uri
    elif parameters.get("warm_start_uri"):
        parent = parameters["warm_start_uri"]
    params = TrainParams(**parameters)
    result = run_elastic_train(params, Path(model.path), Path(summary.path), Path(timeline.path), metrics.log_metric)
    model.metadata.update(model_metadata(Path(model.path), model.uri, params, result, parent))


def _holds_a_model(warm_start: Any) -> bool:
    """Whether a warm-start Model artifact holds a model: its metadata says (the registry lookup's
    ``published``), else its ``warm_start.json`` (an imported artifact carries no metadata of its
    own); any other Model does."""
    from edl.pipeline.tasks import WARM_START_INFO

    published = (warm_start.metadata or {}).get("published")
    if published is None:
        info = Path(warm_start.path or "") / WARM_START_INFO
        published = json.loads(info.read_text()).get("published", True) if info.is_file() else True
    return bool(published)


def model_metadata(model_dir: Path, uri: str, p: TrainParams, summary: dict, parent: str) -> dict:
    """What the KFP UI shows of a trained model: enough to serve it without reading code."""
    meta = {"framework": "paddlepaddle", "format": "paddle.jit.save (inference.json + inference.pdiparams)",
            "model_def": p.model_def, "data": p.data_uri, "job": summary.get("job") or p.job_name,
            "source_uri": summary.get("final_model_uri") or "", "warm_start": parent,
            "epochs": float(summary.get("epochs_completed", 0))}
    if (model_dir / ONNX_FILE).exists():
        meta["format"] += f", ONNX ({ONNX_FILE})"
        meta["onnx"] = f"{uri.rstrip('/')}/{ONNX_FILE}"
    return meta


def run_elastic_train(p: TrainParams, model_dir: Path, summary_path: Path, timeline_path: Path | None = None,
                      log_metric: Callable[[str, float], None] | None = None,
                      work_dir: Path | None = None) -> dict:
    """Run the job to its end; returns the summary. Raises ``UserError``/``PermanentError`` on failure."""
    p = dataclasses.replace(p, job_name=p.job())
    p.validate()
    work = Path(work_dir or tempfile.mkdtemp(prefix="edl-step-"))
    timeline: list[dict] = []
    if in_cluster():
        summary = _run_on_cluster(p, summary_path)
    else:
        summary = _run_locally(p, work, summary_path, timeline)
    _copy_model(summary.get("final_model_uri"), model_dir)
    if log_metric is not None:
        for name, value in step_metrics(summary).items():
            log_metric(name, value)
    if timeline_path is not None:
        write_timeline(timeline, summary, timeline_path, f"{p.job_name}: trainers, capacity and loss")
    return summary


def _run_locally(p: TrainParams, work: Path, summary_path: Path, timeline: list[dict]) -> dict:
    from edl.autoscale.local_view import CapacitySchedule
    from edl.launcher.local import LocalAutoscale, LocalLauncher

    spec = p.job_spec(p.checkpoint_uri or str(work / "checkpoints" / p.job_name))
    schedule = CapacitySchedule.parse(p.capacity_schedule, PARAMETER_NAMES.name("capacity_schedule"))
    autoscale = LocalAutoscale(p.capacity_slots or p.max_trainers, schedule, p.sidecar_period_s, p.sidecar_policy)
    os.environ.setdefault("EDL_HOME", str(work / "edl-home"))
    LocalLauncher(spec, summary_path, autoscale=autoscale, on_status=timeline.append).run()
    return json.loads(summary_path.read_text())


def _run_on_cluster(p: TrainParams, summary_path: Path) -> dict:
    from edl.launcher.kube import launch

    namespace = p.namespace or Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace").read_text().strip()
    code = launch(p.job_spec(p.checkpoint_uri), p.pod_options(namespace), summary_out=summary_path,
                  naming=PARAMETER_NAMES)
    if code != 0:
        raise UserError(f"the job was cancelled (exit {code})")
    _s3_env_from_secret(namespace, p.s3_secret)  # this step copies the model out of MinIO itself
    return json.loads(summary_path.read_text())


def _s3_env_from_secret(namespace: str, name: str) -> None:
    """Put the Secret's S3 settings into this process's environment (never into argv or files)."""
    import base64

    from edl.cluster.kube_api import KubeApi, load_api_client

    secret = KubeApi(load_api_client(), namespace).get("secrets", name)
    if secret is None:
        raise UserError(f"pipeline parameter s3_secret: no Secret {name!r} in namespace {namespace!r}")
    for key, value in (secret.get("data") or {}).items():
        if key.startswith("AWS_"):
            os.environ[key] = base64.b64decode(value).decode()


def _copy_model(uri: str | None, model_dir: Path) -> None:
    """Copy the exported inference model into the step's Model artifact (KFP stores and tracks it)."""
    if not uri:
        raise UserError("the job finished without an exported model (no training data reached the trainers?)")
    from edl.pipeline.tasks import download_model

    download_model(uri, model_dir, "final model")


def step_metrics(summary: dict) -> dict[str, float]:
    """The numbers KFP shows for the step (Output[Metrics])."""
    gens = summary.get("generations") or []
    out = {"epochs": float(summary.get("epochs_completed", 0)),
           "steps": float(summary.get("steps", 0)),
           "throughput_samples_per_s": float(summary.get("throughput_samples_per_s", 0.0)),
           "scale_events": float(max(0, len(gens) - 1)),
           "max_trainers_seen": float(max((g["world_size"] for g in gens), default=0)),
           "trainer_failures": float(summary.get("trainer_failures", 0))}
    for key in ("lost_samples", "duplicate_samples"):
        if summary.get(key) is not None:
            out[key] = float(summary[key])
    for name, value in (summary.get("metrics") or {}).items():
        out[name] = float(value)
    return out
