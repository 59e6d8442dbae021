"""Start and stop the control plane: etcd, kube-apiserver, kube-controller-manager, kube-scheduler
(the real binaries, see ``build.py``), and its nodes (``node.py``: containerd, the upstream
kubelet and kube-proxy in a network namespace each; CoreDNS for the cluster).

The plane's servers listen on the host's side of its bridge (``network.py``: ``10.B.0.1``, a local
address that its nodes reach too), on free ports, with their state and logs under one root
directory. The set-up follows controller-runtime's envtest, plus the controller-manager and
the scheduler, short node-lifecycle timings so that a lost node is noticed in seconds, and
the Node authorizer with NodeRestriction so that each kubelet acts as its own node.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import yaml

from tests.plane import build, images, pki
from tests.plane.network import PlaneNet
from tests.plane.node import NodeSpec, RealNode, teardown
from tests.plane.procs import free_port, stop_pid
from tests.plane.registry import Registry

if TYPE_CHECKING:
    import httpx

# Where planes keep their state. Not under /tmp: containers bind-mount their volumes over paths
# such as /tmp, which would hide the kubelet's own directories from the mounts that follow.
PLANES = Path("/var/lib/edl-kubeplane")
NODE_GRACE_S = 6  # node-monitor-grace-period: a node whose lease is this old is NotReady/Unknown
TOLERATION_S = 10  # default not-ready/unreachable toleration: pods leave a lost node after this


def wait_established(kubectl: list[str], what: str, timeout_s: float = 60.0) -> None:
    """Until every CRD is Established. ``kubectl wait`` fails at once, rather than waiting, on a CRD
    whose status has no conditions yet (just created), so it is asked again until the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        left = max(1, int(deadline - time.monotonic()))
        r = subprocess.run([*kubectl, "wait", "--for=condition=Established", f"--timeout={left}s", "crd", "--all"],
                   capture_output=True, text=True)
        if r.returncode == 0:
            return
        if time.monotonic() >= deadline:
            raise RuntimeError(f"{what} CRDs not established: {r.stderr.strip()}")
        time.sleep(0.5)


@dataclass
class NodeInfo:
    name: str
    cpu: str
    memory: str
    index: int  # its place in the plane's network
    ip: str  # its address on the plane's bridge
    dir: str  # its containerd, kubelet and configuration
    cgroup_root: str
    pids: dict[str, int] = field(default_factory=dict)  # containerd, kubelet, kube-proxy


@dataclass
class PlaneState:
    """What ``./dev cluster status|down`` and a later process need to find a running plane."""

    root: str
    base: int = 0  # the plane's network is 10.BASE.0.0/16 (network.py)
    apiserver: str = ""
    etcd: str = ""
    s3: str = ""
    registry: str = ""  # HOST:PORT of the registry the kubelets pull from
    pids: dict[str, int] = field(default_factory=dict)
    nodes: list[NodeInfo] = field(default_factory=list)

    def save(self) -> None:
        path = Path(self.root) / "plane.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=1))
        tmp.replace(path)

    @classmethod
    def load(cls, root: Path) -> "PlaneState | None":
        try:
            raw = json.loads((root / "plane.json").read_text())
        except (OSError, ValueError):
            return None
        try:
            raw["nodes"] = [NodeInfo(**n) for n in raw.get("nodes", [])]
            return cls(**raw)
        except TypeError:  # written by an edl whose plane differs (its nodes emulated): not ours to stop
            return None


