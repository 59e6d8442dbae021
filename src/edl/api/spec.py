"""The training job's spec, the options of its pods, and the one validator of both.

The spec travels from ``edl train``/``edl launch``/the KFP step to the master (as JSON in its
argv) and on to every trainer (in the master's ``/v1/spec``).

Validation reports *which field* is wrong (a ``Problem``); the caller's ``Naming`` (field ->
flag or pipeline parameter) turns the first problem into the one-line ``UserError``, so the same
rules speak of ``--min-trainers`` on the command line and of ``min_trainers`` in the KFP step.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from edl.api.images import DEFAULT_IMAGES, Images
from edl.errors import UserError


@dataclass
class JobSpec:
    """Everything that defines a training job; the same on every (re)start."""

    job: str
    model_def: str
    data: str
    epochs: int
    batch_size: int
    min_trainers: int
    max_trainers: int
    trainers: int
    checkpoint_uri: str
    eval_data: str | None = None
    learning_rate: float = 0.01
    rows_per_task: int = 0  # 0: derived from the batch size
    checkpoint_interval_s: float = 30.0
    keep_checkpoints: int = 3
    max_task_failures: int = 3
    seed: int = 0
    audit: bool = False
    init_model: str | None = None  # warm start: a model directory with params.npz (a previous run's model)
    # The dead-man switch: master and trainers end the job when the launcher is silent this long.
    launcher_timeout_s: float = 30.0

    @property
    def task_rows(self) -> int:
        return self.rows_per_task or self.batch_size * 4

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class K8sOptions:
    """Where and how the job's pods run; set by the flags of ``edl launch``/``edl k8s render`` and by the KFP step."""

    namespace: str = "default"
    image: str = DEFAULT_IMAGES.runtime
    # The trainers' image on CPUs, and when trainer_gpu > 0. Empty: edl's image for the model
    # definition's framework (``with_trainer_images``).
    trainer_image: str = ""
    trainer_gpu_image: str = ""
    trainer_cpu: str = "2"
    trainer_memory: str = "4Gi"
    trainer_gpu: int = 0
    priority_class: str | None = None
    s3_secret: str | None = None
    sidecar_policy: str = "edl"
    sidecar_period_s: float = 10.0
    sidecar_jitter_s: float = 2.0
    pending_timeout_s: float = 120.0
    scratch_size: str = "1Gi"  # sizeLimit of each pod's /tmp emptyDir (data is read from S3, not copied there)
    # Where trainers may run (a GPU pool, say): "KEY=VALUE,..." and "KEY[=VALUE]:EFFECT,...", the same
    # text as flags and as pipeline parameters; read by ``node_selector``/``tolerations``.
    trainer_node_selector: str = ""
    trainer_tolerations: str = ""
    node_lost_timeout_s: float = 60.0  # a node not Ready this long (first seen so by the launcher): its pods are lost
    extra_labels: dict[str, str] = field(default_factory=dict)


# ------------------------------------------------------------ validation
NameOf = Callable[[str], str]


@dataclass(frozen=True)
class Problem:
    """What is wrong with one field. ``detail`` follows the field's name in the message; where it
    mentions other fields it is a function of the caller's naming."""

    field: str
    detail: str | Callable[[NameOf], str]


@dataclass(frozen=True)
class Naming:
    """How one source of job input names the fields: ``{"min_trainers": "--min-trainers"}`` and
    ``"{name}"`` for flags, parameter names and ``"pipeline parameter {name}:"`` for the KFP step.
    ``hints`` add what the name alone does not say (one pipeline parameter fed by two inputs)."""

    names: Mapping[str, str]
    opening: str = "{name}"
    hints: Mapping[str, str] = field(default_factory=dict)

    def name(self, field_name: str) -> str:
        return self.names.get(field_name, field_name)

    def error(self, problem: Problem) -> UserError:
        detail = problem.detail if isinstance(problem.detail, str) else problem.detail(self.name)
        hint = self.hints.get(problem.field)
        return UserError(f"{self.opening.format(name=self.name(problem.field))} {detail}"
                         + (f" ({hint})" if hint else ""))

    def check(self, *problems: Iterable[Problem]) -> None:
        """Raise the ``UserError`` of the first problem, if there is one."""
        for group in problems:
            for problem in group:
                raise self.error(problem)

    def with_names(self, **names: str) -> Naming:
        """The same naming with these fields named (or renamed): a command's own flags."""
        return Naming({**self.names, **names}, self.opening, self.hints)


