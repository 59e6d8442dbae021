"""The pipeline's ``deploy`` step: a trained model served by KServe.

KServe's ONNX path serves with Triton (``modelFormat: onnx``, Open Inference Protocol v2), which
loads a *model repository*: ``STORAGE_URI/NAME/1/model.onnx``. The step writes that repository
under the registry (``REGISTRY/serving/JOB``: one per run, never overwritten, so a pod that
restarts later loads the same model) and then creates, or updates to it, three objects:

- a Secret ``NAME-storage`` with the S3 credentials (``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``)
  and the annotations KServe's storage initializer reads (``serving.kserve.io/s3-endpoint``,
  ``s3-usehttps``, ``s3-verifyssl``, ``s3-region``);
- a ServiceAccount ``NAME-storage`` listing that Secret (KServe finds the credentials through the
  predictor's ``serviceAccountName``);
- the ``InferenceService`` ``NAME`` (``serving.kserve.io/v1beta1``).

Then it waits until KServe serves the model (the service Ready, only the new model's predictors ready),
and fails with KServe's reason in one line when it cannot (a storage initializer that cannot fetch the
model, a predictor that crashes). The builders and ``serving_state`` are pure; ``deploy_model`` does the
S3 copy and the API calls (``KubeApi.apply``: create, or replace what is there, with retries).
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from edl.errors import PermanentError, UserError
from edl.storage.checkpoint import ONNX_FILE

API_VERSION = "serving.kserve.io/v1beta1"
SERVING_PREFIX = "serving"  # under the registry: one Triton model repository per run
LABELS = {"app.kubernetes.io/name": "edl", "app.kubernetes.io/component": "serving"}
# KServe: a DNS-1035 label; its hostnames (NAME-predictor-NAMESPACE...) leave room for about 45.
SERVICE_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,43}[a-z0-9])?$")
SA_NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
STORAGE_INITIALIZER = "storage-initializer"  # the init container KServe's pod webhook adds
READY_TIMEOUT_S = 600.0  # a predictor's image pull and the model's download, on a cold node
POLL_S = 2.0


def storage_name(name: str) -> str:
    return f"{name}-storage"


def s3_annotations(env: dict[str, str]) -> dict[str, str]:
    """KServe's S3 settings from edl's (the AWS_* of the S3 Secret): the endpoint without its scheme,
    https or not from the scheme, the region (us-east-1 when none: MinIO ignores it)."""
    endpoint = env.get("AWS_ENDPOINT_URL") or env.get("S3_ENDPOINT") or ""
    annotations = {"serving.kserve.io/s3-region": env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or "us-east-1"}
    if endpoint:
        parts = urlsplit(endpoint if "://" in endpoint else f"https://{endpoint}")
        if not parts.netloc:
            raise UserError(f"AWS_ENDPOINT_URL {endpoint!r}: not a URL (http://host:port)")
        https = "1" if parts.scheme == "https" else "0"
        annotations.update({"serving.kserve.io/s3-endpoint": parts.netloc, "serving.kserve.io/s3-usehttps": https,
                            "serving.kserve.io/s3-verifyssl": https})
    return annotations


def storage_secret(name: str, namespace: str, env: dict[str, str]) -> dict:
    missing = [k for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY") if not env.get(k)]
    if missing:
        raise UserError(f"deploy: no {' or '.join(missing)} in the step's environment (the S3 Secret s3_secret)")
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": storage_name(name), "namespace": namespace, "labels": LABELS,
                         "annotations": s3_annotations(env)},
            "stringData": {k: env[k] for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}}


def storage_account(name: str, namespace: str) -> dict:
    return {"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": storage_name(name), "namespace": namespace, "labels": LABELS},
            "secrets": [{"name": storage_name(name)}]}


def inference_service(name: str, namespace: str, storage_uri: str, source: str = "") -> dict:
    """The InferenceService: Triton's ONNX runtime over the v2 protocol (KServe needs
    ``protocolVersion: v2`` to pick a runtime for ONNX), the model from ``storage_uri``."""
    annotations = {"edl.dev/model-source": source} if source else {}
    return {"apiVersion": API_VERSION, "kind": "InferenceService",
            "metadata": {"name": name, "namespace": namespace, "labels": LABELS, "annotations": annotations},
            "spec": {"predictor": {
                "serviceAccountName": storage_name(name),
                "model": {"modelFormat": {"name": "onnx"}, "protocolVersion": "v2", "storageUri": storage_uri,
                          "resources": {"requests": {"cpu": "100m", "memory": "512Mi"},
                                        "limits": {"cpu": "1", "memory": "1Gi"}}}}}}


def objects(name: str, namespace: str, storage_uri: str, env: dict[str, str], source: str = "") -> list[dict]:
    """What the step applies, in order (the account's Secret first, the service last)."""
    return [storage_secret(name, namespace, env), storage_account(name, namespace),
            inference_service(name, namespace, storage_uri, source)]


def publish_repository(model_uri: str, registry_uri: str, name: str, job: str) -> str:
    """Copy the model's ONNX file to ``REGISTRY/serving/JOB/NAME/1/model.onnx``; returns the
    repository's URI (``REGISTRY/serving/JOB``), the InferenceService's storageUri."""
    from edl.storage.store import open_store

    model = open_store(model_uri, "model")
    if not model.exists(ONNX_FILE):
        raise UserError(f"deploy: model {model_uri} has no {ONNX_FILE} (its ONNX export failed or was not made); "
                        "KServe's ONNX runtime needs it")
    registry = open_store(registry_uri, "registry_uri")
    registry.check()
    prefix = f"{SERVING_PREFIX}/{job}"
    registry.put(f"{prefix}/{name}/1/{ONNX_FILE}", model.get(ONNX_FILE))
    return registry.child(prefix)


@dataclass(frozen=True)
class Serving:
    """Where serving the step's model stands: ``ready`` (KServe says Ready and only the new model's
    predictors are ready), ``failure`` (one line: why it cannot be), else still on its way (``waiting``)."""

    ready: bool = False
    failure: str | None = None
    waiting: str = ""


def _storage_uri(pod: dict) -> str | None:
    """The model a predictor pod serves: its storage initializer's first argument."""
    for c in pod.get("spec", {}).get("initContainers") or []:
        if c.get("name") == STORAGE_INITIALIZER and c.get("args"):
            return c["args"][0]
    return None


def _pod_ready(pod: dict) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in pod.get("status", {}).get("conditions") or [])


