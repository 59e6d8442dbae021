"""Against a real cluster (kind or minikube): set EDL_E2E_KUBECONFIG, else every test here is skipped.

    EDL_E2E_KUBECONFIG=~/.kube/config EDL_E2E_NAMESPACE=edl-e2e ./dev test tests/e2e

- every rendered object passes the API server's own validation (server-side dry run);
- with EDL_E2E_IMAGE (an image built from images/, loaded into the cluster),
  EDL_E2E_S3_SECRET (a Secret with AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and
  AWS_ENDPOINT_URL of an S3 store the pods reach) and EDL_E2E_DATA (an s3:// URI
  of a prepared data set, e.g. ``edl data prepare digits --out s3://...``):
  a launcher pod runs ``edl launch`` in the cluster, the job succeeds, and
  afterwards no object of the job is left.
"""

from __future__ import annotations

import os
import time
import uuid

import pytest

from edl.cluster import manifests as m
from edl.api.spec import JobSpec, K8sOptions, with_trainer_images
from tests.waits import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900),
              pytest.mark.skipif(not os.environ.get("EDL_E2E_KUBECONFIG"),
                                 reason="needs a real cluster: set EDL_E2E_KUBECONFIG")]

NS = os.environ.get("EDL_E2E_NAMESPACE", "edl-e2e")


@pytest.fixture(scope="module")
def kube():
    from edl.cluster.kube_api import KubeApi, load_api_client

    return KubeApi(load_api_client(os.environ["EDL_E2E_KUBECONFIG"]), NS)


def _dry_run(kube, obj: dict) -> None:
    from kubernetes import client
    from kubernetes.dynamic import DynamicClient

    dyn = DynamicClient(kube.api_client)
    api = dyn.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
    kw = {"namespace": NS} if api.namespaced else {}
    try:
        api.create(body=obj, dry_run="All", **kw)
    except client.exceptions.ApiException as e:
        if e.status != 409:  # already there (RBAC applied before) is fine for a dry run
            raise


def test_rendered_objects_pass_server_side_validation(kube):
    spec = JobSpec(job="e2e-render", model_def="edl.zoo.digits", data="s3://data/digits", epochs=1, batch_size=32,
                   min_trainers=1, max_trainers=2, trainers=1, checkpoint_uri="s3://ckpt/e2e-render")
    opts = with_trainer_images(K8sOptions(namespace=NS, s3_secret="minio"), "paddle")
    for group in m.render(spec, opts).values():
        for obj in group:
            _dry_run(kube, obj)
    _dry_run(kube, m.trainer_pod(spec, opts, "edl-e2e-render-trainer-1"))


needs_image = pytest.mark.skipif(
    not (os.environ.get("EDL_E2E_IMAGE") and os.environ.get("EDL_E2E_S3_SECRET") and os.environ.get("EDL_E2E_DATA")),
    reason="needs EDL_E2E_IMAGE, EDL_E2E_S3_SECRET and EDL_E2E_DATA")


def _launcher(kube, job: str, *extra: str, epochs: int = 3) -> str:
    """A launcher pod running `edl launch` in the cluster, as a pipeline step would."""
    image = os.environ["EDL_E2E_IMAGE"]
    for obj in m.rbac(NS):
        try:
            kube.create(obj)
        except Exception:  # noqa: BLE001 - cluster-scoped RBAC may need an admin; then apply it beforehand
            pass
    args = ["launch", "--job-name", job, "--model-def", "edl.zoo.digits", "--data", os.environ["EDL_E2E_DATA"],
            "--epochs", str(epochs), "--batch-size", "32", "--min-trainers", "1", "--max-trainers", "2",
            "--checkpoint-uri", f"s3://edl-e2e/{job}", "--checkpoint-interval", "5", "--namespace", NS,
            "--image", image, "--trainer-image", image, "--trainer-cpu", "500m", "--trainer-memory", "1Gi",
            "--s3-secret", os.environ["EDL_E2E_S3_SECRET"], *extra]
    env = [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
           {"name": "POD_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}}]
    name = f"{job}-launcher"
    kube.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS},
                 "spec": {"serviceAccountName": m.LAUNCHER_SA, "restartPolicy": "Never",
                          "terminationGracePeriodSeconds": 30,
                          "containers": [{"name": "launch", "image": image, "command": ["edl"], "args": args,
                                          "env": env, "resources": {"requests": {"cpu": "100m", "memory": "256Mi"},
                                                                    "limits": {"cpu": "1", "memory": "1Gi"}}}]}})
    return name


