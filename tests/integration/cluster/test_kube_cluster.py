"""``KubeCluster`` against the real control plane where its timing matters: a lost master's
successor, created under the same name, never runs beside the old one."""

from __future__ import annotations

import os
import signal
import threading

import pytest
from kubernetes import client, watch

from edl.api.spec import JobSpec, K8sOptions
from edl.cluster.kube_api import KubeApi
from edl.cluster.kube_cluster import KubeCluster
from tests.plane.steps import process_running
from tests.waits import wait_for

pytestmark = pytest.mark.timeout(240)


def test_a_master_that_takes_its_grace_period_is_gone_before_its_successor_is_created(plane, kube, namespace):
    # No launcher beats this master: a dead-man switch longer than the test.
    spec = JobSpec(job="grace", model_def="edl.zoo.digits", data="s3://data/digits", epochs=200, batch_size=16,
                   min_trainers=1, max_trainers=2, trainers=1, checkpoint_uri=f"s3://ckpt/{namespace}/grace",
                   launcher_timeout_s=600)
    opts = K8sOptions(namespace=namespace, s3_secret="minio", trainer_cpu="1", trainer_memory="1Gi",
                      image=plane.image("runtime"), trainer_image=plane.image("trainer-cpu"))
    cluster = KubeCluster(KubeApi(kube, namespace), spec, opts, owner=None, master_via="pod-ip")
    core = client.CoreV1Api(kube)
    name = cluster.names["master"]
    try:
        cluster.ensure_job()
        old = wait_for(lambda: (p := core.read_namespaced_pod(name, namespace)).status.phase == "Running" and p,
                       120, "the master running")
        pid = wait_for(lambda: plane.container_pid(old, "master"), 60, "the master's process")
        os.kill(pid, signal.SIGSTOP)  # it will not end on SIGTERM: it takes its whole grace period
        seen: list[tuple[str, str, bool]] = []  # (event, uid, the old master's process still running)
        done = threading.Event()

        def follow() -> None:
            w = watch.Watch()
            for ev in w.stream(core.list_namespaced_pod, namespace, field_selector=f"metadata.name={name}",
                               resource_version=old.metadata.resource_version, timeout_seconds=150):
                seen.append((ev["type"], ev["object"].metadata.uid, process_running(pid)))
                if ev["type"] == "ADDED" and ev["object"].metadata.uid != old.metadata.uid or done.is_set():
                    w.stop()

        follower = threading.Thread(target=follow, daemon=True)
        follower.start()
        cluster.recreate_master()
        follower.join(30)
        done.set()
        new = [i for i, (kind, uid, _) in enumerate(seen) if kind == "ADDED" and uid != old.metadata.uid]
        gone = [i for i, (kind, uid, _) in enumerate(seen) if kind == "DELETED" and uid == old.metadata.uid]
        assert new and gone and gone[0] < new[0], seen
        assert not seen[new[0]][2], f"the successor was created while the old master still ran: {seen}"
        assert any(kind == "MODIFIED" and uid == old.metadata.uid for kind, uid, _ in seen[:gone[0]]), seen
        wait_for(cluster.master_alive, 120, "the successor running")
    finally:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, UnboundLocalError):
            pass
        cluster.delete_job()
