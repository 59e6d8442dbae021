"""The plane's real nodes: the upstream kubelet, containerd, runc, the CNI bridge, kube-proxy and
CoreDNS run our images, each node in a network namespace of its own (``tests/plane/node.py``).

Everything is read back as a user of a cluster would (the API, ``kubectl``), or from the node
itself where only the node can tell (its cgroups, its routes).
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
from kubernetes import client

from tests.integration.plane.test_plane import pod, restricted_pod
from tests.plane import images, network, node as node_mod
from tests.waits import wait_for

pytestmark = pytest.mark.timeout(240)


def kubectl(plane, *args: str, timeout: float = 60, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([plane._exe("kubectl"), f"--kubeconfig={plane.admin_kubeconfig}", *args],
                          capture_output=True, text=True, timeout=timeout, **kw)


def digest_reference(plane, name: str) -> str:
    """``REGISTRY/edl-NAME@sha256:...``: the image by the digest its tag names now."""
    return f"{plane.image(name).rsplit(':', 1)[0]}@{plane.digest(name)}"


def finished(core: client.CoreV1Api, ns: str, name: str, timeout_s: float = 90):
    return wait_for(lambda: (x := pod(core, ns, name)) and x.status.phase in ("Succeeded", "Failed") and x,
                    timeout_s, f"pod {name} finished")


def running(core: client.CoreV1Api, ns: str, name: str, timeout_s: float = 90):
    return wait_for(lambda: (x := pod(core, ns, name)) and x.status.phase == "Running"
                    and all(c.ready for c in x.status.container_statuses or [None] if c) and x,
                    timeout_s, f"pod {name} running")


def on(node_name: str, manifest: dict) -> dict:
    manifest["spec"]["nodeName"] = node_name
    return manifest


def test_nodes_are_real_kubelets_with_containerd(plane, kube):
    core = client.CoreV1Api(kube)
    nodes = {n.metadata.name: n for n in core.list_node().items}
    assert sorted(nodes) == ["node-0", "node-1"]
    for i, (name, n) in enumerate(sorted(nodes.items())):
        assert {c.type: c.status for c in n.status.conditions}["Ready"] == "True"
        info = n.status.node_info
        assert info.kubelet_version == "v1.37.2" and info.container_runtime_version.startswith("containerd://1.")
        assert {a.type: a.address for a in n.status.addresses}["InternalIP"] == plane.net.node_ip(i)
        assert n.status.allocatable["cpu"] in ("2", "2000m")


def test_our_image_runs_under_runc_by_digest_with_the_pods_security_context(plane, kube, namespace):
    """Pulled from the plane's registry by digest; run as the image's user, read-only root, no
    capabilities, seccomp RuntimeDefault, in namespaces of its own (PID 1 is the container's)."""
    core = client.CoreV1Api(kube)
    image = digest_reference(plane, "runtime")
    script = ("import os, socket\n"
              "print('uid', os.getuid(), 'pid', os.getpid(), 'host', socket.gethostname())\n"
              "status = dict(l.split(':', 1) for l in open('/proc/self/status').read().splitlines() if ':' in l)\n"
              "print('caps', status['CapEff'].strip(), 'seccomp', status['Seccomp'].strip(),"
              " 'nnp', status['NoNewPrivs'].strip())\n"
              "try:\n    open('/usr/written', 'w')\nexcept OSError as e:\n    print('root', e.strerror)\n")
    manifest = restricted_pod("who", ["python3", "-c", script], image=image)
    manifest["spec"]["containers"][0]["securityContext"].pop("runAsUser")  # the image's own user
    manifest["spec"]["containers"][0]["securityContext"]["readOnlyRootFilesystem"] = True
    core.create_namespaced_pod(namespace, manifest)
    p = finished(core, namespace, "who")
    log = core.read_namespaced_pod_log("who", namespace)
    assert p.status.phase == "Succeeded", log
    assert "uid 10001 pid 1 host who" in log
    assert "caps 0000000000000000 seccomp 2 nnp 1" in log
    assert "root Read-only file system" in log
    cs = p.status.container_statuses[0]
    assert cs.container_id.startswith("containerd://")
    assert cs.image_id.endswith(image.rsplit("@", 1)[1])


def pod_cgroup(plane, p, controller: str) -> Path:
    node = next(n for n in plane.state.nodes if n.name == p.spec.node_name)
    qos = p.status.qos_class.lower()
    base = Path("/sys/fs/cgroup") / controller / node.cgroup_root.lstrip("/") / "kubepods"
    return (base if qos == "guaranteed" else base / qos) / f"pod{p.metadata.uid}"


def test_a_pod_of_one_cpu_is_throttled_to_one_cpu(plane, kube, namespace, runtime_image):
    """Two busy processes in a container limited to 1 CPU: its cgroup's quota is one period, the
    kernel throttles it, and it never gets more than one CPU's time over a window."""
    core = client.CoreV1Api(kube)
    burn = "import multiprocessing as m\ndef f():\n    while True: pass\n[m.Process(target=f).start() for _ in range(2)]\n"
    manifest = restricted_pod("busy", ["python3", "-c", burn], image=runtime_image,
                              resources={"requests": {"cpu": "1", "memory": "128Mi"},
                                         "limits": {"cpu": "1", "memory": "128Mi"}})
    core.create_namespaced_pod(namespace, manifest)
    p = running(core, namespace, "busy")
    cpu, acct = pod_cgroup(plane, p, "cpu"), pod_cgroup(plane, p, "cpuacct")
    assert int((cpu / "cpu.cfs_quota_us").read_text()) == int((cpu / "cpu.cfs_period_us").read_text())

    def throttled() -> int:
        return int(dict(line.split() for line in (cpu / "cpu.stat").read_text().splitlines())["nr_throttled"])

    wait_for(lambda: throttled() > 0, 30, "the pod throttled")
    used0, t0 = int((acct / "cpuacct.usage").read_text()), time.monotonic()
    time.sleep(2)
    used1, t1 = int((acct / "cpuacct.usage").read_text()), time.monotonic()
    assert (used1 - used0) / 1e9 <= 1.1 * (t1 - t0), "the pod used more than its one CPU"


def test_a_container_past_its_memory_limit_is_oom_killed(kube, namespace, runtime_image):
    core = client.CoreV1Api(kube)
    grow = "x = []\nwhile True: x.append(bytearray(16 << 20))\n"
    core.create_namespaced_pod(namespace, restricted_pod(
        "hungry", ["python3", "-c", grow], image=runtime_image,
        resources={"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"memory": "64Mi"}}))
    p = finished(core, namespace, "hungry")
    term = p.status.container_statuses[0].state.terminated
    assert p.status.phase == "Failed" and term.reason == "OOMKilled" and term.exit_code == 137


def test_pods_reach_each_other_and_services_by_name_across_nodes(plane, kube, namespace,
                                                                  runtime_image):
    core = client.CoreV1Api(kube)
    server = restricted_pod("web", ["python3", "-m", "http.server", "8080", "--directory", "/usr/local/bin"],
                            image=runtime_image, restart="Always")
    server["metadata"]["labels"] = {"app": "web"}
    server["spec"]["containers"][0]["readinessProbe"] = {"httpGet": {"path": "/", "port": 8080},
                                                        "periodSeconds": 1}
    core.create_namespaced_pod(namespace, on("node-0", server))
    core.create_namespaced_service(namespace, {
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
        "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]}})
    web = running(core, namespace, "web")
    assert plane.net.owns(web.status.pod_ip) and web.status.host_ip == plane.net.node_ip(0)
    # A new Service answers once kube-proxy has its endpoint (a second or so): the client tries for a while.
    script = ("import urllib.request as u, socket, time\n"
              "def get(url):\n"
              "    deadline = time.monotonic() + 30\n"
              "    while True:\n"
              "        try:\n"
              "            return u.urlopen(url, timeout=10).status\n"
              "        except OSError:\n"
              "            if time.monotonic() > deadline: raise\n"
              "            time.sleep(0.2)\n"
              f"for url in ('http://{web.status.pod_ip}:8080/', 'http://web/', "
              f"'http://web.{namespace}.svc.cluster.local/'):\n"
              "    print(url, get(url))\n"
              "socket.create_connection(('kubernetes.default.svc', 443), timeout=10); print('apiserver reached')\n"
              "try:\n    socket.getaddrinfo('example.com', 80)\nexcept OSError as e:\n    print('outside: no name')\n")
    core.create_namespaced_pod(namespace, on("node-1", restricted_pod("client", ["python3", "-c", script],
                                                                          image=runtime_image)))
    p = finished(core, namespace, "client")
    log = core.read_namespaced_pod_log("client", namespace)
    assert p.status.phase == "Succeeded", log
    assert log.count(" 200") == 3 and "apiserver reached" in log and "outside: no name" in log


def test_kubectl_logs_exec_and_port_forward_reach_the_pod(plane, kube, namespace, runtime_image):
    core = client.CoreV1Api(kube)
    server = restricted_pod("served", ["sh", "-c", "echo serving; exec python3 -m http.server 8080 --directory /etc"],
                            image=runtime_image, restart="Always")
    core.create_namespaced_pod(namespace, server)
    running(core, namespace, "served")
    logs = wait_for(lambda: "serving" in (r := kubectl(plane, "-n", namespace, "logs", "served")).stdout
                    and r, 30, "kubectl logs")
    assert logs.returncode == 0
    ex = kubectl(plane, "-n", namespace, "exec", "served", "--", "cat", "/etc/hostname")
    assert ex.returncode == 0 and ex.stdout.strip() == "served", ex.stderr
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    fwd = subprocess.Popen([plane._exe("kubectl"), f"--kubeconfig={plane.admin_kubeconfig}", "-n",
                            namespace, "port-forward", "pod/served", f"{port}:8080", "--address", "127.0.0.1"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert fwd.stdout is not None and "Forwarding from" in fwd.stdout.readline()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/hostname", timeout=10) as r:
            assert r.read().decode().strip() == "served"
    finally:
        fwd.kill()
        fwd.wait(timeout=10)


def test_no_pod_or_service_address_is_routed_off_the_machine(plane, kube):
    """The host routes its pods' ranges to the nodes over the plane's bridge and blackholes the rest
    of the plane's range (Services, pod ranges of no node); a node has no default route."""
    net = plane.net
    default = network.ip("route", "show", "default", check=False).stdout.split()
    default_dev = default[default.index("dev") + 1] if "dev" in default else None
    pod_route = network.route_of("10.%d.1.77" % net.base)  # node-0's pod range
    assert f"via {net.node_ip(0)} dev {net.bridge}" in pod_route, pod_route
    for address in (net.dns_service_ip, net.kubernetes_service_ip, "10.%d.99.5" % net.base):
        route = network.deciding_route(address)
        assert route == f"blackhole {net.cidr}", (address, route)
        assert network.ip("route", "get", address, check=False).returncode != 0  # the kernel will not send it
        if default_dev:
            assert f"dev {default_dev}" not in network.route_of(address)
    inside = subprocess.run(network.in_netns(net.netns(0), ["ip", "route", "get", "203.0.113.7"]),
                            capture_output=True, text=True)
    assert inside.returncode != 0 and "unreachable" in inside.stderr.lower(), inside
    # kube-proxy's and the kubelet's rules are the nodes' own: the host's rules stay as they were.
    def node_rules() -> str:
        return subprocess.run(network.in_netns(net.netns(0), ["nft", "list", "ruleset"]), capture_output=True,
                              text=True).stdout

    wait_for(lambda: "kube-proxy" in node_rules(), 30, "kube-proxy's first sync of node-0's rules")
    host_rules = subprocess.run(["nft", "list", "ruleset"], capture_output=True, text=True).stdout
    assert "kube-proxy" in node_rules() and "kube-proxy" not in host_rules and "KUBE-" not in host_rules


def test_a_lost_node_goes_not_ready_and_comes_back_when_its_link_is_mended(plane, kube):
    core = client.CoreV1Api(kube)

    def ready() -> str:
        n = core.read_node("node-1")
        return {c.type: c.status for c in n.status.conditions}["Ready"]

    plane.lose_node("node-1")
    try:
        wait_for(lambda: ready() == "Unknown", 60, "node-1 Unknown once its link is cut")
    finally:
        plane.restore_node("node-1")
    wait_for(lambda: ready() == "True", 60, "node-1 Ready once its link is mended")


def test_a_removed_node_leaves_nothing_behind(plane, kube, namespace, runtime_image):
    """Processes, mounts, cgroups, network namespace, veth and routes of a node: all gone with it."""
    core = client.CoreV1Api(kube)
    info = plane.add_node("node-extra", cpu="1", memory="2Gi")
    core.create_namespaced_pod(namespace, on("node-extra", restricted_pod(
        "sleeper", ["sleep", "600"], image=runtime_image, restart="Always")))
    running(core, namespace, "sleeper")
    node_dir = Path(info.dir)
    assert node_mod.mounts_under(node_dir) and node_mod.cgroup_dirs(info.cgroup_root)
    plane.remove_node("node-extra")
    assert node_mod.processes_naming(str(node_dir)) == []
    assert node_mod.mounts_under(node_dir) == []
    assert node_mod.cgroup_dirs(info.cgroup_root) == []
    net = plane.net
    assert net.netns(info.index) not in net.namespaces()
    assert net.veth(info.index) not in net.links()
    assert not [r for r in net.routes() if net.pod_cidr(info.index) in r]
    assert "node-extra" not in {n.metadata.name for n in core.list_node().items}
    # The pod's object outlives its node, as on any cluster (the pod GC deletes it after 40 s): deleted
    # here, the namespace goes at once.
    core.delete_namespaced_pod("sleeper", namespace, grace_period_seconds=0)


def snapshots(plane, node_name: str) -> Path:
    """Where ``node_name``'s snapshotter keeps its images' layers and its containers' own files."""
    return node_mod.snapshots(Path(next(x for x in plane.state.nodes if x.name == node_name).dir))


def image_files(plane, node_name: str, path: str) -> list[Path]:
    """``path`` of an image as it lies in the layers of ``node_name``'s snapshotter."""
    return sorted(snapshots(plane, node_name).glob(f"snapshots/*/fs/{path.lstrip('/')}"))


def own_bytes(root: Path) -> int:
    """The bytes of the regular files under ``root`` that are its own (links not followed)."""
    return sum(f.lstat().st_size for f in root.rglob("*") if f.is_file() and not f.is_symlink())


def test_the_nodes_share_one_copy_of_an_image_and_a_container_changes_only_its_own(plane, kube):
    """edl's images are unpacked once on the machine, and every node's snapshotter takes their layers
    from there: a node's layers are links to the machine's directories, and a new node that pulls
    the runtime image writes a sliver of it (pulled and unpacked per node, 1.3 GB). A container that
    writes to a file of its image gets a copy in its own layer: the file every node shares is untouched."""
    machine = images.unpack_layers(("runtime",))
    plane.add_node("node-share", cpu="1", memory="2Gi")
    try:
        plane.prepull(("runtime",), on=("node-share",))
        for name in ("node-share", "node-0"):
            linked = {Path(os.readlink(fs)) for fs in snapshots(plane, name).glob("snapshots/*/fs") if fs.is_symlink()}
            assert set(machine) <= linked, (name, linked)
        assert own_bytes(snapshots(plane, "node-share")) < 0.01 * sum(map(own_bytes, machine))
        path = "/etc/debian_version"
        ours, theirs = image_files(plane, "node-share", path), image_files(plane, "node-0", path)
        assert ours and theirs, (ours, theirs)
        written_on(plane, kube, "node-share", path, ours, theirs)
    finally:
        plane.remove_node("node-share")
    assert all(d.is_dir() for d in machine)  # the node's removal leaves the machine's copy


def written_on(plane, kube, node: str, path: str, ours: list[Path], theirs: list[Path]) -> None:
    """A container on ``node`` appends to ``path`` of its image: ``ours`` (its node's copies of the file)
    and ``theirs`` (another node's) stay as they were."""
    before = {f: f.read_text() for f in theirs}
    core = client.CoreV1Api(kube)
    name = f"writer-{time.monotonic_ns()}"
    core.create_namespaced_pod("default", on(node, {  # (default: no PodSecurity profile, root allowed)
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"restartPolicy": "Never", "containers": [{
            "name": "c", "image": plane.image("runtime"), "securityContext": {"runAsUser": 0},
            "command": ["sh", "-c", f"echo changed >> {path} && cat {path}"]}]}}))
    try:
        p = finished(core, "default", name)
        assert p.status.phase == "Succeeded", p.status
        assert core.read_namespaced_pod_log(name, "default").rstrip().endswith("changed")
        assert {f: f.read_text() for f in theirs} == before and not any("changed" in f.read_text() for f in ours)
    finally:
        core.delete_namespaced_pod(name, "default", grace_period_seconds=0)