def _phase(kube, name: str) -> str | None:
    return ((kube.get("pods", name) or {}).get("status") or {}).get("phase")


def _wait(pred, timeout: float, what: str):
    return wait_for(pred, timeout, what, every=2)


def _log(kube, name: str) -> str:
    from kubernetes import client

    return client.CoreV1Api(kube.api_client).read_namespaced_pod_log(name, NS)


def _nothing_left(kube, job: str) -> bool:
    return (not kube.list("pods", f"edl.dev/job={job}") and kube.get("services", m.names(job)["service"]) is None
            and kube.get("secrets", m.names(job)["secret"]) is None)


@needs_image
def test_launcher_pod_runs_a_job_and_leaves_nothing_behind(kube):
    job = f"e2e-{uuid.uuid4().hex[:6]}"
    name = _launcher(kube, job)
    assert _wait(lambda: _phase(kube, name) in ("Succeeded", "Failed") and _phase(kube, name), 800,
                 "the launcher to end") == "Succeeded", _log(kube, name)
    assert _nothing_left(kube, job)
    kube.delete("pods", name)


@needs_image
def test_deleting_the_launcher_pod_removes_every_object_within_25_s(kube):
    job = f"e2e-{uuid.uuid4().hex[:6]}"
    name = _launcher(kube, job, epochs=400)
    _wait(lambda: kube.list("pods", f"edl.dev/job={job},edl.dev/role=trainer"), 600, "a trainer pod")
    t0 = time.monotonic()
    kube.delete("pods", name)  # what KFP terminate and Argo stop do: SIGTERM, then SIGKILL after the grace period
    _wait(lambda: _nothing_left(kube, job), 60, "the job's objects to go")
    assert time.monotonic() - t0 <= 25


@needs_image
def test_a_lost_master_pod_is_recreated_and_the_job_succeeds(kube):
    job = f"e2e-{uuid.uuid4().hex[:6]}"
    name = _launcher(kube, job, epochs=30)
    master = m.names(job)["master"]
    _wait(lambda: _phase(kube, master) == "Running", 600, "the master")
    uid = kube.get("pods", master)["metadata"]["uid"]
    kube.delete("pods", master, grace_s=0)
    _wait(lambda: (kube.get("pods", master) or {"metadata": {"uid": uid}})["metadata"]["uid"] != uid, 120,
          "a new master pod")
    assert _wait(lambda: _phase(kube, name) in ("Succeeded", "Failed") and _phase(kube, name), 900,
                 "the launcher to end") == "Succeeded", _log(kube, name)
    kube.delete("pods", name)


@needs_image
def test_an_oom_killed_trainer_fails_the_job_naming_the_memory_limit(kube):
    job = f"e2e-{uuid.uuid4().hex[:6]}"
    name = _launcher(kube, job, "--trainer-memory", "48Mi")  # PaddlePaddle alone needs more
    assert _wait(lambda: _phase(kube, name) in ("Succeeded", "Failed") and _phase(kube, name), 600,
                 "the launcher to end") == "Failed"
    log = _log(kube, name)
    assert "OOMKilled" in log and "48Mi" in log
    assert _nothing_left(kube, job)
    kube.delete("pods", name)


@needs_image
def test_trainers_that_cannot_be_scheduled_are_reported(kube):
    job = f"e2e-{uuid.uuid4().hex[:6]}"
    name = _launcher(kube, job, "--trainer-cpu", "1000", "--pending-timeout", "10", epochs=400)
    _wait(lambda: any(e["reason"] == "TrainersUnschedulable" and e["involvedObject"]["name"] == name
                      for e in kube.list("events")), 300, "an unschedulable report")
    kube.delete("pods", name)
    _wait(lambda: _nothing_left(kube, job), 60, "the job's objects to go")
