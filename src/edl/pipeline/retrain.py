"""The retraining pipeline: prepare data → elastic train → evaluate → publish if better.

Three forms of the same workflow:
- ``retrain``: the KFP pipeline (Python DSL), compiled to ``pipelines/retrain.pipeline.yaml``
  (``edl pipeline compile``), run by ``kfp.local`` on this machine (``edl demo``) or on a KFP cluster;
- ``schedule_retraining``: a KFP recurring run (six-field cron) that warm-starts each run from
  the last published model;
- ``argo_cron_workflow``: an Argo ``CronWorkflow`` (five-field cron, ``schedules`` list) with the
  same steps and images, authored with Hera.
"""


import inspect
import re
from pathlib import Path
from typing import Any, Callable

from kfp import dsl

from edl.errors import UserError
from edl.pipeline.components import (
    RUNTIME_IMAGE,
    TRAIN_DEFAULTS,
    TRAIN_PARAMETERS,
    TRAINER_IMAGE,
    beats_published,
    elastic_train,
    evaluate,
    prepare_data,
    publish,
)


@dsl.component(base_image=RUNTIME_IMAGE, install_kfp_package=False)
def warm_start_from(registry_uri: str, enabled: bool = True) -> str:
    """The published model to start from (REGISTRY/current), or "" to train from scratch."""
    from edl.pipeline.tasks import warm_start_uri

    return warm_start_uri(registry_uri) if enabled else ""


# The pipeline's parameters: its own, and elastic_train's under the same names, types and defaults,
# except those the pipeline sets from its steps (data_uri, warm_start_uri) or leaves at their defaults.
_NOT_EXPOSED = ("data_uri", "warm_start_uri", "initial_trainers", "sidecar_policy", "job_name")
_PASSED_TO_TRAIN = tuple(p for p in TRAIN_PARAMETERS if p.name not in _NOT_EXPOSED)
_RETRAIN_SIGNATURE = inspect.Signature([
    inspect.Parameter("registry_uri", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=str),
    inspect.Parameter("data_kind", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=str, default="digits"),
    *_PASSED_TO_TRAIN,
    inspect.Parameter("warm_start", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=bool, default=True),
])


def _with_retrain_signature(body: Callable[..., None]) -> Callable[..., None]:
    """``body(**parameters)`` as a function of ``_RETRAIN_SIGNATURE`` (KFP reads the signature and
    calls the function once, positionally, to build the graph)."""
    def pipeline(*args, **kwargs):
        bound = _RETRAIN_SIGNATURE.bind(*args, **kwargs)
        bound.apply_defaults()
        return body(**bound.arguments)

    pipeline.__signature__ = _RETRAIN_SIGNATURE
    pipeline.__name__ = pipeline.__qualname__ = body.__name__
    return pipeline


@dsl.pipeline(name="edl-retrain",
              description="Prepare data, train elastically, evaluate on held-out data, publish only a better model.")
@_with_retrain_signature
def retrain(registry_uri: str, data_kind: str, warm_start: bool, **train_parameters: Any):
    data = prepare_data(kind=data_kind)
    start = warm_start_from(registry_uri=registry_uri, enabled=warm_start)
    start.set_caching_options(False)  # the registry changes between runs
    train = elastic_train(data=data.outputs["dataset"], warm_start_uri=start.output, **train_parameters)
    # Side effects (pods, checkpoints): never served from cache. Retrying is safe: the
    # launcher adopts the job its previous attempt created and resumes from its checkpoint.
    train.set_caching_options(False)
    train.set_retry(num_retries=2, backoff_duration="30s", backoff_factor=2.0)
    score = evaluate(model=train.outputs["model"], data=data.outputs["dataset"],
                     model_def=train_parameters["model_def"])
    score.set_caching_options(False)
    accuracy = score.outputs["Output"]
    better = beats_published(accuracy=accuracy, registry_uri=registry_uri)
    better.set_caching_options(False)
    with dsl.If(better.output == True, name="better-than-published"):  # noqa: E712 - a KFP condition
        done = publish(model=train.outputs["model"], accuracy=accuracy, registry_uri=registry_uri)
        done.set_caching_options(False)


# -------------------------------------------------------------------- KFP
KFP_CRON = re.compile(r"^\S+( \S+){5}$")  # KFP: seconds minutes hours day-of-month month day-of-week


def compile_kfp(path: Path) -> Path:
    from kfp import compiler

    path.parent.mkdir(parents=True, exist_ok=True)
    compiler.Compiler().compile(retrain, str(path))
    return path


def schedule_retraining(client: Any, *, experiment: str, cron: str, registry_uri: str, pipeline_package: Path,
                        params: dict | None = None, service_account: str = "edl-launcher",
                        name: str = "edl-retrain") -> Any:
    """A KFP recurring run of the retraining pipeline; each run warm-starts from the published model.

    ``client`` is a ``kfp.Client`` (``kfp.Client(host=...)``). ``cron`` has KFP's six fields
    (with seconds), e.g. ``"0 0 3 * * *"`` for 03:00 every day.
    """
    if not KFP_CRON.match(cron.strip()):
        raise UserError(f"cron {cron!r}: KFP recurring runs take six fields (seconds first), e.g. '0 0 3 * * *'")
    exp = client.create_experiment(experiment)
    return client.create_recurring_run(
        experiment_id=exp.experiment_id, job_name=name, cron_expression=cron.strip(),
        pipeline_package_path=str(pipeline_package),
        params={"registry_uri": registry_uri, "warm_start": True, **(params or {})},
        service_account=service_account, enable_caching=False, max_concurrency=1, no_catchup=True)