class ControlPlane:
    def __init__(self, root: Path, bin_dir: Path | None = None, ip_base: int | None = None,
                 node_grace_s: int = NODE_GRACE_S) -> None:
        self.node_grace_s = node_grace_s  # a node's Lease lasts as long
        self.root = root.resolve()
        # The plane's network is 10.BASE.0.0/16 (network.py). Planes running side by side (one per
        # pytest-xdist worker, and ``./dev cluster``) need disjoint bases.
        self.ip_base = ip_base if ip_base is not None else int(os.environ.get("EDL_PLANE_IP_BASE", "20"))
        self.net = PlaneNet(self.ip_base)
        self.bin = bin_dir or build.KUBEPLANE.out_dir()
        self.state = PlaneState(str(self.root), base=self.ip_base)
        self.procs: dict[str, subprocess.Popen] = {}
        self.pki = self.root / "pki"
        self.logs = self.root / "logs"

    # ------------------------------------------------------------ set-up
    def _prepare(self) -> None:
        self.logs.mkdir(parents=True, exist_ok=True)
        ca = pki.Authority(self.pki)
        self.ca = ca.cert
        self.serving = ca.issue("apiserver", "kube-apiserver", server=True,
                                dns=("localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
                                     "kubernetes.default.svc.cluster.local"),
                                ips=("127.0.0.1", self.net.host_ip, self.net.kubernetes_service_ip))
        self.kubelet_client = ca.issue("apiserver-kubelet-client", "kube-apiserver-kubelet-client",
                                       ("system:masters",), client=True)
        self.sa_key, self.sa_pub = pki.signing_key(self.pki)
        self._authority = ca
        self.admin_kubeconfig = self._kubeconfig("admin", "edl-admin", ("system:masters",))
        self._kubeconfig("controller-manager", "system:kube-controller-manager")
        self._kubeconfig("scheduler", "system:kube-scheduler")

    def _kubeconfig(self, stem: str, cn: str, orgs: tuple[str, ...] = (), namespace: str | None = None) -> Path:
        pair = self._authority.issue(stem, cn, orgs, client=True)
        ctx: dict = {"cluster": "kubeplane", "user": stem}
        if namespace:
            ctx["namespace"] = namespace
        cfg = {"apiVersion": "v1", "kind": "Config", "current-context": "kubeplane",
               "clusters": [{"name": "kubeplane", "cluster": {"server": self.state.apiserver,
                                                              "certificate-authority": str(self.ca)}}],
               "users": [{"name": stem, "user": {"client-certificate": str(pair.cert),
                                                 "client-key": str(pair.key)}}],
               "contexts": [{"name": "kubeplane", "context": ctx}]}
        path = self.root / f"{stem}.kubeconfig"
        path.write_text(yaml.safe_dump(cfg))
        return path

    def _spawn(self, name: str, argv: list[str], env: dict | None = None) -> subprocess.Popen:
        log = (self.logs / f"{name}.log").open("ab")
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env={**os.environ, **(env or {})}, start_new_session=True, cwd=self.root)
        log.close()
        self.procs[name] = proc
        self.state.pids[name] = proc.pid
        self.state.save()
        return proc

    def _exe(self, component: str) -> str:
        return str(self.bin / component)

    # ------------------------------------------------------------ components
    def _up(self) -> None:
        """The root and the network (its blackhole route first: before any server or node starts)."""
        self.root.mkdir(parents=True, exist_ok=True)
        self.state.save()  # a plane whose start fails half-way is still found and stopped
        self.net.up()
        self.state.apiserver = f"https://{self.net.host_ip}:{free_port()}"

    def start(self, timeout_s: float = 120) -> "ControlPlane":
        self._up()
        self._prepare()
        self._start_etcd()
        self._start_registry()
        self.start_apiserver(timeout_s)
        common = ["--leader-elect=false", "--secure-port=0", "--v=1"]
        self._spawn("kube-controller-manager", [
            self._exe("kube-controller-manager"), *common,
            f"--kubeconfig={self.root / 'controller-manager.kubeconfig'}",
            f"--service-account-private-key-file={self.sa_key}", f"--root-ca-file={self.ca}",
            "--use-service-account-credentials=true",
            "--node-monitor-period=1s", f"--node-monitor-grace-period={self.node_grace_s}s",
            "--concurrent-gc-syncs=5", "--controllers=*"])
        self._spawn("kube-scheduler", [self._exe("kube-scheduler"), *common,
                                       f"--kubeconfig={self.root / 'scheduler.kubeconfig'}"])
        self._wait(lambda: self._component_ready(), timeout_s, "controller-manager and scheduler")
        return self

    def start_api_only(self, timeout_s: float = 120) -> "ControlPlane":
        """etcd and kube-apiserver alone: for hollow nodes (``bench/control_scale.py``), Node objects no
        kubelet keeps, which a node controller would mark NotReady and a scheduler would place on."""
        self._up()
        self._prepare()
        self._start_etcd()
        self.start_apiserver(timeout_s)
        return self

    def _start_etcd(self) -> None:
        client, peer = free_port(), free_port()
        self.state.etcd = f"http://127.0.0.1:{client}"
        self._spawn("etcd", [
            self._exe("etcd"), "--name=plane", f"--data-dir={self.root / 'etcd'}",
            f"--listen-client-urls={self.state.etcd}", f"--advertise-client-urls={self.state.etcd}",
            f"--listen-peer-urls=http://127.0.0.1:{peer}", f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-cluster=plane=http://127.0.0.1:{peer}", "--unsafe-no-fsync", "--log-level=warn",
            "--quota-backend-bytes=2147483648"])

    def _start_registry(self) -> None:
        """The images (built by ``images.py`` into the cache) served read-only on this plane's port."""
        reg = Registry(images.storage(), self.logs, read_only=True, address=self.net.host_ip).start()
        assert reg.proc is not None
        self.state.registry = reg.host
        self.state.pids["registry"] = reg.proc.pid
        self.state.save()

    def image(self, name: str) -> str:
        """``REGISTRY/edl-NAME:VERSION`` of one of edl's images (``runtime``, ``trainer-cpu``) on this plane."""
        return images.reference(self.state.registry, name)

    def start_apiserver(self, timeout_s: float = 120) -> None:
        port = self.state.apiserver.rsplit(":", 1)[1]
        self._spawn("kube-apiserver", [
            self._exe("kube-apiserver"), f"--etcd-servers={self.state.etcd}",
            f"--bind-address={self.net.host_ip}", f"--advertise-address={self.net.host_ip}", f"--secure-port={port}",
            f"--cert-dir={self.pki}", f"--tls-cert-file={self.serving.cert}",
            f"--tls-private-key-file={self.serving.key}", f"--client-ca-file={self.ca}",
            "--authorization-mode=Node,RBAC",
            # OwnerReferencesPermissionEnforcement as on OpenShift and hardened clusters: setting
            # blockOwnerDeletion needs `update` on the owner's finalizers, which edl's RBAC does not grant.
            "--enable-admission-plugins=NodeRestriction,OwnerReferencesPermissionEnforcement",
            f"--service-cluster-ip-range={self.net.service_cidr}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={self.sa_pub}", f"--service-account-signing-key-file={self.sa_key}",
            f"--kubelet-client-certificate={self.kubelet_client.cert}",
            f"--kubelet-client-key={self.kubelet_client.key}", f"--kubelet-certificate-authority={self.ca}",
            "--kubelet-preferred-address-types=InternalIP",
            f"--default-not-ready-toleration-seconds={TOLERATION_S}",
            f"--default-unreachable-toleration-seconds={TOLERATION_S}",
            "--allow-privileged=false", "--profiling=false", "--v=1"])
        self._wait(lambda: self._get("/readyz") == 200, timeout_s, "kube-apiserver /readyz")

    def stop_apiserver(self) -> None:
        """The API goes away (as in an upgrade or an etcd leader change); the rest keeps running."""
        pid = self.state.pids.pop("kube-apiserver", None)
        if pid:
            stop_pid(pid, 5)
        self.procs.pop("kube-apiserver", None)
        self.state.save()

    def admin_http(self):
        """An httpx client with the admin's certificate (for readiness checks, before any client)."""
        import ssl

        import httpx

        if getattr(self, "_http", None) is None:
            ctx = ssl.create_default_context(cafile=str(self.ca))
            ctx.load_cert_chain(str(self.pki / "admin.crt"), str(self.pki / "admin.key"))
            self._http = httpx.Client(verify=ctx, timeout=2)
        return self._http

    def compact_etcd(self) -> int:
        """Compact etcd's history up to now (the apiserver does so every 5 minutes): a watch from an
        older resourceVersion then gets 410 Gone. Returns the revision compacted to."""
        import httpx

        rev = int(httpx.post(f"{self.state.etcd}/v3/kv/range", json={"key": "AA=="}, timeout=5)
                  .json()["header"]["revision"])
        httpx.post(f"{self.state.etcd}/v3/kv/compaction", json={"revision": str(rev), "physical": True},
                   timeout=10).raise_for_status()
        return rev

    def _get(self, path: str) -> int:
        import httpx

        try:
            return self.admin_http().get(self.state.apiserver + path).status_code
        except httpx.HTTPError:
            return 0

    def _component_ready(self) -> bool:
        for name in ("kube-controller-manager", "kube-scheduler", "etcd"):
            p = self.procs.get(name)
            if p is not None and p.poll() is not None:
                raise RuntimeError(f"{name} exited with {p.returncode}:\n{self.log_tail(name)}")
        # The controller-manager's first act is the root CA ConfigMap in every namespace.
        return self._get("/api/v1/namespaces/default/configmaps/kube-root-ca.crt") == 200

    def _wait(self, pred, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for name, p in self.procs.items():
                if p.poll() is not None and name in ("etcd", "kube-apiserver"):
                    raise RuntimeError(f"{name} exited with {p.returncode}:\n{self.log_tail(name)}")
            if pred():
                return
            time.sleep(0.2)
        raise RuntimeError(f"{what} not ready within {timeout_s:.0f} s:\n{self.log_tail('kube-apiserver')}")

    def log_tail(self, name: str, lines: int = 30) -> str:
        try:
            return "\n".join((self.logs / f"{name}.log").read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    # ------------------------------------------------------------ Argo (test-only, loopback only)
    def start_argo(self, timeout_s: float = 60) -> None:
        """Argo's CRDs (full schemas, so the apiserver validates workflows) and its workflow
        controller, watching every namespace, with the executor built from the same module."""
        import subprocess as sp

        crds = argo_module_dir() / "manifests" / "base" / "crds" / "full"
        kubectl = [self._exe("kubectl"), f"--kubeconfig={self.admin_kubeconfig}"]
        for f in sorted(crds.glob("argoproj.io_*.yaml")):
            r = sp.run([*kubectl, "apply", "--server-side", "-f", str(f)], capture_output=True, text=True)
            if r.returncode != 0:
                raise RuntimeError(f"Argo CRD {f.name}: {r.stderr.strip()}")
        sp.run([*kubectl, "create", "namespace", "argo"], capture_output=True, text=True)
        sp.run([*kubectl, "-n", "argo", "create", "configmap", "workflow-controller-configmap"],
               capture_output=True, text=True)
        wait_established(kubectl, "Argo")
        cfg = self._kubeconfig("argo", "argo-workflow-controller", ("system:masters",), namespace="argo")
        self._spawn("workflow-controller", [
            str(build.ARGO_CONTROLLER.path()), f"--kubeconfig={cfg}",
            f"--executor-image={images.argoexec_reference(self.state.registry)}",
            "--executor-image-pull-policy=IfNotPresent", "--loglevel=info", "--workflow-workers=4"],
            # A running workflow is looked at again after DEFAULT_REQUEUE_TIME (10 s), between its steps
            # too; 1 s as Argo's own end-to-end tests run their controller.
            env={"LEADER_ELECTION_DISABLE": "true", "DEFAULT_REQUEUE_TIME": "1s"})

    # ------------------------------------------------------------ KServe (test-only, loopback only)
    def start_kserve(self, storage_initializer: str, runtime: str, timeout_s: float = 120) -> None:
        """KServe's CRDs and controller in raw-deployment mode (no Knative, no Istio, no ingress), its
        pod webhook (which adds the storage initializer to a predictor's pod) registered by URL with a
        certificate from the plane's CA, and a ClusterServingRuntime ``edl-onnx`` for ONNX models over the
        Open Inference Protocol (v2): the ``runtime`` image running ``edl serve`` on the model directory
        that the ``storage_initializer`` image fills."""
        import subprocess as sp

        import httpx

        kubectl = [self._exe("kubectl"), f"--kubeconfig={self.admin_kubeconfig}"]

        def apply(doc: dict | Path, what: str) -> None:
            source = ["-f", str(doc)] if isinstance(doc, Path) else ["-f", "-"]
            r = sp.run([*kubectl, "apply", "--server-side", *source], capture_output=True, text=True,
                       input=None if isinstance(doc, Path) else json.dumps(doc))
            if r.returncode != 0:
                raise RuntimeError(f"KServe {what}: {r.stderr.strip()}")

        for crd in build.KSERVE_CRDS:
            apply(build.fetch(crd), f"CRD {crd.path().name}")
        wait_established(kubectl, "KServe")
        apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "kserve"}}, "namespace")
        apply(kserve_config(storage_initializer), "inferenceservice-config")
        # The webhook server's certificate, where controller-runtime looks for it (under $TMPDIR).
        tmp = self.root / "kserve-tmp"
        certs = tmp / "k8s-webhook-server" / "serving-certs"
        certs.mkdir(parents=True, exist_ok=True)
        pair = self._authority.issue("kserve-webhook", "kserve-webhook", server=True, ips=("127.0.0.1",))
        (certs / "tls.crt").write_bytes(pair.cert.read_bytes())
        (certs / "tls.key").write_bytes(pair.key.read_bytes())
        webhook, health = free_port(), free_port()
        cfg = self._kubeconfig("kserve", "kserve-controller-manager", ("system:masters",), namespace="kserve")
        proc = self._spawn("kserve-manager", [
            str(build.KSERVE_MANAGER.path()), f"--kubeconfig={cfg}", "--metrics-addr=0",
            f"--health-probe-addr=127.0.0.1:{health}", f"--webhook-port={webhook}", "--zap-log-level=info"],
            env={"POD_NAMESPACE": "kserve", "TMPDIR": str(tmp)})
        deadline = time.monotonic() + timeout_s
        while True:  # ready once its webhook server serves
            if proc.poll() is not None:
                raise RuntimeError(f"KServe's controller exited with {proc.returncode}:\n"
                                   f"{self.log_tail('kserve-manager')}")
            try:
                if httpx.get(f"http://127.0.0.1:{health}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"KServe's controller not ready in {timeout_s:.0f} s:\n"
                                   f"{self.log_tail('kserve-manager')}")
            time.sleep(0.5)
        apply(kserve_webhooks(f"https://127.0.0.1:{webhook}", self.ca.read_bytes()), "webhooks")
        apply(edl_serving_runtime(runtime), "ClusterServingRuntime edl-onnx")

    # ------------------------------------------------------------ nodes
    def add_node(self, name: str, cpu: str = "2", memory: str = "8Gi", wait_s: float = 60) -> NodeInfo:
        """A node (``node.py``): containerd, the kubelet and kube-proxy in a network namespace of
        its own. ``cpu`` and ``memory`` are what it gives pods, at most what this machine has (the
        kubelet reports the machine's capacity; the rest is system-reserved)."""
        if not self.state.pids.get("coredns"):
            self.start_dns()
        used = {n.index for n in self.state.nodes}
        index = min(set(range(len(used) + 1)) - used)
        peers = sorted(used)
        node_ip = self.net.node_ip(index)
        kubeconfig = self._kubeconfig(f"kubelet-{name}", f"system:node:{name}", ("system:nodes",))
        proxy = self.root / "kube-proxy.kubeconfig"
        if not proxy.exists():
            self._kubeconfig("kube-proxy", "system:kube-proxy")
        serving = self._authority.issue(f"kubelet-{name}-serving", f"system:node:{name}", server=True,
                                        ips=(node_ip,))
        node = RealNode(NodeSpec(name, index, cpu, memory), self.root / "nodes" / name, self.net,
                        ca=self.ca, kubeconfig=kubeconfig, proxy_kubeconfig=proxy,
                        serving=(serving.cert, serving.key), registry=self.state.registry,
                        pause_image=images.pause_reference(self.state.registry), bin_dir=self.bin,
                        snapshotter=build.SNAPSHOTTER.path(), layers=images.layers(), logs=self.logs,
                        lease_s=self.node_grace_s)
        info = NodeInfo(name, cpu, memory, index=index, ip=node_ip, dir=str(node.dir), cgroup_root=node.cgroup_root)
        self.state.nodes.append(info)
        self.state.save()  # before anything of it exists: a failed start is still cleaned up
        self.net.add_node(index, peers)
        try:
            node.start()
        finally:
            info.pids = dict(node.pids)
            self.state.save()
        if wait_s:
            self._wait(lambda: self._node_ready(name, node.check), wait_s, f"node {name} Ready")
        return info

    def digest(self, name: str) -> str:
        """``sha256:...``: the manifest digest that edl's image ``name`` is tagged with in this plane's registry."""
        import httpx

        registry, repo_tag = self.image(name).split("/", 1)
        repo, tag = repo_tag.rsplit(":", 1)
        r = httpx.head(f"http://{registry}/v2/{repo}/manifests/{tag}", timeout=10, headers={
            "Accept": "application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.v2+json"})
        r.raise_for_status()
        return r.headers["Docker-Content-Digest"]

    def prepull(self, names: tuple[str, ...] = ("runtime", "trainer-cpu"), timeout_s: float = 600,
                pulled: Callable[[str, float], None] | None = None, on: tuple[str, ...] = ()) -> None:
        """Every node (or those named ``on``) pulls edl's images ``names`` through its kubelet (a pod of
        each, in ``kube-system``, run once and deleted). Their layers are first unpacked once on the
        machine (``images.unpack_layers``, kept between runs), and each node's snapshotter takes them
        from there (``tools/snapshotter``): a node's pull fetches the images' manifests and configs,
        not their layers, and writes nothing of them. ``pulled`` is told each node's name and seconds
        as it is done."""
        from concurrent.futures import ThreadPoolExecutor

        http = self.admin_http()
        # The ServiceAccount admission plugin refuses a pod until its namespace's default account exists.
        self._wait(lambda: self._get("/api/v1/namespaces/kube-system/serviceaccounts/default") == 200, 120,
                   "kube-system's default ServiceAccount")
        images.unpack_layers(names, timeout_s)
        nodes = [n.name for n in self.state.nodes if not on or n.name in on]

        def pull(node: str) -> None:
            t0 = time.monotonic()
            self._pull_on(http, node, names, timeout_s)
            if pulled:
                pulled(node, time.monotonic() - t0)

        with ThreadPoolExecutor(max(1, len(nodes))) as pool:
            for f in [pool.submit(pull, n) for n in nodes]:
                f.result()

    def _pull_on(self, http: httpx.Client, node: str, names: tuple[str, ...], timeout_s: float) -> None:
        """Pods on ``node`` that run edl's images ``names`` once, waited out and deleted."""
        import httpx

        base = f"{self.state.apiserver}/api/v1/namespaces/kube-system/pods"
        pending: dict[str, str] = {}  # pod -> the image it pulls
        for k, name in enumerate(names):
            pod = f"prepull-{node}-{k}"
            body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": pod, "labels": {"edl.dev/prepull": node}},
                    "spec": {"nodeName": node, "restartPolicy": "Never", "terminationGracePeriodSeconds": 0,
                             "containers": [{"name": "c", "image": self.image(name), "command": ["true"]}]}}
            r = http.post(base, json=body, timeout=10)
            if r.status_code not in (201, 409):
                raise RuntimeError(f"pre-pull pod {pod}: {r.status_code} {r.text[:300]}")
            pending[pod] = self.image(name)

        def pulled() -> bool:
            try:
                items = http.get(base, params={"labelSelector": f"edl.dev/prepull={node}"}, timeout=5).json()["items"]
            except (httpx.HTTPError, ValueError, KeyError):
                return False
            for item in items:
                pod, st = item["metadata"]["name"], item.get("status") or {}
                if pod not in pending:
                    continue
                for cs in st.get("containerStatuses") or []:
                    waiting = (cs.get("state") or {}).get("waiting") or {}
                    if waiting.get("reason") in ("ErrImagePull", "ImagePullBackOff", "InvalidImageName"):
                        raise RuntimeError(f"{pod} cannot pull {pending[pod]}: {waiting.get('message')}")
                if st.get("phase") in ("Succeeded", "Failed"):
                    http.delete(f"{base}/{pod}", params={"gracePeriodSeconds": 0}, timeout=10)
                    del pending[pod]
            return not pending

        self._wait(pulled, timeout_s, f"edl's images ({', '.join(names)}) pulled on {node}")

    def start_dns(self, timeout_s: float = 60) -> None:
        """CoreDNS for the real nodes' pods: the Service ``kube-system/kube-dns`` at the plane's DNS
        address, whose one endpoint is CoreDNS on the plane's bridge, answering from the API for
        ``cluster.local`` and for nothing else (it forwards no query: no name past this machine)."""
        from tests.plane.procs import wait_until_answers

        host = self.net.host_ip
        ready = free_port()
        cfg = self._kubeconfig("coredns", "system:coredns", ("system:masters",))
        corefile = self.root / "Corefile"
        corefile.write_text(COREFILE.format(host=host, ready=ready, kubeconfig=cfg, domain=CLUSTER_DOMAIN))
        proc = self._spawn("coredns", [str(build.COREDNS.path()), "-conf", str(corefile)])
        wait_until_answers(proc, f"http://{host}:{ready}/ready", timeout_s, "coredns", self.logs / "coredns.log")
        kubectl = [self._exe("kubectl"), f"--kubeconfig={self.admin_kubeconfig}"]
        ports = [{"name": "dns", "port": 53, "protocol": "UDP"}, {"name": "dns-tcp", "port": 53, "protocol": "TCP"}]
        objects = {"apiVersion": "v1", "kind": "List", "items": [
            {"apiVersion": "v1", "kind": "Service",
             "metadata": {"name": "kube-dns", "namespace": "kube-system", "labels": {"k8s-app": "kube-dns"}},
             "spec": {"clusterIP": self.net.dns_service_ip,
                      "ports": [{**p, "targetPort": 53} for p in ports]}},
            {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
             "metadata": {"name": "kube-dns-coredns", "namespace": "kube-system",
                          "labels": {"kubernetes.io/service-name": "kube-dns",
                                     "endpointslice.kubernetes.io/managed-by": "edl-plane"}},
             "addressType": "IPv4", "endpoints": [{"addresses": [host], "conditions": {"ready": True}}],
             "ports": ports}]}
        r = subprocess.run([*kubectl, "apply", "-f", "-"], input=json.dumps(objects), capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"kube-dns Service: {r.stderr.strip()}")

    def _node_ready(self, name: str, check) -> bool:
        check()
        import httpx

        try:
            node = self.admin_http().get(f"{self.state.apiserver}/api/v1/nodes/{name}").json()
        except (httpx.HTTPError, ValueError):
            return False
        if node.get("kind") != "Node":
            return False
        conds = {c["type"]: c["status"] for c in (node.get("status") or {}).get("conditions") or []}
        taints = [t["key"] for t in (node.get("spec") or {}).get("taints") or []]
        return conds.get("Ready") == "True" and "node.kubernetes.io/not-ready" not in taints

    def owns_pod_ip(self, address: str, node: str) -> bool:
        """``address`` is one that ``node`` gives its pods: in its pod range."""
        import ipaddress

        return ipaddress.ip_address(address) in ipaddress.ip_network(self.net.pod_cidr(self._node(node).index))

    def _node(self, name: str) -> NodeInfo:
        return next(n for n in self.state.nodes if n.name == name)

    def pod_dir(self, node: str, uid: str) -> Path:
        """Where the kubelet of ``node`` keeps the pod's volumes (for tests to look inside)."""
        return Path(self._node(node).dir) / "kubelet" / "pods" / uid

    def pod_volume(self, node: str, uid: str, volume: str) -> Path:
        """The directory of the pod's emptyDir ``volume`` on its node."""
        return self.pod_dir(node, uid) / "volumes" / "kubernetes.io~empty-dir" / volume

    def container_pid(self, pod, container: str) -> int | None:
        """The host's PID of ``container``'s first process in ``pod`` (a V1Pod), ``None`` while it has none."""
        n = self._node(pod.spec.node_name)
        status = next((c for c in pod.status.container_statuses or [] if c.name == container), None)
        if status is None or not status.container_id:
            return None
        state = Path(n.dir) / "runc" / "k8s.io" / status.container_id.split("://", 1)[1] / "state.json"
        try:
            return int(json.loads(state.read_text())["init_process_pid"])
        except (OSError, ValueError, KeyError):
            return None

    def lose_node(self, name: str) -> None:
        """The node stops answering: its link is cut (its processes and containers run on, reaching
        nothing). The node lifecycle controller does the rest: NotReady/Unknown, taints, evictions."""
        self.net.cut(self._node(name).index)

    def restore_node(self, name: str) -> None:
        """The lost node answers again: its kubelet catches up with what happened."""
        self.net.mend(self._node(name).index)

    def remove_node(self, name: str) -> None:
        """Stop the node (its pods with it), leave nothing of it, and delete the Node object."""
        node = self._node(name)
        teardown(Path(node.dir), node.cgroup_root, node.pids)
        self.net.remove_node(node.index, [n.index for n in self.state.nodes if n is not node])
        self.admin_http().delete(f"{self.state.apiserver}/api/v1/nodes/{name}")
        self.state.nodes.remove(node)
        self.state.save()

    # ------------------------------------------------------------ teardown
    def stop(self) -> None:
        stop_all(self.state)
        self.procs.clear()


