"""The elastic-train step: what the KFP component runs, on a cluster or on this machine.

One function for both: inside a Kubernetes pod (``KUBERNETES_SERVICE_HOST`` set)
it runs ``edl launch`` (master, sidecar and trainers as pods); anywhere else
(``kfp.local``, a laptop) it runs the local backend with the autoscale sidecar
following a capacity schedule of other tenants. Either way it copies the
exported model into the step's Model artifact, logs the metrics and writes the
run summary and a timeline plot.

Parameters are validated first, with messages that name the *pipeline
parameter* (``min_trainers``), not a command-line flag.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from edl.errors import UserError

PRIORITY_CLASS = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")


@dataclass
class TrainParams:
    data_uri: str
    model_def: str = "edl.zoo.digits"
    epochs: int = 10
    batch_size: int = 32
    learning_rate: float = 0.01
    min_trainers: int = 1
    max_trainers: int = 4
    initial_trainers: int = 0  # 0: start at min_trainers
    trainer_cpu: str = "2"
    trainer_memory: str = "4Gi"
    trainer_gpu: int = 0
    priority_class: str = ""
    checkpoint_uri: str = ""  # "" : a directory of the step (local) — required on a cluster
    s3_secret: str = ""
    job_name: str = ""
    namespace: str = ""
    image: str = "edl-runtime:0.1.0"
    trainer_image: str = "edl-trainer-cpu:0.1.0"
    sidecar_policy: str = "edl"
    sidecar_period_s: float = 10.0
    sidecar_jitter_s: float = 2.0
    capacity_slots: int = 0  # local only: trainer slots on this machine (0: max_trainers)
    capacity_schedule: str = ""  # local only: other tenants, TIME:SLOTS pairs
    warm_start_uri: str = ""
    audit: bool = False  # local only: log every record id and report lost/duplicated samples
    seed: int = 0
    extra: dict = field(default_factory=dict)

    def validate(self) -> None:
        def need(ok: bool, name: str, why: str) -> None:
            if not ok:
                raise UserError(f"pipeline parameter {name}: {why}")

        need(bool(self.data_uri), "data", "no data set given (connect a Dataset or set data_uri)")
        need(self.epochs >= 1, "epochs", f"must be at least 1 (got {self.epochs})")
        need(self.batch_size >= 1, "batch_size", f"must be at least 1 (got {self.batch_size})")
        need(self.learning_rate > 0, "learning_rate", f"must be positive (got {self.learning_rate})")
        need(self.min_trainers >= 1, "min_trainers", f"must be at least 1 (got {self.min_trainers})")
        need(self.min_trainers <= self.max_trainers, "min_trainers",
             f"{self.min_trainers} is greater than max_trainers {self.max_trainers}")
        need(self.initial_trainers == 0 or self.min_trainers <= self.initial_trainers <= self.max_trainers,
             "initial_trainers", f"{self.initial_trainers} is outside min_trainers..max_trainers "
                                 f"({self.min_trainers}..{self.max_trainers})")
        need(self.trainer_gpu >= 0, "trainer_gpu", f"must be 0 or more (got {self.trainer_gpu})")
        need(not self.priority_class or bool(PRIORITY_CLASS.match(self.priority_class)), "priority_class",
             f"{self.priority_class!r} is not a PriorityClass name")
        need(self.sidecar_policy in ("edl", "edl2017"), "sidecar_policy",
             f"{self.sidecar_policy!r}: choose edl or edl2017")
        need(self.sidecar_period_s > 0, "sidecar_period_s", f"must be positive (got {self.sidecar_period_s})")
        need(0 <= self.sidecar_jitter_s < self.sidecar_period_s, "sidecar_jitter_s",
             "must be in [0, sidecar_period_s)")
        need(self.capacity_slots >= 0, "capacity_slots", f"must be 0 or more (got {self.capacity_slots})")


def artifact_uri(uri: str, path: str) -> str:
    """Where a KFP artifact's files are for edl: its object-store URI on a cluster (KFP's
    ``minio://bucket/key`` is S3), else its local path (``kfp.local``)."""
    if uri.startswith("minio://"):
        return "s3://" + uri.removeprefix("minio://")
    if uri.startswith("s3://"):
        return uri
    if "://" in uri and not uri.startswith("file://"):
        raise UserError(f"artifact {uri!r}: only MinIO/S3 (s3://, minio://) and local artifacts are supported")
    return path


def in_cluster() -> bool:
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST"))


