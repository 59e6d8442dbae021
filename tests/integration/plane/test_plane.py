"""The control plane itself: what edl's Kubernetes tests rely on it to do as a cluster does.

Real apiserver, etcd, scheduler and controller-manager; real nodes (the upstream kubelet on containerd). Each test
reads back through the API only, as a user with kubectl would.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from kubernetes import client

from tests.waits import wait_for

pytestmark = pytest.mark.timeout(180)


def restricted_pod(name: str, command: list[str], *, image: str, restart: str = "Never",
                   env: list[dict] | None = None, resources: dict | None = None, volumes: list[dict] | None = None,
                   mounts: list[dict] | None = None, sa: str | None = None) -> dict:
    """A pod that meets the restricted PodSecurity profile."""
    container = {"name": "main", "image": image, "command": command, "env": env or [],
                 "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
                                     "runAsNonRoot": True, "runAsUser": 10001,
                                     "seccompProfile": {"type": "RuntimeDefault"}},
                 "resources": resources or {"requests": {"cpu": "100m", "memory": "64Mi"}},
                 "volumeMounts": mounts or [], "terminationMessagePolicy": "FallbackToLogsOnError"}
    spec = {"restartPolicy": restart, "containers": [container], "volumes": volumes or [],
            "terminationGracePeriodSeconds": 5}
    if sa:
        spec["serviceAccountName"] = sa
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def pod(core: client.CoreV1Api, ns: str, name: str):
    try:
        return core.read_namespaced_pod(name, ns)
    except client.ApiException as e:
        if e.status == 404:
            return None
        raise


def waiting_reason(p) -> str | None:
    for cs in (p.status.container_statuses or []) if p else []:
        if cs.state.waiting:
            return cs.state.waiting.reason
    return None


def test_nodes_are_ready_and_a_root_pod_is_refused_by_pod_security(kube, namespace, runtime_image):
    core = client.CoreV1Api(kube)
    nodes = core.list_node().items
    assert len(nodes) >= 2
    for n in nodes:
        assert {c.type: c.status for c in n.status.conditions}["Ready"] == "True"
    root = restricted_pod("root", ["true"], image=runtime_image)
    root["spec"]["containers"][0]["securityContext"] = {"runAsUser": 0}
    with pytest.raises(client.ApiException) as e:
        core.create_namespaced_pod(namespace, root)
    assert e.value.status == 403 and "violates PodSecurity" in e.value.body


def test_a_pod_of_our_image_runs_succeeds_and_its_log_reads_back(plane, kube, namespace, runtime_image):
    core = client.CoreV1Api(kube)
    env = [{"name": "WHO", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
           {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
           {"name": "KEY", "valueFrom": {"secretKeyRef": {"name": "minio", "key": "AWS_ACCESS_KEY_ID"}}}]
    core.create_namespaced_pod(namespace, restricted_pod(
        "hello", ["sh", "-c", "echo hello $(WHO) at $IP; hostname; echo key=$KEY; edl --help | head -1"], env=env, image=runtime_image))
    p = wait_for(lambda: (x := pod(core, namespace, "hello")) and x.status.phase == "Succeeded" and x, 60,
                 "Succeeded")
    assert p.spec.node_name.startswith("node-")  # bound by the real scheduler
    assert plane.owns_pod_ip(p.status.pod_ip, p.spec.node_name)
    log = core.read_namespaced_pod_log("hello", namespace)
    assert f"hello hello at {p.status.pod_ip}" in log
    assert "\nhello\n" in log  # the pod's hostname is its name
    assert "key=edl-test" in log and "usage: edl" in log
    assert core.read_namespaced_pod_log("hello", namespace, tail_lines=1).strip().startswith("usage: edl")


def test_a_pod_runs_under_its_service_accounts_rbac(kube, namespace, runtime_image):
    """The token from the TokenRequest API at the in-cluster path: the default account may not list
    pods, edl-launcher may."""
    core = client.CoreV1Api(kube)
    script = ("import kubernetes as k; k.config.load_incluster_config(); "
              "api = k.client.CoreV1Api()\n"
              "try:\n    api.list_namespaced_pod('%s'); print('listed')\n"
              "except k.client.ApiException as e:\n    print('refused', e.status)\n") % namespace
    core.create_namespaced_pod(namespace, restricted_pod("default-sa", ["python", "-c", script], image=runtime_image))
    core.create_namespaced_pod(namespace, restricted_pod("launcher-sa", ["python", "-c", script], sa="edl-launcher", image=runtime_image))
    for name, expect in (("default-sa", "refused 403"), ("launcher-sa", "listed")):
        wait_for(lambda: (x := pod(core, namespace, name)) and x.status.phase in ("Succeeded", "Failed"), 60, name)
        assert expect in core.read_namespaced_pod_log(name, namespace), name


def test_waiting_reasons_crash_loop_image_pull_and_missing_secret(kube, namespace, runtime_image):
    core = client.CoreV1Api(kube)
    core.create_namespaced_pod(namespace, restricted_pod("crash", ["sh", "-c", "echo boom; exit 3"],
                                                         restart="Always", image=runtime_image))
    core.create_namespaced_pod(namespace, restricted_pod("noimage", ["true"], image="registry.example/nope:1"))
    core.create_namespaced_pod(namespace, restricted_pod("nosecret", ["true"], env=[
        {"name": "X", "valueFrom": {"secretKeyRef": {"name": "minio", "key": "NO_SUCH_KEY"}}}], image=runtime_image))
    p = wait_for(lambda: (x := pod(core, namespace, "crash")) and waiting_reason(x) == "CrashLoopBackOff" and x, 60,
                 "CrashLoopBackOff")
    cs = p.status.container_statuses[0]
    assert cs.restart_count >= 1 and cs.last_state.terminated.exit_code == 3
    assert "boom" in cs.last_state.terminated.message
    assert p.status.phase == "Running"
    assert core.read_namespaced_pod_log("crash", namespace, previous=True).strip() == "boom"
    wait_for(lambda: waiting_reason(pod(core, namespace, "noimage")) == "ImagePullBackOff", 60, "ImagePullBackOff")
    p = wait_for(lambda: (x := pod(core, namespace, "nosecret"))
                 and waiting_reason(x) == "CreateContainerConfigError" and x, 60, "CreateContainerConfigError")
    assert "NO_SUCH_KEY" in p.status.container_statuses[0].state.waiting.message


def test_graceful_deletion_sigterm_then_sigkill_after_the_grace_period(kube, namespace, runtime_image):
    core = client.CoreV1Api(kube)
    trap = "trap 'echo got TERM' TERM; while true; do sleep 0.1; done"
    core.create_namespaced_pod(namespace, restricted_pod("stubborn", ["sh", "-c", trap], image=runtime_image))
    wait_for(lambda: (x := pod(core, namespace, "stubborn")) and x.status.phase == "Running", 60, "Running")
    time.sleep(0.5)
    t0 = time.monotonic()
    core.delete_namespaced_pod("stubborn", namespace, grace_period_seconds=3)
    assert pod(core, namespace, "stubborn").metadata.deletion_timestamp is not None  # Terminating, not gone
    wait_for(lambda: pod(core, namespace, "stubborn") is None, 30, "the final delete")
    took = time.monotonic() - t0
    assert 2.5 <= took < 15, took


def test_a_container_over_its_memory_limit_is_oom_killed(kube, namespace, runtime_image):
    core = client.CoreV1Api(kube)
    hog = "x = bytearray(400 * 2**20); import time; time.sleep(60)"
    core.create_namespaced_pod(namespace, restricted_pod(
        "hog", ["python", "-c", hog], resources={"requests": {"cpu": "100m", "memory": "100Mi"},
                                                 "limits": {"memory": "200Mi"}}, image=runtime_image))
    p = wait_for(lambda: (x := pod(core, namespace, "hog")) and x.status.phase == "Failed" and x, 60, "Failed")
    term = p.status.container_statuses[0].state.terminated
    assert (term.reason, term.exit_code) == ("OOMKilled", 137)


def test_an_empty_dir_over_its_size_limit_gets_the_pod_evicted(kube, namespace, runtime_image):
    core = client.CoreV1Api(kube)
    fill = "head -c 3000000 /dev/zero > /scratch/blob; sleep 60"
    core.create_namespaced_pod(namespace, restricted_pod(
        "filler", ["sh", "-c", fill], volumes=[{"name": "scratch", "emptyDir": {"sizeLimit": "2Mi"}}],
        mounts=[{"name": "scratch", "mountPath": "/scratch"}], image=runtime_image))
    p = wait_for(lambda: (x := pod(core, namespace, "filler")) and x.status.phase == "Failed" and x, 60, "evicted")
    assert p.status.reason == "Evicted" and 'EmptyDir volume "scratch"' in p.status.message


def test_service_names_resolve_to_a_ready_pod(kube, namespace, runtime_image):
    core = client.CoreV1Api(kube)
    server = restricted_pod("web", ["python", "-c", (
        "import http.server, os; http.server.HTTPServer((os.environ['IP'], 8080), "
        "http.server.SimpleHTTPRequestHandler).serve_forever()")],
        env=[{"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}], image=runtime_image)
    server["metadata"]["labels"] = {"app": "web"}
    server["spec"]["containers"][0]["readinessProbe"] = {"tcpSocket": {"port": 8080}, "periodSeconds": 1}
    core.create_namespaced_pod(namespace, server)
    core.create_namespaced_service(namespace, {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
                                               "spec": {"selector": {"app": "web"},
                                                        "ports": [{"port": 8080, "targetPort": 8080}]}})
    wait_for(lambda: (x := pod(core, namespace, "web")) and x.status.conditions and any(
        c.type == "Ready" and c.status == "True" for c in x.status.conditions), 60, "web Ready")
    fetch = f"python -c \"import urllib.request as u; print(u.urlopen('http://web.{namespace}.svc:8080/').status)\""
    core.create_namespaced_pod(namespace, restricted_pod("client", ["sh", "-c", f"sleep 1.5; {fetch}"], image=runtime_image))
    wait_for(lambda: (x := pod(core, namespace, "client")) and x.status.phase in ("Succeeded", "Failed"), 60, "client")
    assert core.read_namespaced_pod_log("client", namespace).strip().endswith("200")


def test_a_lost_node_goes_unknown_and_its_pods_are_evicted_but_stay_terminating(plane, kube, namespace, runtime_image):
    core = client.CoreV1Api(kube)
    plane.add_node("node-lost", cpu="1", memory="4Gi")
    try:
        plane.prepull(("runtime",), on=("node-lost",))  # the machine's copy of the image, not 1 GB more
        p = restricted_pod("stranded", ["sleep", "600"], image=runtime_image)
        p["spec"]["nodeSelector"] = {"kubernetes.io/hostname": "node-lost"}
        core.create_namespaced_pod(namespace, p)
        wait_for(lambda: (x := pod(core, namespace, "stranded")) and x.status.phase == "Running", 60, "Running")
        plane.lose_node("node-lost")
        ready = lambda: {c.type: c.status for c in core.read_node("node-lost").status.conditions}["Ready"]  # noqa: E731
        wait_for(lambda: ready() == "Unknown", 30, "the node lifecycle controller to mark it Unknown")
        taints = [t.key for t in core.read_node("node-lost").spec.taints or []]
        assert "node.kubernetes.io/unreachable" in taints
        # Evicted after the default toleration, but nobody on the node confirms: Terminating, still Running.
        x = wait_for(lambda: (y := pod(core, namespace, "stranded")) and y.metadata.deletion_timestamp and y, 60,
                     "the taint eviction")
        assert x.status.phase == "Running"
        time.sleep(2)
        assert pod(core, namespace, "stranded") is not None
        plane.restore_node("node-lost")  # it answers again: its kubelet finishes the deletion
        wait_for(lambda: pod(core, namespace, "stranded") is None, 60, "the deletion to complete")
    finally:
        plane.restore_node("node-lost")
        plane.remove_node("node-lost")


def test_the_trainer_image_imports_paddle_as_uid_10001_on_a_read_only_root(kube, namespace, trainer_image):
    """Our trainer image, built from images/trainer-cpu, pulled from the plane's registry: Paddle and
    edl import as the image's user, with nothing writable but the /tmp volume."""
    core = client.CoreV1Api(kube)
    check = ("import os, paddle, edl; print('uid', os.getuid(), 'paddle', paddle.__version__)\n"
             "try:\n    open('/etc/edl-probe', 'w')\nexcept OSError as e:\n    print('root', e.strerror)\n"
             "open('/tmp/probe', 'w').write('ok'); print('tmp writable')")
    p = restricted_pod("paddle", ["python", "-c", check], image=trainer_image,
                       volumes=[{"name": "tmp", "emptyDir": {}}], mounts=[{"name": "tmp", "mountPath": "/tmp"}])
    p["spec"]["containers"][0]["securityContext"]["readOnlyRootFilesystem"] = True
    del p["spec"]["containers"][0]["securityContext"]["runAsUser"]  # the image's USER 10001
    core.create_namespaced_pod(namespace, p)
    x = wait_for(lambda: (y := pod(core, namespace, "paddle")) and y.status.phase in ("Succeeded", "Failed") and y,
                 120, "the trainer image's pod to finish")
    log = core.read_namespaced_pod_log("paddle", namespace)
    assert x.status.phase == "Succeeded", log
    assert "uid 10001 paddle 3.3.1" in log and "root Read-only file system" in log and "tmp writable" in log
    assert x.status.container_statuses[0].image_id.startswith(trainer_image.rsplit(":", 1)[0] + "@sha256:")