def argo_module_dir() -> Path:
    """Argo's module in the Go module cache (for its CRDs), as tools/argo pins it."""
    r = subprocess.run([build.go_binary(), "list", "-m", "-json", "github.com/argoproj/argo-workflows/v4"],
                       cwd=build.TOOLS / "argo", capture_output=True, text=True, check=True)
    return Path(json.loads(r.stdout)["Dir"])


CLUSTER_DOMAIN = "cluster.local"
# CoreDNS on the plane's bridge: the cluster's names from the API, nothing forwarded.
COREFILE = """\
.:53 {{
    bind {host}
    errors
    ready {host}:{ready}
    kubernetes {domain} in-addr.arpa ip6.arpa {{
        kubeconfig {kubeconfig} kubeplane
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 5
    }}
    cache 5
}}
"""

KSERVE_RUNTIME = "edl-onnx"  # the ClusterServingRuntime for edl's ONNX exports


def kserve_config(storage_initializer: str) -> dict:
    """KServe's ``inferenceservice-config``: raw deployments, no ingress, our storage initializer; the rest
    as KServe's own install sets it (S3 credentials under AWS_* keys, as the deploy step's Secret has)."""
    quantities = {"memoryRequest": "100Mi", "memoryLimit": "1Gi", "cpuRequest": "100m", "cpuLimit": "1"}
    data = {
        "deploy": {"defaultDeploymentMode": "RawDeployment"},
        "ingress": {"ingressGateway": "kserve/kserve-ingress-gateway", "ingressDomain": "example.com",
                    "urlScheme": "http", "disableIstioVirtualHost": True, "disableIngressCreation": True,
                    "enableGatewayApi": False},
        "storageInitializer": {"image": storage_initializer, **quantities, "cpuModelcar": "10m",
                               "memoryModelcar": "15Mi", "caBundleConfigMapName": "", "enableModelcar": False},
        "credentials": {"storageSpecSecretName": "storage-config",
                        "storageSecretNameAnnotation": "serving.kserve.io/storageSecretName",
                        "s3": {"s3AccessKeyIDName": "AWS_ACCESS_KEY_ID",
                               "s3SecretAccessKeyName": "AWS_SECRET_ACCESS_KEY"}},
        # Read by the pod webhook for every predictor pod, though nothing here asks for a logger, batcher
        # or agent: their images are never started.
        "logger": {"image": "kserve/agent:v0.16.0", **quantities, "defaultUrl": "http://default-broker"},
        "batcher": {"image": "kserve/agent:v0.16.0", **quantities, "maxBatchSize": "32", "maxLatency": "5000"},
        "agent": {"image": "kserve/agent:v0.16.0", **quantities},
    }
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "inferenceservice-config", "namespace": "kserve"},
            "data": {k: json.dumps(v) for k, v in data.items()}}


