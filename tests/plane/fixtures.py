"""pytest fixtures over the real control plane: started once per test session, on first use.

- ``plane``: the running ``ControlPlane`` (two nodes of 2 CPU: the upstream kubelet, containerd,
  kube-proxy, CoreDNS: ``node.py``) with its registry of edl's images
  (built from ``images/`` first where missing, ``images.py``; ``plane.image("runtime")`` names
  one; the fixtures ``runtime_image`` and ``trainer_image`` name two), PriorityClasses
  ``edl-low`` and ``edl-high``;
- ``plane_s3``: a MinIO server beside it (on the plane's bridge), and ``s3://data/digits`` prepared on it;
- ``kube``: an admin ``kubernetes.client.ApiClient``;
- ``namespace``: a fresh namespace per test, labelled ``pod-security.kubernetes.io/enforce:
  restricted``, holding edl's RBAC (``edl k8s render``'s objects) and the S3 Secret
  ``minio``; deleted after the test, waiting until every pod of it is gone;
"""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from kubernetes import client, config, utils

from tests.plane import build, images
from tests.plane.node import missing_packages
from tests.plane.plane import PLANES, ControlPlane
from tests.plane.registry import RegistryError
from tests.plane.s3 import MinioServer
from tests.waits import wait_for

PRIORITY_CLASSES = {"edl-low": 100, "edl-high": 100000}
NODES = 2
NODE_CPU, NODE_MEMORY = "2", "8Gi"  # each node at most this machine's cores (its kubelet reports them)


def worker_index() -> int:
    """This pytest-xdist worker's number (``gw3`` is 3); 0 without xdist."""
    return int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw"))


def plane_ip_base() -> int:
    """Each worker's plane its own addresses (``./dev cluster`` keeps base 20, the test of it 200)."""
    return 40 + 20 * worker_index()


def pytest_collection_modifyitems(items) -> None:
    """A test on the plane is timed from its own start (pytest-timeout's ``func_only``): the plane's
    start (built, started, its nodes pulling edl's images: a minute or more on a busy machine) is the session's,
    paid by whichever test of a worker comes first, and keeps deadlines of its own, as the fixtures'
    set-ups and teardowns do (a namespace made and deleted)."""
    for item in items:
        if "plane" in item.fixturenames:
            marker = item.get_closest_marker("timeout")
            seconds = (marker.kwargs.get("timeout", marker.args[0] if marker.args else None)) if marker else None
            item.add_marker(pytest.mark.timeout(seconds, func_only=True), append=False)  # before the test's own


@pytest.fixture(scope="session")
def plane():
    """A plane under ``PLANES`` (built first where missing) with the suite's nodes, edl's images pulled
    into them and its PriorityClasses; stopped and removed after, whatever happened."""
    missing = missing_packages()
    if missing:
        pytest.fail(f"the plane's nodes need Debian's {', '.join(missing)} (./dev installs them as root)")
    try:
        for target in (build.KUBEPLANE, build.COREDNS):
            build.build(target, quiet=True)
        images.build_images(quiet=True)
    except (build.BuildError, images.ImageError, RegistryError) as e:
        pytest.fail(f"the control plane or its images cannot be built: {e}")
    PLANES.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="test-", dir=PLANES))
    p = ControlPlane(root, ip_base=plane_ip_base())
    try:
        p.start()
        for i in range(NODES):
            p.add_node(f"node-{i}", cpu=NODE_CPU, memory=NODE_MEMORY)
        p.prepull()
        sched = client.SchedulingV1Api(config.new_client_from_config(config_file=str(p.admin_kubeconfig)))
        for name, value in PRIORITY_CLASSES.items():
            sched.create_priority_class(client.V1PriorityClass(metadata=client.V1ObjectMeta(name=name), value=value))
        yield p
    finally:
        p.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def runtime_image(plane) -> str:
    """edl's runtime image in the plane's registry."""
    return plane.image("runtime")


@pytest.fixture(scope="session")
def trainer_image(plane) -> str:
    """edl's CPU trainer image in the plane's registry."""
    return plane.image("trainer-cpu")


