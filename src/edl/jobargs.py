"""The flags of a job: its spec (``edl train``, ``edl master``, ``edl launch``, ``edl k8s render``)
and its pods (``edl launch``, ``edl k8s render``).

One table maps each flag to a ``JobSpec`` or ``K8sOptions`` field, so parsing a command line,
building a spec, turning a spec back into flags (to spawn ``edl master``) and naming the
culprit of a validation error (``FLAG_NAMES``) cannot drift apart.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, fields
from collections.abc import Sequence
from typing import Any

from edl.api.framework import FRAMEWORK_NAMES, FRAMEWORKS
from edl.api.images import DEFAULT_IMAGES
from edl.api.spec import JobSpec, K8sOptions, Naming, job_problems


@dataclass(frozen=True)
class Flag:
    flag: str
    field: str
    type: Any
    help: str
    default: Any = None
    required: bool = False


FLAGS: tuple[Flag, ...] = (
    Flag("--job-name", "job", str, "name of the job; also names its state directory and objects", required=True),
    Flag("--model-def", "model_def", str,
         "module path (edl.zoo.digits), .py file, or s3://BUCKET/path/model.py (read by each trainer: a model "
         "that the trainer image does not hold) defining model/loss/optimizer/collate", required=True),
    Flag("--data", "data", str,
         "training data: a directory or s3:// prefix of Parquet files with an integer 'id' column "
         "(or a prepared set with train/ and test/ below it)", required=True),
    Flag("--eval-data", "eval_data", str, "held-out data for the final metrics (default: DATA/test when DATA has one)"),
    Flag("--epochs", "epochs", int, "passes over the training data", required=True),
    Flag("--batch-size", "batch_size", int, "records per trainer per step", required=True),
    Flag("--learning-rate", "learning_rate", float,
         "passed to the model's optimizer(), a positive number (default 0.01)", 0.01),
    Flag("--min-trainers", "min_trainers", int, "never scale below this (default 1)", 1),
    Flag("--max-trainers", "max_trainers", int, "never scale above this (default 4)", 4),
    Flag("--trainers", "trainers", int, "initial desired trainer count (default: --min-trainers)"),
    Flag("--checkpoint-uri", "checkpoint_uri", str,
         "file:///dir, a path, or s3://bucket/prefix (S3 endpoint and keys from AWS_ENDPOINT_URL, "
         "AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY)", required=True),
    Flag("--checkpoint-interval", "checkpoint_interval_s", float,
         "seconds between checkpoints, positive (default 30)", 30.0),
    Flag("--keep-checkpoints", "keep_checkpoints", int, "committed checkpoints to keep (default 3)", 3),
    Flag("--rows-per-task", "rows_per_task", int, "rows per data task; 0: 4 x --batch-size (default 0)", 0),
    Flag("--max-task-failures", "max_task_failures", int,
         "fail the job when one data task fails more often than this with none of its rows done between, at "
         "least 1; a trainer that dies counts one failure of the task it was in (default 3)", 3),
    Flag("--seed", "seed", int, "seed for model initialisation and task order, 0..2**32-1 (default 0)", 0),
    Flag("--init-model", "init_model", str,
         "warm start from this model (a previous run's CHECKPOINT_URI/model, with params.npz); default: seeded init"),
    Flag("--launcher-timeout", "launcher_timeout_s", float,
         "dead-man switch: when the launcher (edl train, edl launch) has not been heard from for this many seconds, "
         "the master and trainers end the job themselves, so a killed launcher leaves nothing running "
         "(default 30, at least 10)", 30.0),
)
AUDIT_HELP = "log every record id that enters the model and report lost/duplicate samples"

# Defaults from K8sOptions; "{policies}": the names of the policy registry (edl.autoscale.policy).
K8S_FLAGS: tuple[Flag, ...] = (
    Flag("--namespace", "namespace", str, "namespace of the job's objects (default default)"),
    Flag("--image", "image", str, "image of launcher, master and sidecar (default {runtime_image})"),
    Flag("--trainer-image", "trainer_image", str,
         "image of the trainers on CPUs (default: edl's for the framework --model-def imports, "
         "{trainer_image})"),
    Flag("--trainer-gpu-image", "trainer_gpu_image", str,
         "image of the trainers when --trainer-gpu is above 0 (default: edl's for the framework, "
         "{trainer_gpu_image})"),
    Flag("--trainer-cpu", "trainer_cpu", str, "CPU request and limit per trainer, a Kubernetes quantity (default 2)"),
    Flag("--trainer-memory", "trainer_memory", str, "memory request and limit per trainer (default 4Gi)"),
    Flag("--trainer-gpu", "trainer_gpu", int, "GPUs per trainer, nvidia.com/gpu; 0: CPU trainers (default 0)"),
    Flag("--priority-class", "priority_class", str, "PriorityClass of the trainer pods (default: none)"),
    Flag("--s3-secret", "s3_secret", str,
         "Secret with AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and AWS_ENDPOINT_URL for s3:// URIs"),
    Flag("--sidecar-policy", "sidecar_policy", str, "scaling policy the sidecar runs: {policies} (default edl)"),
    Flag("--sidecar-period", "sidecar_period_s", float, "seconds between the sidecar's decisions (default 10)"),
    Flag("--sidecar-jitter", "sidecar_jitter_s", float,
         "each job's sidecar acts at a fixed offset in [0, this) seconds into the period, derived from the "
         "job's name, so that sidecars do not act at once; below --sidecar-period; 0: no offset (default 2)"),
    Flag("--pending-timeout", "pending_timeout_s", float,
         "seconds a trainer pod may stay Pending before it is reported unschedulable and removed (default 120)"),
    Flag("--scratch-size", "scratch_size", str,
         "size limit of the /tmp emptyDir of the master and trainer pods, a Kubernetes quantity; the kubelet "
         "evicts a pod that writes more. Data is read from S3 as needed, not copied there (default 1Gi)"),
    Flag("--trainer-node-selector", "trainer_node_selector", str,
         "nodes the trainers may run on, as labels KEY=VALUE[,KEY=VALUE...] (a pod nodeSelector, e.g. "
         "pool=gpu; default: any node)"),
    Flag("--trainer-tolerations", "trainer_tolerations", str,
         "taints the trainers tolerate, KEY[=VALUE]:EFFECT[,...] (no VALUE: any value; e.g. "
         "nvidia.com/gpu:NoSchedule; default: none)"),
    Flag("--node-lost-timeout", "node_lost_timeout_s", float,
         "seconds a node may stay NotReady/Unknown before its pods count as lost: its trainers are replaced, "
         "a master there is recreated, both deleted by force (default 60)"),
)

FLAG_NAMES = Naming({**{f.field: f.flag for f in (*FLAGS, *K8S_FLAGS)}, "audit": "--audit",
                     "max_trainer_failures": "--max-trainer-failures"})  # edl train's and edl launch's own


def add_job_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("job")
    for f in FLAGS:
        g.add_argument(f.flag, dest=f.field, type=f.type, default=f.default, required=f.required, help=f.help,
                       metavar=f.flag.lstrip("-").split("-")[-1].upper())
    g.add_argument("--audit", dest="audit", action="store_true", help=AUDIT_HELP)


def add_k8s_arguments(p: argparse.ArgumentParser, policies: Sequence[str]) -> None:
    g = p.add_argument_group("kubernetes")
    defaults = K8sOptions()
    for f in K8S_FLAGS:
        g.add_argument(f.flag, dest=f.field, type=f.type, default=getattr(defaults, f.field),
                       help=f.help.format(policies=" or ".join(policies), runtime_image=defaults.image,
                                          trainer_image=_by_framework(0), trainer_gpu_image=_by_framework(1)))


def _by_framework(gpus: int) -> str:
    return " or ".join(f"{DEFAULT_IMAGES.trainer(name, gpus)} ({FRAMEWORK_NAMES[name]})" for name in FRAMEWORKS)


def spec_from_args(a: argparse.Namespace) -> JobSpec:
    """The spec the flags give, checked by its own rules (``job_problems``)."""
    values = {f.name: getattr(a, f.name) for f in fields(JobSpec) if hasattr(a, f.name)}
    if values.get("trainers") is None:
        values["trainers"] = values["min_trainers"]
    spec = JobSpec(**values)
    FLAG_NAMES.check(job_problems(spec))
    return spec


def options_from_args(a: argparse.Namespace) -> K8sOptions:
    """The pod options the flags give; the caller checks them (``kubernetes_problems``, with the policy names)."""
    names = {f.name for f in fields(K8sOptions)}
    return K8sOptions(**{k: v for k, v in vars(a).items() if k in names})


def spec_to_argv(spec: JobSpec) -> list[str]:
    """The same spec as command-line flags (for spawning ``edl master``)."""
    argv: list[str] = []
    for f in FLAGS:
        value = getattr(spec, f.field)
        if value is not None:
            argv += [f.flag, repr(value) if isinstance(value, float) else str(value)]
    if spec.audit:
        argv.append("--audit")
    return argv
