"""The retraining pipeline for Kubeflow Pipelines: prepare data → elastic train → evaluate → publish if
better.

- ``retrain``: the KFP pipeline (Python DSL), compiled to ``pipelines/retrain.pipeline.yaml``
  (``edl pipeline compile``), run by ``kfp.local`` on one machine (``edl demo``) or on a KFP cluster;
- ``schedule_retraining``: a KFP recurring run (six-field cron) that warm-starts each run from
  the last published model.

The same workflow for Argo alone, as a CronWorkflow, is ``edl.pipeline.argo``.
"""


import inspect
import re
from pathlib import Path
from typing import Any, Callable

from kfp import dsl, kubernetes
from kfp.dsl import Model, Output

from edl.api.images import DEFAULT_IMAGES, Images
from edl.cluster.manifests import S3_SECRET_KEYS
from edl.errors import UserError
from edl.pipeline.components import (
    RUNTIME_IMAGE,
    beats_published,
    deploy as deploy_step,
    elastic_train,
    evaluate,
    prepare_data,
    publish,
)
from edl.pipeline.params import TRAIN_PARAMETERS


@dsl.component(base_image=RUNTIME_IMAGE, install_kfp_package=False)
def warm_start_from(model: Output[Model], registry_uri: str, enabled: bool = True) -> str:
    """The registry lookup: the URI of the Model artifact to start from, for ``link_warm_start``.
    That is the published model's own artifact (the run that published it), or the registry's copy
    where that one is gone; when none is published (or ``enabled`` is off), this step's ``model``,
    whose metadata and ``warm_start.json`` say ``published: false`` (train from scratch)."""
    from pathlib import Path

    from edl.pipeline.tasks import lookup_warm_start

    return lookup_warm_start(registry_uri, enabled, Path(model.path), model.metadata, model.uri)


@dsl.pipeline(name="link-warm-start")
def link_warm_start(uri: str) -> Model:
    """The Model artifact at ``uri`` as an input of this run: an importer with ``reimport=False``, so
    that the KFP backend reuses the artifact it already holds under that URI rather than record a new
    one, and the lineage graph runs from the parent's model through this run's training to its model (on
    an s3:// pipeline root; on KFP's default minio:// root the session info differs and the backend records
    a second artifact: docs/pipelines.md, "When KFP's lineage links to the parent's own artifact").
    A pipeline of its own because the backend's importer reads a runtime URI only from an input of
    the DAG around it, not from the output of a task beside it."""
    task = dsl.importer(artifact_uri=uri, artifact_class=Model, reimport=False)
    task.set_caching_options(False)  # the URI changes between runs; an import is cheap anyway
    return task.output


# The pipeline's parameters: its own, and elastic_train's under the same names, types and defaults,
# except those the pipeline sets from its steps and its run (data_uri, warm_start_uri, job_name) or
# leaves at their defaults, checkpoint_uri: here the root under which each run has its own prefix,
# and the images: defaults from the registry the pipeline is compiled for, and runtime_image/
# trainer_image are the images of the steps too. capacity_slots/capacity_schedule are for kfp.local
# (edl demo); a KFP run on a cluster refuses anything but their defaults.
_NOT_EXPOSED = ("data_uri", "warm_start_uri", "initial_trainers", "sidecar_policy", "job_name", "checkpoint_uri")
_PASSED_TO_TRAIN = tuple(p for p in TRAIN_PARAMETERS if p.name not in _NOT_EXPOSED)


def _retrain_signature(images: Images) -> inspect.Signature:
    defaults = {"runtime_image": images.runtime, "trainer_image": images.trainer_cpu,
                "trainer_gpu_image": images.trainer_gpu}
    return inspect.Signature([
        inspect.Parameter("registry_uri", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=str),
        inspect.Parameter("checkpoint_uri", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=str),
        inspect.Parameter("data_kind", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=str, default="digits"),
        *(p.replace(default=defaults[p.name]) if p.name in defaults else p for p in _PASSED_TO_TRAIN),
        inspect.Parameter("warm_start", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=bool, default=True),
        # Off by default: serving needs KServe on the cluster and the deployer Role (edl k8s render --bind-deployer).
        inspect.Parameter("deploy", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=bool, default=False),
        inspect.Parameter("deploy_name", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=str,
                          default="edl-digits"),
    ])

# One run = one job = one checkpoint prefix: named after the pipeline job's id (a UUID on the KFP
# backend, which resolves the placeholder from 2.5; a number in kfp.local), the same for every retry
# of the run and new for every run. "run-" + 36 characters fits edl's 40 for Kubernetes job names.
RUN_JOB_NAME = f"run-{dsl.PIPELINE_JOB_ID_PLACEHOLDER}"