def _failed_container(pod: dict) -> str | None:
    """One line for a container of the pod that exited non-zero (now or before a restart), from its
    termination message (its log's tail, ``FallbackToLogsOnError``); ``None`` when none did."""
    status = pod.get("status", {})
    for s in [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]:
        for when in ("state", "lastState"):
            term = (s.get(when) or {}).get("terminated") or {}
            if term.get("exitCode", 0) != 0:
                lines = [ln.strip() for ln in (term.get("message") or "").splitlines() if ln.strip()]
                why = lines[-1] if lines else f"exit code {term['exitCode']}"
                return f"{s.get('name')} of pod {pod['metadata']['name']} failed: {why}"
    return None


def serving_state(isvc: dict | None, pods: list[dict], storage_uri: str) -> Serving:
    """Pure: the InferenceService and its predictor pods as the API shows them -> ``Serving``."""
    ours = [p for p in pods if _storage_uri(p) == storage_uri]
    for pod in ours:
        if (failure := _failed_container(pod)) is not None:
            return Serving(failure=failure)
    conditions = {c.get("type"): c for c in (isvc or {}).get("status", {}).get("conditions") or []}
    ready = conditions.get("Ready", {}).get("status") == "True"
    older = [p["metadata"]["name"] for p in pods if _storage_uri(p) != storage_uri and _pod_ready(p)]
    if ready and any(_pod_ready(p) for p in ours) and not older:
        return Serving(ready=True)
    if not ours:
        return Serving(waiting="a predictor pod of this model")
    if older:
        return Serving(waiting=f"the earlier model's predictors to stop ({', '.join(older)})")
    unready = [c for c in conditions.values() if c.get("status") != "True"]
    return Serving(waiting="; ".join(f"{c['type']}: {c.get('message') or c.get('reason') or c.get('status')}"
                                     for c in unready) or "the predictor to become Ready")


def wait_served(api: Any, name: str, storage_uri: str, timeout_s: float,
                clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> None:
    """Until KServe serves ``storage_uri`` under ``name``; one line (``PermanentError``) if it cannot, or if it
    does not within ``timeout_s``."""
    deadline = clock() + timeout_s
    while True:
        state = serving_state(api.get("inferenceservices", name),
                              api.list("pods", f"serving.kserve.io/inferenceservice={name}"), storage_uri)
        if state.ready:
            return
        if state.failure is not None:
            raise PermanentError(f"deploy: InferenceService {name} cannot serve {storage_uri}: {state.failure}")
        if clock() > deadline:
            raise PermanentError(f"deploy: InferenceService {name} not serving {storage_uri} after "
                                 f"{timeout_s:.0f} s; waiting for {state.waiting}")
        sleep(POLL_S)


def deploy_model(model_uri: str, registry_uri: str, name: str, job: str, namespace: str = "",
                 api_client: object | None = None, env: dict[str, str] | None = None,
                 wait_s: float = READY_TIMEOUT_S) -> str:
    """The step: the repository written, then the Secret, ServiceAccount and InferenceService applied in
    ``namespace`` (default: the step's pod's), then (``wait_s`` > 0) until KServe serves the model: the
    step fails with KServe's reason (a storage initializer that cannot fetch the model, a predictor that
    crashes) rather than succeed with nothing served. Returns the storage URI."""
    from edl.cluster.kube_api import KubeApi, load_api_client

    if not SERVICE_NAME.match(name):
        raise UserError(f"pipeline parameter deploy_name: {name!r}; an InferenceService name is at most 45 "
                        "lowercase letters, digits and '-', starting with a letter")
    if not registry_uri.startswith("s3://"):
        raise UserError(f"pipeline parameter registry_uri: {registry_uri!r}; deploy needs an s3:// registry "
                        "(KServe downloads the model from it)")
    storage_uri = publish_repository(model_uri, registry_uri, name, job)
    namespace = namespace or SA_NAMESPACE_FILE.read_text().strip()
    api = KubeApi(api_client or load_api_client(), namespace)
    for obj in objects(name, namespace, storage_uri, dict(os.environ) if env is None else env, model_uri):
        api.apply(obj)
    if wait_s > 0:
        wait_served(api, name, storage_uri, wait_s)
    return storage_uri
