"""The retraining workflow as an Argo ``CronWorkflow`` (five-field cron, ``schedules`` list), authored
with Hera: the steps and images of the KFP pipeline (``edl.pipeline.retrain``), for clusters that run
Argo Workflows without Kubeflow Pipelines; compiled to ``pipelines/retrain.cronworkflow.yaml`` with its
RBAC beside it (``edl pipeline compile``).
"""

from __future__ import annotations

import json
import re

from edl.api.images import DEFAULT_IMAGES, Images
from edl.cluster.manifests import S3_SECRET_KEYS, launcher_bindings
from edl.errors import UserError
from edl.pipeline.params import TRAIN_DEFAULTS

ARGO_CRON = re.compile(r"^\S+( \S+){4}$")
TRAIN_STEP_GRACE_S = 60
ARGO_SERVICE_ACCOUNT = "edl-retrain"
ARGO_EXECUTOR_ROLE = "edl-retrain-argo-executor"


def argo_rbac(namespace: str = "default") -> list[dict]:
    """The CronWorkflow's ServiceAccount, what Argo's emissary executor needs (its wait container reports
    each step's outputs as WorkflowTaskResults, Argo 3.4+), and edl's launcher Role bound to it
    (``edl k8s render`` writes that Role)."""
    labels = {"app.kubernetes.io/name": "edl"}
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": ARGO_SERVICE_ACCOUNT, "namespace": namespace, "labels": labels}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {"name": ARGO_EXECUTOR_ROLE, "namespace": namespace, "labels": labels},
         "rules": [{"apiGroups": ["argoproj.io"], "resources": ["workflowtaskresults"],
                    "verbs": ["create", "patch"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": ARGO_EXECUTOR_ROLE, "namespace": namespace, "labels": labels},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": ARGO_EXECUTOR_ROLE},
         "subjects": [{"kind": "ServiceAccount", "name": ARGO_SERVICE_ACCOUNT, "namespace": namespace}]},
        *launcher_bindings(namespace, ARGO_SERVICE_ACCOUNT),
    ]