def test_a_container_sees_its_image_not_the_host(kube, namespace, runtime_image):
    """Nothing a container runs comes from the host: the checkout, and the host's Python, are not there."""
    core = client.CoreV1Api(kube)
    here = str(Path(__file__).resolve().parents[3])
    core.create_namespaced_pod(namespace, restricted_pod(
        "isolated", ["sh", "-c", f"ls {here}; echo exit=$?; command -v edl"], image=runtime_image))
    wait_for(lambda: (y := pod(core, namespace, "isolated")) and y.status.phase in ("Succeeded", "Failed"), 60,
             "the pod to finish")
    log = core.read_namespaced_pod_log("isolated", namespace)
    assert "No such file or directory" in log and "exit=2" in log, log
    assert "/usr/local/bin/edl" in log  # the image's own edl, installed by its Dockerfile


def test_an_image_the_registry_does_not_have_is_err_image_pull(kube, namespace, plane):
    core = client.CoreV1Api(kube)
    missing = f"{plane.state.registry}/edl-no-such-image:0.0.1"
    core.create_namespaced_pod(namespace, restricted_pod("missing", ["true"], image=missing))
    p = wait_for(lambda: (x := pod(core, namespace, "missing"))
                 and waiting_reason(x) in ("ErrImagePull", "ImagePullBackOff") and x, 60, "ErrImagePull")
    assert missing in p.status.container_statuses[0].state.waiting.message