def _job_spec(p: TrainParams, checkpoint_uri: str):
    from edl.api.spec import JobSpec

    spec = JobSpec(job=p.job_name, model_def=p.model_def, data=p.data_uri, epochs=p.epochs,
                   batch_size=p.batch_size, min_trainers=p.min_trainers, max_trainers=p.max_trainers,
                   trainers=p.initial_trainers or p.min_trainers, checkpoint_uri=checkpoint_uri,
                   learning_rate=p.learning_rate, seed=p.seed, init_model=p.warm_start_uri or None,
                   audit=p.audit and not in_cluster())
    spec.validate()
    return spec


def run_elastic_train(p: TrainParams, model_dir: Path, summary_path: Path, timeline_path: Path | None = None,
                      log_metric: Callable[[str, float], None] | None = None,
                      work_dir: Path | None = None) -> dict:
    """Run the job to its end; returns the summary. Raises ``UserError``/``PermanentError`` on failure."""
    p.validate()
    if not p.job_name:
        p.job_name = f"train-{os.getpid()}"
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
    if timeline_path is not None and timeline:
        plot_timeline(timeline, timeline_path, f"{p.job_name}: trainers, capacity and loss")
    return summary


def _run_locally(p: TrainParams, work: Path, summary_path: Path, timeline: list[dict]) -> dict:
    from edl.autoscale.local_view import CapacitySchedule
    from edl.launcher.local import LocalAutoscale, LocalLauncher

    checkpoint_uri = p.checkpoint_uri or str(work / "checkpoints" / p.job_name)
    spec = _job_spec(p, checkpoint_uri)
    slots = p.capacity_slots or p.max_trainers
    autoscale = LocalAutoscale(slots, CapacitySchedule.parse(p.capacity_schedule, "capacity_schedule"),
                               p.sidecar_period_s, p.sidecar_policy)
    os.environ.setdefault("EDL_HOME", str(work / "edl-home"))
    LocalLauncher(spec, summary_path, autoscale=autoscale, on_status=timeline.append).run()
    return json.loads(summary_path.read_text())


def _run_on_cluster(p: TrainParams, summary_path: Path) -> dict:
    from edl.cluster.manifests import K8sOptions
    from edl.launcher.kube import launch

    if not p.checkpoint_uri.startswith("s3://"):
        raise UserError("pipeline parameter checkpoint_uri: on a cluster it must be an s3:// URI (MinIO)")
    if not p.s3_secret:
        raise UserError("pipeline parameter s3_secret: name the Secret that holds the MinIO credentials")
    namespace = p.namespace or Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace").read_text().strip()
    opts = K8sOptions(namespace=namespace, image=p.image, trainer_image=p.trainer_image, trainer_cpu=p.trainer_cpu,
                      trainer_memory=p.trainer_memory, trainer_gpu=p.trainer_gpu,
                      priority_class=p.priority_class or None, s3_secret=p.s3_secret,
                      sidecar_policy=p.sidecar_policy, sidecar_period_s=p.sidecar_period_s,
                      sidecar_jitter_s=p.sidecar_jitter_s)
    spec = _job_spec(p, p.checkpoint_uri)
    code = launch(spec, opts, summary_out=summary_path)
    if code != 0:
        raise UserError(f"the job was cancelled (exit {code})")
    _s3_env_from_secret(namespace, p.s3_secret)  # this step copies the model out of MinIO itself
    return json.loads(summary_path.read_text())


def _s3_env_from_secret(namespace: str, name: str) -> None:
    """Put the Secret's S3 settings into this process's environment (never into argv or files)."""
    import base64

    from edl.cluster.kubernetes import KubeApi, load_api_client

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


def plot_timeline(points: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [x["t"] for x in points]
    fig, (a, b) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    a.step(t, [x["world_size"] for x in points], where="post", label="trainers training")
    a.step(t, [x["desired"] for x in points], where="post", linestyle="--", label="desired (sidecar)")
    if any(x.get("free_slots") is not None for x in points):
        a.step(t, [x.get("free_slots") for x in points], where="post", color="grey", alpha=0.6,
               label="capacity left by other tenants")
    a.set_ylabel("trainers")
    a.legend(loc="upper right")
    losses = [(x["t"], x["loss"]) for x in points if x.get("loss") is not None]
    if losses:
        b.plot([u for u, _ in losses], [v for _, v in losses], color="tab:red")
    b.set_ylabel("training loss")
    b.set_xlabel("seconds since start")
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90, format="png")  # exactly this path: a KFP artifact has no suffix
    plt.close(fig)