def _with_retrain_signature(body: Callable[..., None], signature: inspect.Signature) -> Callable[..., None]:
    """``body(**parameters)`` as a function of ``signature`` (KFP reads the signature and calls the
    function once, positionally, to build the graph)."""
    def pipeline(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        return body(**bound.arguments)

    pipeline.__signature__ = signature  # type: ignore[attr-defined]  # what inspect.signature reads (KFP)
    pipeline.__name__ = pipeline.__qualname__ = body.__name__
    return pipeline


def _with_s3_secret(task: dsl.PipelineTask, s3_secret: Any) -> dsl.PipelineTask:
    """The step reads or writes S3: the Secret ``s3_secret`` (a pipeline parameter) as its AWS_* env."""
    kubernetes.use_secret_as_env(task, secret_name=s3_secret, secret_key_to_env={k: k for k in S3_SECRET_KEYS})
    return task


def _retrain(registry_uri: str, checkpoint_uri: str, data_kind: str, warm_start: bool, deploy: bool,
             deploy_name: str, **train_parameters: Any):
    s3_secret = train_parameters["s3_secret"]
    # Every step in the image the run names (a pipeline parameter: the KFP backend resolves it, 2.4+).
    runtime, trainer = train_parameters["runtime_image"], train_parameters["trainer_image"]
    data = _with_s3_secret(prepare_data(kind=data_kind), s3_secret).set_container_image(trainer)
    start = _with_s3_secret(warm_start_from(registry_uri=registry_uri, enabled=warm_start), s3_secret)
    start.set_container_image(runtime)
    start.set_caching_options(False)  # the registry changes between runs
    parent = link_warm_start(uri=start.outputs["Output"])
    parent.set_caching_options(False)
    train = elastic_train(data=data.outputs["dataset"], warm_start=parent.output, job_name=RUN_JOB_NAME,
                          checkpoint_uri=f"{checkpoint_uri}/{RUN_JOB_NAME}", **train_parameters)
    _with_s3_secret(train, s3_secret).set_container_image(runtime)
    for env, field in (("POD_NAME", "metadata.name"), ("POD_UID", "metadata.uid")):  # the owner of the job's pods
        kubernetes.use_field_path_as_env(train, env_name=env, field_path=field)
    # Side effects (pods, checkpoints): never served from cache. Retrying is safe: the
    # launcher adopts the job its previous attempt created and resumes from its checkpoint.
    train.set_caching_options(False)
    train.set_retry(num_retries=2, backoff_duration="30s", backoff_factor=2.0)
    score = _with_s3_secret(evaluate(model=train.outputs["model"], data=data.outputs["dataset"],
                                     model_def=train_parameters["model_def"]), s3_secret)
    score.set_caching_options(False)
    score.set_container_image(trainer)
    accuracy = score.outputs["Output"]
    better = _with_s3_secret(beats_published(accuracy=accuracy, registry_uri=registry_uri), s3_secret)
    better.set_caching_options(False)
    better.set_container_image(runtime)
    with dsl.If(better.output == True, name="better-than-published"):  # noqa: E712 - a KFP condition
        done = _with_s3_secret(publish(model=train.outputs["model"], accuracy=accuracy, registry_uri=registry_uri),
                               s3_secret)
        done.set_caching_options(False)
        done.set_container_image(runtime)
        with dsl.If(deploy == True, name="deploy-enabled"):  # noqa: E712 - a KFP condition
            served = _with_s3_secret(deploy_step(model=train.outputs["model"], registry_uri=registry_uri,
                                                 name=deploy_name, job_name=RUN_JOB_NAME), s3_secret)
            served.after(done)
            served.set_caching_options(False)
            served.set_container_image(runtime)


def build_retrain(images: Images = DEFAULT_IMAGES):
    """The KFP pipeline, its images (parameter defaults) from ``images``: one registry for all."""
    return dsl.pipeline(
        name="edl-retrain",
        description="Prepare data, train elastically, evaluate on held-out data, publish only a better model.",
    )(_with_retrain_signature(_retrain, _retrain_signature(images)))


retrain = build_retrain()


# -------------------------------------------------------------------- KFP
KFP_CRON = re.compile(r"^\S+( \S+){5}$")  # KFP: seconds minutes hours day-of-month month day-of-week


def compile_kfp(path: Path, images: Images = DEFAULT_IMAGES) -> Path:
    from kfp import compiler

    path.parent.mkdir(parents=True, exist_ok=True)
    compiler.Compiler().compile(retrain if images == DEFAULT_IMAGES else build_retrain(images), str(path))
    return path


def schedule_retraining(client: Any, *, experiment: str, cron: str, registry_uri: str, pipeline_package: Path,
                        params: dict | None = None, service_account: str = "",
                        name: str = "edl-retrain") -> Any:
    """A KFP recurring run of the retraining pipeline; each run warm-starts from the published model.

    ``client`` is a ``kfp.Client`` (``kfp.Client(host=...)``). ``cron`` has KFP's six fields
    (with seconds), e.g. ``"0 0 3 * * *"`` for 03:00 every day. ``service_account``: empty, the
    run's default account (``pipeline-runner``; ``default-editor`` in a profile namespace), which
    KFP's own pods need; bind edl's launcher Role to it (``edl k8s render --bind-account``).
    """
    if not KFP_CRON.match(cron.strip()):
        raise UserError(f"cron {cron!r}: KFP recurring runs take six fields (seconds first), e.g. '0 0 3 * * *'")
    exp = client.create_experiment(experiment)
    return client.create_recurring_run(
        experiment_id=exp.experiment_id, job_name=name, cron_expression=cron.strip(),
        pipeline_package_path=str(pipeline_package),
        params={"registry_uri": registry_uri, "warm_start": True, **(params or {})},
        service_account=service_account or None, enable_caching=False, max_concurrency=1, no_catchup=True)