def kserve_webhooks(url: str, ca: bytes) -> dict:
    """KServe's pod webhook (the storage initializer, its S3 credentials, /mnt/models) and the
    InferenceService defaulter, by URL: the controller runs beside the plane, not in it."""
    import base64

    def hook(name: str, path: str, rules: dict, **extra) -> dict:
        return {"name": name, "clientConfig": {"url": url + path, "caBundle": base64.b64encode(ca).decode()},
                "rules": [rules], "failurePolicy": "Fail", "sideEffects": "None",
                "admissionReviewVersions": ["v1beta1"], **extra}

    return {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": "kserve-webhooks"},
            "webhooks": [
                hook("inferenceservice.kserve-webhook-server.defaulter", "/mutate-serving-kserve-io-v1beta1-inferenceservice",
                     {"apiGroups": ["serving.kserve.io"], "apiVersions": ["v1beta1"], "resources": ["inferenceservices"],
                      "operations": ["CREATE", "UPDATE"]}),
                hook("inferenceservice.kserve-webhook-server.pod-mutator", "/mutate-pods",
                     {"apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"], "operations": ["CREATE"]},
                     objectSelector={"matchExpressions": [
                         {"key": "serving.kserve.io/inferenceservice", "operator": "Exists"}]},
                     reinvocationPolicy="IfNeeded"),
            ]}