def argo_cron_workflow(*, schedule: str = "0 3 * * *", namespace: str = "default", registry_uri: str = "s3://models/digits",
                       checkpoint_uri: str = "s3://checkpoints/digits-retrain", s3_secret: str = "minio-creds",
                       data_uri: str = "s3://data/digits", epochs: int = TRAIN_DEFAULTS["epochs"],
                       max_trainers: int = TRAIN_DEFAULTS["max_trainers"], images: Images = DEFAULT_IMAGES):
    """The same retraining as an Argo ``CronWorkflow`` (Argo 3.6+ and v4: ``schedules``, five-field cron, UTC).

    Its pods run under ``ARGO_SERVICE_ACCOUNT``, with what Argo's executor and edl's launcher need
    (``argo_rbac``); the steps and the job's pods in ``images``.

    Each workflow is one job: named after the workflow's uid (the same for the retries of its training
    step, new for every scheduled run), with its checkpoints under ``checkpoint_uri``/that name; the
    warm start comes from the model published at ``registry_uri``.
    """
    from hera.workflows import Container, CronWorkflow, FieldEnv, Parameter, SecretEnv, Steps
    from hera.workflows.models import ResourceRequirements, SecurityContext

    if not ARGO_CRON.match(schedule.strip()):
        raise UserError(f"schedule {schedule!r}: Argo cron takes five fields, e.g. '0 3 * * *'")
    runtime_image, trainer_image = images.runtime, images.trainer_cpu
    model_def = TRAIN_DEFAULTS["model_def"]
    job_name = "run-{{workflow.uid}}"  # "run-" + a 36-character uid: edl's 40 for Kubernetes job names
    job_checkpoints = f"{checkpoint_uri}/{job_name}"
    s3_env = [SecretEnv(name=k, secret_name=s3_secret, secret_key=k) for k in S3_SECRET_KEYS]
    pod_env = [FieldEnv(name="POD_NAME", field_path="metadata.name"),
               FieldEnv(name="POD_UID", field_path="metadata.uid")]
    secure = SecurityContext(run_as_non_root=True, run_as_user=10001, allow_privilege_escalation=False,
                             read_only_root_filesystem=False, capabilities={"drop": ["ALL"]})

    def resources(cpu: str, memory: str) -> ResourceRequirements:
        return ResourceRequirements(requests={"cpu": cpu, "memory": memory}, limits={"cpu": cpu, "memory": memory})

    with CronWorkflow(name="edl-retrain", namespace=namespace, schedules=[schedule.strip()],
                      timezone="UTC", concurrency_policy="Forbid", starting_deadline_seconds=600, entrypoint="retrain",
                      service_account_name=ARGO_SERVICE_ACCOUNT,
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
            args=["--job-name", job_name,
                  "--model-def", model_def, "--data", data_uri, "--epochs", "{{workflow.parameters.epochs}}",
                  "--batch-size", str(TRAIN_DEFAULTS["batch_size"]),
                  "--min-trainers", str(TRAIN_DEFAULTS["min_trainers"]), "--max-trainers", str(max_trainers),
                  "--checkpoint-uri", job_checkpoints, "--s3-secret", s3_secret, "--namespace", namespace,
                  "--image", runtime_image, "--trainer-image", trainer_image,
                  "--trainer-gpu-image", images.trainer_gpu,
                  "--init-model", "{{inputs.parameters.warm}}", "--summary-out", "/tmp/summary.json"],
            inputs=[Parameter(name="warm")], env=[*pod_env, *s3_env], security_context=secure,
            # The launcher and the job's autoscale sidecar; the sidecar that decides for the namespace caches
            # the cluster's nodes and pods (27 MiB for 20,000 pods, 73 MiB for 150,000: docs/autoscaling.md).
            resources=ResourceRequirements(requests={"cpu": "500m", "memory": "512Mi"},
                                           limits={"cpu": "1", "memory": "1Gi"}),
            # Retry a failed step (OnFailure: OnError would not retry the main container's own failure),
            # but not a user error (exit 2: the same spec fails the same way); the retry adopts the job.
            retry_strategy={"limit": "2", "retryPolicy": "OnFailure", "expression": "asInt(lastRetry.exitCode) != 2",
                            "backoff": {"duration": "30s", "factor": "2"}},
            # On termination: the job's last checkpoint (20 s) and the deletes of its pods.
            pod_spec_patch=json.dumps({"terminationGracePeriodSeconds": TRAIN_STEP_GRACE_S}))
        score = Container(
            name="evaluate", image=trainer_image, command=["python", "-c"],
            args=["import json, sys; from edl.pipeline.tasks import evaluate_remote; "
                  f"open('/tmp/accuracy', 'w').write(str(evaluate_remote(sys.argv[1], sys.argv[2], {model_def!r})))",
                  f"{job_checkpoints}/model", data_uri],
            env=s3_env, security_context=secure, resources=resources("1", "2Gi"),
            outputs=[Parameter(name="accuracy", value_from={"path": "/tmp/accuracy"})])
        publish_step = Container(
            name="publish-if-better", image=runtime_image, command=["python", "-c"],
            args=["import sys; from edl.pipeline.tasks import publish_if_better; "
                  "publish_if_better(sys.argv[1], float(sys.argv[2]), sys.argv[3])",
                  f"{job_checkpoints}/model", "{{inputs.parameters.accuracy}}", "{{workflow.parameters.registry_uri}}"],
            inputs=[Parameter(name="accuracy")], env=s3_env, security_context=secure,
            resources=resources("250m", "256Mi"))
        with Steps(name="retrain"):
            prepare()
            w = warm()
            train(arguments={"warm": w.get_parameter("uri").value})
            s = score()
            publish_step(arguments={"accuracy": s.get_parameter("accuracy").value})
    return cw