# ------------------------------------------------------------------- Argo
ARGO_CRON = re.compile(r"^\S+( \S+){4}$")


def argo_cron_workflow(*, schedule: str = "0 3 * * *", namespace: str = "default", registry_uri: str = "s3://models/digits",
                       checkpoint_uri: str = "s3://checkpoints/digits-retrain", s3_secret: str = "minio-creds",
                       data_uri: str = "s3://data/digits", epochs: int = TRAIN_DEFAULTS["epochs"],
                       max_trainers: int = TRAIN_DEFAULTS["max_trainers"], runtime_image: str = RUNTIME_IMAGE,
                       trainer_image: str = TRAINER_IMAGE):
    """The same retraining as an Argo ``CronWorkflow`` (Argo v4: ``schedules``, five-field cron)."""
    from hera.workflows import Container, CronWorkflow, FieldEnv, Parameter, SecretEnv, Steps
    from hera.workflows.models import ResourceRequirements, SecurityContext

    if not ARGO_CRON.match(schedule.strip()):
        raise UserError(f"schedule {schedule!r}: Argo cron takes five fields, e.g. '0 3 * * *'")
    model_def = TRAIN_DEFAULTS["model_def"]
    s3_env = [SecretEnv(name=k, secret_name=s3_secret, secret_key=k)
              for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL")]
    pod_env = [FieldEnv(name="POD_NAME", field_path="metadata.name"),
               FieldEnv(name="POD_UID", field_path="metadata.uid")]
    secure = SecurityContext(run_as_non_root=True, run_as_user=10001, allow_privilege_escalation=False,
                             read_only_root_filesystem=False, capabilities={"drop": ["ALL"]})

    def resources(cpu: str, memory: str) -> ResourceRequirements:
        return ResourceRequirements(requests={"cpu": cpu, "memory": memory}, limits={"cpu": cpu, "memory": memory})

    with CronWorkflow(name="edl-retrain", namespace=namespace, schedules=[schedule.strip()],
                      concurrency_policy="Forbid", starting_deadline_seconds=600, entrypoint="retrain",
                      service_account_name="edl-launcher",
                      arguments=[Parameter(name="registry_uri", value=registry_uri),
                                 Parameter(name="epochs", value=str(epochs))]) as cw:
        prepare = Container(
            name="prepare-data", image=trainer_image, command=["edl", "data", "prepare", "digits"],
            args=["--out", data_uri], env=s3_env, security_context=secure, resources=resources("500m", "1Gi"))
        warm = Container(
            name="warm-start-from", image=runtime_image, command=["python", "-c"],
            args=["import sys; from edl.pipeline.tasks import warm_start_uri; "
                  "open('/tmp/warm', 'w').write(warm_start_uri(sys.argv[1]))", "{{workflow.parameters.registry_uri}}"],
            env=s3_env, security_context=secure, resources=resources("250m", "256Mi"),
            outputs=[Parameter(name="uri", value_from={"path": "/tmp/warm"})])
        train = Container(
            name="elastic-train", image=runtime_image, command=["edl", "launch"],
            args=["--job-name", "retrain-{{workflow.creationTimestamp.Y}}{{workflow.creationTimestamp.m}}"
                                "{{workflow.creationTimestamp.d}}",
                  "--model-def", model_def, "--data", data_uri, "--epochs", "{{workflow.parameters.epochs}}",
                  "--batch-size", str(TRAIN_DEFAULTS["batch_size"]),
                  "--min-trainers", str(TRAIN_DEFAULTS["min_trainers"]), "--max-trainers", str(max_trainers),
                  "--checkpoint-uri", checkpoint_uri, "--s3-secret", s3_secret, "--namespace", namespace,
                  "--image", runtime_image, "--trainer-image", trainer_image,
                  "--init-model", "{{inputs.parameters.warm}}", "--summary-out", "/tmp/summary.json"],
            inputs=[Parameter(name="warm")], env=pod_env, security_context=secure,
            resources=resources("500m", "512Mi"), retry_strategy={"limit": "2", "retryPolicy": "OnError"})
        score = Container(
            name="evaluate", image=trainer_image, command=["python", "-c"],
            args=["import json, sys; from edl.pipeline.tasks import evaluate_remote; "
                  f"open('/tmp/accuracy', 'w').write(str(evaluate_remote(sys.argv[1], sys.argv[2], {model_def!r})))",
                  f"{checkpoint_uri}/model", data_uri],
            env=s3_env, security_context=secure, resources=resources("1", "2Gi"),
            outputs=[Parameter(name="accuracy", value_from={"path": "/tmp/accuracy"})])
        publish_step = Container(
            name="publish-if-better", image=runtime_image, command=["python", "-c"],
            args=["import sys; from edl.pipeline.tasks import publish_if_better; "
                  "publish_if_better(sys.argv[1], float(sys.argv[2]), sys.argv[3])",
                  f"{checkpoint_uri}/model", "{{inputs.parameters.accuracy}}", "{{workflow.parameters.registry_uri}}"],
            inputs=[Parameter(name="accuracy")], env=s3_env, security_context=secure,
            resources=resources("250m", "256Mi"))
        with Steps(name="retrain"):
            prepare()
            w = warm()
            train(arguments={"warm": w.get_parameter("uri").value})
            s = score()
            publish_step(arguments={"accuracy": s.get_parameter("accuracy").value})
    return cw
