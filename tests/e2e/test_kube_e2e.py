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
from edl.master.job import JobSpec

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900),
              pytest.mark.skipif(not os.environ.get("EDL_E2E_KUBECONFIG"),
                                 reason="needs a real cluster: set EDL_E2E_KUBECONFIG")]

NS = os.environ.get("EDL_E2E_NAMESPACE", "edl-e2e")


@pytest.fixture(scope="module")
def kube():
    from edl.cluster.kubernetes import KubeApi, load_api_client

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
    opts = m.K8sOptions(namespace=NS, s3_secret="minio")
    for group in m.render(spec, opts).values():
        for obj in group:
            _dry_run(kube, obj)
    _dry_run(kube, m.trainer_pod(spec, opts, "edl-e2e-render-trainer-1"))


@pytest.mark.skipif(not (os.environ.get("EDL_E2E_IMAGE") and os.environ.get("EDL_E2E_S3_SECRET")
                         and os.environ.get("EDL_E2E_DATA")),
                    reason="needs EDL_E2E_IMAGE, EDL_E2E_S3_SECRET and EDL_E2E_DATA")
def test_launcher_pod_runs_a_job_and_leaves_nothing_behind(kube):
    image = os.environ["EDL_E2E_IMAGE"]
    job = f"e2e-{uuid.uuid4().hex[:6]}"
    for obj in m.rbac(NS):
        try:
            kube.create(obj)
        except Exception:  # noqa: BLE001 - cluster-scoped RBAC may need an admin; then apply it beforehand
            pass
    args = ["launch", "--job-name", job, "--model-def", "edl.zoo.digits", "--data", os.environ["EDL_E2E_DATA"],
            "--epochs", "3", "--batch-size", "32", "--min-trainers", "1", "--max-trainers", "2",
            "--checkpoint-uri", f"s3://edl-e2e/{job}", "--namespace", NS, "--image", image,
            "--trainer-image", image, "--trainer-cpu", "500m", "--trainer-memory", "1Gi",
            "--s3-secret", os.environ["EDL_E2E_S3_SECRET"]]
    env = [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
           {"name": "POD_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}}]
    kube.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"{job}-launcher", "namespace": NS},
                 "spec": {"serviceAccountName": m.LAUNCHER_SA, "restartPolicy": "Never",
                          "containers": [{"name": "launch", "image": image, "command": ["edl"], "args": args,
                                          "env": env, "resources": {"requests": {"cpu": "100m", "memory": "256Mi"},
                                                                    "limits": {"cpu": "1", "memory": "1Gi"}}}]}})
    deadline = time.monotonic() + 800
    phase = None
    while time.monotonic() < deadline:
        phase = ((kube.get("pods", f"{job}-launcher") or {}).get("status") or {}).get("phase")
        if phase in ("Succeeded", "Failed"):
            break
        time.sleep(2)
    assert phase == "Succeeded"
    assert kube.list("pods", f"edl.dev/job={job}") == []
    assert kube.get("services", m.names(job)["service"]) is None
    assert kube.get("secrets", m.names(job)["secret"]) is None
    kube.delete("pods", f"{job}-launcher")