_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(m|k|Ki|Mi|Gi|Ti|M|G|T)?$")
# Kubernetes label keys (an optional DNS-subdomain prefix and a name) and values.
_LABEL_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_LABEL_KEY = re.compile(rf"^([a-z0-9]([-a-z0-9.]{{0,251}}[a-z0-9])?/)?{_LABEL_NAME}$")
_LABEL_VALUE = re.compile(rf"^({_LABEL_NAME})?$")
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")


def _items(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


def node_selector(text: str) -> dict[str, str]:
    """``"KEY=VALUE,..."`` as a pod's nodeSelector; ``ValueError`` naming the bad item."""
    selector: dict[str, str] = {}
    for item in _items(text):
        key, eq, value = item.partition("=")
        if not eq or not _LABEL_KEY.match(key) or not _LABEL_VALUE.match(value):
            raise ValueError(f"{item!r}: expected KEY=VALUE with a label key and value, e.g. pool=gpu")
        selector[key] = value
    return selector


def tolerations(text: str) -> list[dict[str, str]]:
    """``"KEY[=VALUE]:EFFECT,..."`` as a pod's tolerations (no VALUE: any value, ``Exists``)."""
    result: list[dict[str, str]] = []
    for item in _items(text):
        taint, colon, effect = item.rpartition(":")
        key, eq, value = taint.partition("=")
        if not colon or effect not in TAINT_EFFECTS or not _LABEL_KEY.match(key) or not _LABEL_VALUE.match(value):
            raise ValueError(f"{item!r}: expected KEY[=VALUE]:EFFECT with EFFECT one of {', '.join(TAINT_EFFECTS)}, "
                             "e.g. nvidia.com/gpu:NoSchedule")
        toleration = {"key": key, "operator": "Equal" if eq else "Exists", "effect": effect}
        if eq:
            toleration["value"] = value
        result.append(toleration)
    return result


def selector_pairs(text: str) -> tuple[tuple[str, str], ...]:
    """``node_selector`` as a job's demand holds it (``JobDemand.node_selector``): sorted (key, value)."""
    return tuple(sorted(node_selector(text).items()))


def toleration_triples(text: str) -> tuple[tuple[str, str, str], ...]:
    """``tolerations`` as a job's demand holds them (``JobDemand.tolerations``): (key, value, effect), an
    empty value for any value."""
    return tuple((t["key"], t.get("value", ""), t["effect"]) for t in tolerations(text))


MAX_SEED = 2 ** 32 - 1  # numpy's and Paddle's seeds are unsigned 32-bit


def _positive_seconds(name: str, value: float) -> Iterator[Problem]:
    """A finite, positive duration (``nan`` and ``inf`` pass a plain ``<= 0`` test)."""
    if not (math.isfinite(value) and value > 0):
        yield Problem(name, f"must be a positive number of seconds (got {value:g})")


MIN_LAUNCHER_TIMEOUT_S = 10.0  # several of the launcher's beats (one per poll: 2 s on Kubernetes)
MAX_JOB_NAME = 40  # room for "edl-" + "-trainer-" + a 5-character suffix within 63


def job_problems(spec: JobSpec) -> Iterator[Problem]:
    """The spec's own rules, wherever the job runs."""
    if not spec.job or not all(c.isalnum() or c in "-_." for c in spec.job):
        yield Problem("job", f"{spec.job!r}: use letters, digits, '-', '_' and '.'")
    if not spec.data:
        yield Problem("data", "must name a data set")
    if spec.epochs < 1:
        yield Problem("epochs", f"must be at least 1 (got {spec.epochs})")
    if spec.batch_size < 1:
        yield Problem("batch_size", f"must be at least 1 (got {spec.batch_size})")
    yield from trainer_range_problems(spec.min_trainers, spec.max_trainers, spec.trainers)
    if not (math.isfinite(spec.learning_rate) and spec.learning_rate > 0):
        yield Problem("learning_rate", f"must be a positive number (got {spec.learning_rate:g})")
    yield from _positive_seconds("checkpoint_interval_s", spec.checkpoint_interval_s)
    if spec.keep_checkpoints < 1:
        yield Problem("keep_checkpoints", f"must be at least 1 (got {spec.keep_checkpoints})")
    if spec.rows_per_task < 0:
        yield Problem("rows_per_task", lambda n: f"must be at least 1, or 0 for 4 x {n('batch_size')} "
                                                 f"(got {spec.rows_per_task})")
    if spec.max_task_failures < 1:
        # A trainer that dies fails the task it holds once: 0 would end the job at the first crash.
        yield Problem("max_task_failures", f"must be at least 1 (got {spec.max_task_failures}): a trainer that dies "
                                           "counts one failure of the task it held")
    if not 0 <= spec.seed <= MAX_SEED:
        yield Problem("seed", f"must be in 0..{MAX_SEED} (got {spec.seed})")
    if not math.isfinite(spec.launcher_timeout_s):
        yield Problem("launcher_timeout_s", f"must be a number of seconds (got {spec.launcher_timeout_s:g})")
    elif spec.launcher_timeout_s < MIN_LAUNCHER_TIMEOUT_S:
        yield Problem("launcher_timeout_s", f"must be at least {MIN_LAUNCHER_TIMEOUT_S:.0f} seconds (got "
                                            f"{spec.launcher_timeout_s:g}): the launcher beats every few seconds")


def trainer_range_problems(min_trainers: int, max_trainers: int, trainers: int | None = None) -> Iterator[Problem]:
    """``1 <= min_trainers <= trainers <= max_trainers`` (``trainers``: the initial count, where one is given)."""
    if min_trainers < 1:
        yield Problem("min_trainers", f"must be at least 1 (got {min_trainers})")
    if min_trainers > max_trainers:
        yield Problem("min_trainers", lambda n: f"{min_trainers} is greater than {n('max_trainers')} {max_trainers}")
    if trainers is not None and not min_trainers <= trainers <= max_trainers:
        yield Problem("trainers", lambda n: f"{trainers} is outside {n('min_trainers')}..{n('max_trainers')} "
                                            f"({min_trainers}..{max_trainers})")


def sidecar_problems(policy: str, period_s: float, jitter_s: float, policies: Collection[str]) -> Iterator[Problem]:
    """The autoscale sidecar's settings; ``policies``: the names the policy registry knows."""
    if policy not in policies:
        yield Problem("sidecar_policy", f"{policy!r}: choose {' or '.join(policies)}")
    yield from _positive_seconds("sidecar_period_s", period_s)
    if not 0 <= jitter_s < period_s:
        yield Problem("sidecar_jitter_s", lambda n: f"must be in [0, {n('sidecar_period_s')}) (got {jitter_s})")


def trainer_resource_problems(cpu: str, memory: str, gpu: int) -> Iterator[Problem]:
    """One trainer pod's requests: positive Kubernetes quantities and a GPU count."""
    for name, value in (("trainer_cpu", cpu), ("trainer_memory", memory)):
        if not _QUANTITY.match(value) or float(re.sub(r"[A-Za-z]+$", "", value)) <= 0:
            yield Problem(name, f"{value!r}: must be a positive Kubernetes quantity (e.g. 2, 500m, 4Gi)")
    if gpu < 0:
        yield Problem("trainer_gpu", f"must be 0 or more (got {gpu})")


def pod_problems(opts: K8sOptions, policies: Collection[str]) -> Iterator[Problem]:
    """The pod options' own rules."""
    if not _DNS_LABEL.match(opts.namespace) or len(opts.namespace) > 63:
        yield Problem("namespace", f"{opts.namespace!r}: must be a DNS label (lowercase letters, digits, '-')")
    for name in ("image", "trainer_image", "trainer_gpu_image"):
        image = getattr(opts, name)  # an empty trainer image: see kubernetes_problems
        if any(c.isspace() for c in image) or (not image and name == "image"):
            yield Problem(name, f"{image!r}: must be an image reference without spaces")
    yield from trainer_resource_problems(opts.trainer_cpu, opts.trainer_memory, opts.trainer_gpu)
    if opts.priority_class is not None and not _DNS_LABEL.match(opts.priority_class):
        yield Problem("priority_class", f"{opts.priority_class!r}: must be a PriorityClass name")
    if opts.s3_secret is not None and not _DNS_LABEL.match(opts.s3_secret):
        yield Problem("s3_secret", f"{opts.s3_secret!r}: must be a Secret name")
    yield from sidecar_problems(opts.sidecar_policy, opts.sidecar_period_s, opts.sidecar_jitter_s, policies)
    yield from _positive_seconds("pending_timeout_s", opts.pending_timeout_s)
    if not _QUANTITY.match(opts.scratch_size) or float(re.sub(r"[A-Za-z]+$", "", opts.scratch_size)) <= 0:
        yield Problem("scratch_size", f"{opts.scratch_size!r}: must be a positive Kubernetes quantity (e.g. 1Gi, 500Mi)")
    yield from _positive_seconds("node_lost_timeout_s", opts.node_lost_timeout_s)
    for name, parse in (("trainer_node_selector", node_selector), ("trainer_tolerations", tolerations)):
        try:
            parse(getattr(opts, name))
        except ValueError as e:
            yield Problem(name, str(e))


def with_trainer_images(opts: K8sOptions, framework: str | None, images: Images = DEFAULT_IMAGES) -> K8sOptions:
    """``opts`` with edl's trainer images for a model of ``framework`` where it names none
    (``framework`` ``None``: not known, the empty ones stay empty and ``kubernetes_problems`` says so)."""
    if framework is None:
        return opts
    return replace(opts, trainer_image=opts.trainer_image or images.trainer(framework, 0),
                   trainer_gpu_image=opts.trainer_gpu_image or images.trainer(framework, 1))


def kubernetes_problems(spec: JobSpec, opts: K8sOptions, policies: Collection[str]) -> Iterator[Problem]:
    """The pod options, and what a job needs beyond ``job_problems`` to run as pods."""
    yield from pod_problems(opts, policies)
    used = "trainer_gpu_image" if opts.trainer_gpu else "trainer_image"
    if not getattr(opts, used):
        yield Problem(used, "empty, and edl cannot tell the model definition's framework (its source, read here, "
                            "imports neither or both of paddle and torch, or is not on this machine): name the "
                            "trainers' image")
    if len(spec.job) > MAX_JOB_NAME or not _DNS_LABEL.match(spec.job):
        yield Problem("job", f"{spec.job!r}: on Kubernetes use at most {MAX_JOB_NAME} lowercase letters, "
                             "digits and '-', starting and ending with a letter or digit")
    for name, uri in (("checkpoint_uri", spec.checkpoint_uri), ("data", spec.data), ("eval_data", spec.eval_data)):
        if uri is not None and not uri.startswith("s3://"):
            yield Problem(name, f"{uri!r}: pods share no disk, use an s3:// URI (MinIO or any S3 store)")
    if spec.checkpoint_uri.startswith("s3://") and opts.s3_secret is None:
        yield Problem("s3_secret", "is required for s3:// URIs: name the Secret that holds the S3 credentials")


def local_autoscale_problems(slots: int | None, schedule: str, period_s: float,
                             min_trainers: int) -> Iterator[Problem]:
    """The sidecar run on this machine (``edl train --autoscale-slots``, the KFP step off a cluster):
    ``slots`` trainer slots (``None``: no sidecar), other tenants on ``schedule``."""
    if slots is None:
        if schedule:
            yield Problem("capacity_schedule", lambda n: f"needs {n('autoscale_slots')}")
        return
    if slots < min_trainers:
        yield Problem("autoscale_slots", lambda n: f"{slots} is below {n('min_trainers')} {min_trainers}")
    yield from _positive_seconds("sidecar_period_s", period_s)


def launcher_problems(max_trainer_failures: int) -> Iterator[Problem]:
    """The launcher's own settings (``edl train``, ``edl launch``)."""
    if max_trainer_failures < 0:
        yield Problem("max_trainer_failures", f"must be 0 or more (got {max_trainer_failures}); 0 fails the job at "
                                              "the first trainer crash")