def edl_serving_runtime(image: str) -> dict:
    """ONNX models over the Open Inference Protocol (v2), served by ``edl serve`` (KServe's model server with
    ONNX Runtime) from what KServe's storage initializer fetches: an exported model directory, or the deploy
    step's repository (``NAME/1/model.onnx``). Bound to the
    pod's own address: the plane's pods share the machine's network, and a rollover runs two predictors."""
    return {"apiVersion": "serving.kserve.io/v1alpha1", "kind": "ClusterServingRuntime",
            "metadata": {"name": KSERVE_RUNTIME},
            "spec": {"supportedModelFormats": [{"name": "onnx", "version": "1", "autoSelect": True, "priority": 10}],
                     "protocolVersions": ["v2"],
                     "containers": [{"name": "kserve-container", "image": image,
                                     "args": ["serve", "/mnt/models", "--name", "{{.Name}}", "--port", "8080",
                                              "--host", "$(POD_IP)"],
                                     "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
                                     "ports": [{"containerPort": 8080, "protocol": "TCP"}]}]}}


def stop_all(state: PlaneState) -> None:
    """Stop every process of a plane: its nodes first (with their pods' containers, mounts and
    cgroups), then the rest, and last the plane's network."""
    for node in state.nodes:
        teardown(Path(node.dir), node.cgroup_root, node.pids)
    for name in ("kserve-manager", "workflow-controller", "minio", "coredns", "registry", "kube-scheduler",
                 "kube-controller-manager", "kube-apiserver", "etcd"):
        pid = state.pids.get(name)
        if pid:
            # A short grace: nothing of the plane is kept (Argo's controller would take all of 10 s).
            stop_pid(pid, 2)
    if state.base:
        PlaneNet(state.base).down()
    state.pids.clear()
    state.save()