def built(target: build.Target, what: str) -> Path:
    """``target``'s binary, built where missing (after ``./dev``'s build step: a no-op); a build that fails
    fails the test, naming ``what``."""
    try:
        return build.build(target, quiet=True)
    except build.BuildError as e:
        pytest.fail(f"{what} cannot be built: {e}")


@pytest.fixture(scope="session")
def plane_s3(plane):
    built(build.MINIO, "MinIO")
    server = MinioServer(plane.root / "minio", address=plane.net.host_ip).start()  # where every node's pods reach
    plane.state.pids["minio"] = server.proc.pid  # type: ignore[union-attr]  # stopped with the plane if this run is killed
    plane.state.save()
    try:
        env = {**os.environ, **server.env}
        r = subprocess.run([sys.executable, "-m", "edl", "data", "prepare", "digits", "--out", "s3://data/digits"],
                           capture_output=True, text=True, env=env, timeout=120)
        assert r.returncode == 0, r.stderr
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def kube(plane) -> client.ApiClient:
    return config.new_client_from_config(config_file=str(plane.admin_kubeconfig))


def _ns_name(nodeid: str) -> str:
    return "t-" + hashlib.sha256(f"{nodeid}{time.time_ns()}".encode()).hexdigest()[:10]


@pytest.fixture
def namespace(request, kube, plane_s3):
    from edl.cluster import manifests

    core = client.CoreV1Api(kube)
    name = restricted_namespace(kube, request.node.nodeid)
    apply(kube, manifests.rbac(name), name)
    core.create_namespaced_secret(name, client.V1Secret(
        metadata=client.V1ObjectMeta(name="minio"),
        data={k: base64.b64encode(v.encode()).decode() for k, v in plane_s3.env.items()}))
    yield name
    delete_namespace(kube, name)


def restricted_namespace(kube: client.ApiClient, nodeid: str) -> str:
    """A new namespace under the restricted PodSecurity profile, once its default account exists."""
    core = client.CoreV1Api(kube)
    name = _ns_name(nodeid)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name, labels={
        "pod-security.kubernetes.io/enforce": "restricted", "pod-security.kubernetes.io/enforce-version": "latest",
        "pod-security.kubernetes.io/warn": "restricted"})))
    # The ServiceAccount admission plugin needs the default account, made by a controller (slow to come
    # back after a test stopped the apiserver, on a loaded machine): waited for, then required.
    wait_for(lambda: core.list_namespaced_service_account(name, field_selector="metadata.name=default").items,
             120, f"namespace {name}'s default ServiceAccount", every=0.1)
    return name


def apply(kube: client.ApiClient, objects: list[dict], namespace: str) -> None:
    """Create each object; a cluster-wide one that another test made already is fine."""
    for obj in objects:
        try:
            utils.create_from_dict(kube, obj, namespace=namespace)
        except utils.FailToCreateError as e:
            if not all(getattr(x, "status", None) == 409 for x in e.api_exceptions) or "namespace" in obj["metadata"]:
                raise


def delete_namespace(kube: client.ApiClient, name: str, timeout_s: float = 90) -> None:
    """Delete and wait until every pod of it is gone: no process of this test is left for the next. The
    pods are deleted here at once, not by the namespace controller, which starts only 5 s after the
    namespace's deletion and then waits again for pods still running (5-20 s a test); what the
    terminating namespace still holds takes no room and no new object."""
    core = client.CoreV1Api(kube)
    rbac = client.RbacAuthorizationV1Api(kube)
    for obj in (f"edl-launcher-priorityclasses-{name}",):
        try:
            rbac.delete_cluster_role_binding(obj)
        except client.ApiException:
            pass
    try:
        core.delete_namespace(name)
        core.delete_collection_namespaced_pod(name)  # after the namespace: nothing can create one now
    except client.ApiException as e:
        if e.status != 404:
            raise
    deadline = time.monotonic() + timeout_s
    left: list[str] = []
    while time.monotonic() < deadline:
        # The kubelet removes a pod from the API once its containers have stopped.
        left = [p.metadata.name for p in core.list_namespaced_pod(name).items]
        if not left:
            return
        time.sleep(0.2)
    raise AssertionError(f"pods of namespace {name} not gone after {timeout_s:.0f} s: {left}")
