"""A real node of the plane: containerd, the upstream kubelet and kube-proxy in a network namespace
of their own (``network.py``), running pods with runc and the CNI bridge.

Per node, under ``ROOT/nodes/NAME``: containerd's root and state, its socket and configuration
(the plane's registry over plain HTTP by ``hosts.toml``, the sandbox image ``pause`` from it, CNI
from Debian's containernetworking-plugins with the node's pod range), its snapshotter
(``tools/snapshotter``: edl's image layers from the machine's one unpacked copy), the kubelet's root,
pod logs and configuration, kube-proxy's configuration, and a cgroup root ``/edlB-NAME`` in every
cgroup v1 hierarchy. The kubelet acts as its node with a client certificate from the plane's CA.

What this host needs of them, and what it cannot give:
- cgroup v1 only: the kubelet runs with ``failCgroupV1: false`` and the cgroupfs driver;
- root here lacks CAP_SYS_RESOURCE, so containerd restricts oom_score_adj
  (``restrict_oom_score_adj``) and the kubelet leaves its own (``oomScoreAdj: 0``);
- no AppArmor or SELinux on this kernel: containerd runs with both off.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from tests.plane.network import PlaneNet, in_netns
from tests.plane.procs import stop_pid

SHIM_SOCKETS = "/run/containerd/s"
CNI_BIN = Path("/usr/lib/cni")
NODE_PACKAGES = {"containerd": "containerd", "runc": "runc", "nsenter": "util-linux", "nft": "nftables",
                 "conntrack": "conntrack"}
SNAPSHOTTER = "edl"  # the proxy plugin's name: tools/snapshotter, one process a node
CLUSTER_DOMAIN = "cluster.local"

# containerd 1.6's own format. Only what a node of the plane needs: its root, state and sockets, the CRI
# plugin with runc (cgroupfs), the sandbox image from the plane's registry, CNI, the registry's hosts.toml.
CONTAINERD_CONFIG = """\
version = 2
root = "{root}"
state = "{state}"
disabled_plugins = ["io.containerd.internal.v1.opt", "io.containerd.snapshotter.v1.btrfs",
                    "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper",
                    "io.containerd.snapshotter.v1.aufs", "io.containerd.tracing.processor.v1.otlp"]

[grpc]
  address = "{socket}"

[ttrpc]
  address = "{ttrpc}"

[debug]
  level = "warn"

[metrics]
  address = ""

[proxy_plugins]
  [proxy_plugins.{snapshotter_name}]
    type = "snapshot"
    address = "{snapshotter}"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{pause}"
  restrict_oom_score_adj = true
  disable_apparmor = true
  enable_selinux = false
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  netns_mounts_under_state_dir = true

  [plugins."io.containerd.grpc.v1.cri".containerd]
    # containerd's overlay snapshotter, served by tools/snapshotter: a layer the machine has unpacked
    # already (edl's images, images.unpack_layers) is taken from there, found by the layer digest the
    # CRI plugin passes it in the snapshot's labels; any other layer is pulled and unpacked as usual.
    snapshotter = "{snapshotter_name}"
    disable_snapshot_annotations = false
    default_runtime_name = "runc"
    # A pulled layer is kept once, unpacked.
    discard_unpacked_layers = true

    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"

      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "{runc_root}"

  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{cni_bin}"
    conf_dir = "{cni_conf}"
    max_conf_num = 1

  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "{certs}"
"""


class NodeError(RuntimeError):
    pass


def missing_packages() -> list[str]:
    """Debian packages a real node needs that this machine lacks."""
    import shutil

    out = sorted({pkg for cmd, pkg in NODE_PACKAGES.items() if shutil.which(cmd) is None})
    if not (CNI_BIN / "bridge").exists():
        out.append("containernetworking-plugins")
    return out


def machine_capacity() -> tuple[int, int]:
    """This machine's cores and memory in bytes: what every real node's kubelet reports as its capacity."""
    mem_kib = int(Path("/proc/meminfo").read_text().split("MemTotal:")[1].split()[0])
    return os.cpu_count() or 1, mem_kib * 1024


def snapshots(node_dir: Path) -> Path:
    """Where a node's snapshotter keeps its snapshots (one directory each; a layer taken from the
    machine's copy is a link to it). Named as containerd names its own snapshotters' roots, where the
    CRI plugin looks for the image filesystem it reports to the kubelet."""
    return node_dir / f"containerd/root/io.containerd.snapshotter.v1.{SNAPSHOTTER}"


def cgroup_hierarchies() -> list[Path]:
    """The mounted cgroup v1 hierarchies (cpu, memory, pids, ...), not the unified one."""
    out = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        dev, mnt, fstype, *_ = line.split()
        if fstype == "cgroup":
            out.append(Path(mnt))
    return out


@dataclass
class NodeSpec:
    name: str
    index: int
    cpu: str  # what the kubelet may hand to pods: capacity less system-reserved
    memory: str


class RealNode:
    """One node: ``start()`` brings it to Ready; ``stop()`` leaves nothing of it behind."""

    def __init__(self, spec: NodeSpec, root: Path, net: PlaneNet, *, ca: Path,
                 kubeconfig: Path, proxy_kubeconfig: Path, serving: tuple[Path, Path], registry: str,
                 pause_image: str, bin_dir: Path, snapshotter: Path, layers: Path, logs: Path,
                 lease_s: int) -> None:
        self.spec = spec
        self.lease_s = lease_s  # its Lease lasts as long as the node controller's grace; renewed every quarter
        self.dir = root
        self.net = net
        self.ca = ca
        self.kubeconfig = kubeconfig
        self.proxy_kubeconfig = proxy_kubeconfig
        self.serving = serving
        self.registry = registry
        self.pause_image = pause_image
        self.bin = bin_dir
        self.snapshotter = snapshotter
        self.layers = layers
        self.logs = logs
        self.pids: dict[str, int] = {}
        self._procs: dict[str, subprocess.Popen] = {}

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def netns(self) -> str:
        return self.net.netns(self.spec.index)

    @property
    def ip(self) -> str:
        return self.net.node_ip(self.spec.index)

    @property
    def cgroup_root(self) -> str:
        return f"/edl{self.net.base}-{self.name}"

    @property
    def socket(self) -> Path:
        return self.dir / "containerd.sock"

    @property
    def snapshotter_socket(self) -> Path:
        return self.dir / "snapshotter.sock"

    # ------------------------------------------------------------ configuration
    def _write_configs(self) -> None:
        d = self.dir
        for sub in ("containerd/root", "containerd/state", "cni/net.d", "cni/ipam", "kubelet", "pod-logs",
                    "volume-plugins", f"certs.d/{self.registry}"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        (d / "containerd.toml").write_text(CONTAINERD_CONFIG.format(
            root=d / "containerd/root", state=d / "containerd/state", socket=self.socket,
            ttrpc=d / "containerd.ttrpc.sock", pause=self.pause_image, runc_root=d / "runc", cni_bin=CNI_BIN,
            cni_conf=d / "cni/net.d", certs=d / "certs.d", snapshotter_name=SNAPSHOTTER,
            snapshotter=self.snapshotter_socket))
        (d / "certs.d" / self.registry / "hosts.toml").write_text(
            f'server = "http://{self.registry}"\n\n[host."http://{self.registry}"]\n'
            f'  capabilities = ["pull", "resolve"]\n')
        conf = {"cniVersion": "1.0.0", "name": "edl", "plugins": [
            {"type": "bridge", "bridge": "cni0", "isGateway": True, "ipMasq": False, "hairpinMode": True,
             "ipam": {"type": "host-local", "dataDir": str(d / "cni/ipam"),
                      "ranges": [[{"subnet": self.net.pod_cidr(self.spec.index)}]],
                      "routes": [{"dst": "0.0.0.0/0"}]}},
            {"type": "portmap", "capabilities": {"portMappings": True}}]}
        (d / "cni/net.d/10-edl.conflist").write_text(json.dumps(conf, indent=1))
        kubelet = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
            "address": self.ip, "port": 10250, "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1", "healthzPort": 10248,
            "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True},
                               "x509": {"clientCAFile": str(self.ca)}},
            "authorization": {"mode": "Webhook"},
            "tlsCertFile": str(self.serving[0]), "tlsPrivateKeyFile": str(self.serving[1]),
            "clusterDomain": CLUSTER_DOMAIN, "clusterDNS": [self.net.dns_service_ip],
            "resolvConf": "",  # pods get the cluster's DNS and no other: nothing resolves past this machine
            "cgroupDriver": "cgroupfs", "cgroupRoot": self.cgroup_root, "failCgroupV1": False,
            "failSwapOn": False, "oomScoreAdj": 0,
            "containerRuntimeEndpoint": f"unix://{self.socket}",
            "podLogsDir": str(d / "pod-logs"), "volumePluginDir": str(d / "volume-plugins"),
            "nodeLeaseDurationSeconds": self.lease_s, "nodeStatusReportFrequency": "10s",
            "nodeStatusUpdateFrequency": "2s", "syncFrequency": "10s",
            "volumeStatsAggPeriod": "5s",  # emptyDir sizes, for the eviction of a pod past its sizeLimit
            "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
            # A full disk is not this test node's business: evict on memory only.
            "evictionHard": {"memory.available": "100Mi", "nodefs.available": "0%", "imagefs.available": "0%",
                             "nodefs.inodesFree": "0%"},
            "systemReserved": self._reserved(),
            "serializeImagePulls": False, "registryPullQPS": 0,
            "shutdownGracePeriod": "0s", "rotateCertificates": False, "serverTLSBootstrap": False,
            "protectKernelDefaults": False, "localStorageCapacityIsolation": True,
        }
        (d / "kubelet.yaml").write_text(yaml.safe_dump(kubelet))
        proxy = {
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1", "kind": "KubeProxyConfiguration",
            "clientConnection": {"kubeconfig": str(self.proxy_kubeconfig)},
            "hostnameOverride": self.name, "bindAddress": self.ip, "mode": "nftables",
            "clusterCIDR": self.net.cidr,
            "healthzBindAddress": "127.0.0.1:10256", "metricsBindAddress": "127.0.0.1:10249",
            # 0: leave the host's conntrack sysctls alone (they are not this node's to set).
            "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
            "nodePortAddresses": ["primary"],
        }
        (d / "kube-proxy.yaml").write_text(yaml.safe_dump(proxy))

    def _reserved(self) -> dict[str, str]:
        """What the node keeps from pods so that its allocatable is ``spec.cpu`` and ``spec.memory``
        (never more than the machine has: the kubelet reports the machine's own capacity)."""
        from kubernetes.utils.quantity import parse_quantity

        cores, mem = machine_capacity()
        cpu_left = max(0, cores * 1000 - int(parse_quantity(self.spec.cpu) * 1000))
        mem_left = max(0, mem - int(parse_quantity(self.spec.memory)))
        return {"cpu": f"{cpu_left}m", "memory": str(mem_left)}

    def _make_cgroups(self) -> None:
        for h in cgroup_hierarchies():
            path = h / self.cgroup_root.lstrip("/")
            path.mkdir(exist_ok=True)
            if (h / "cpuset.cpus").exists():  # a new cpuset has no CPUs or memory nodes until given them
                for f in ("cpuset.cpus", "cpuset.mems"):
                    (path / f).write_text((h / f).read_text())

    # ------------------------------------------------------------ processes
    def _spawn(self, name: str, argv: list[str]) -> int:
        log = (self.logs / f"{name}-{self.name}.log").open("ab")
        proc = subprocess.Popen(in_netns(self.netns, argv), stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True, cwd=self.dir)
        log.close()
        self.pids[name] = proc.pid
        self._procs[name] = proc
        return proc.pid

    def check(self) -> None:
        """Raise ``NodeError`` with its log's tail if one of the node's processes has exited."""
        for name, proc in self._procs.items():
            if proc.poll() is not None:
                raise NodeError(f"{name} of node {self.name} exited with {proc.returncode}:\n"
                                f"{tail(self.logs / f'{name}-{self.name}.log')}")

    def start(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        self._write_configs()
        self._make_cgroups()
        self._spawn("snapshotter", [str(self.snapshotter), "serve", str(self.snapshotter_socket),
                                    str(snapshots(self.dir)), str(self.layers)])
        self._wait_for_socket("snapshotter", self.snapshotter_socket)
        self._spawn("containerd", ["containerd", "--config", str(self.dir / "containerd.toml")])
        self._wait_for_socket("containerd", self.socket)
        self._spawn("kubelet", [
            str(self.bin / "kubelet"), f"--config={self.dir / 'kubelet.yaml'}",
            f"--kubeconfig={self.kubeconfig}", f"--root-dir={self.dir / 'kubelet'}",
            f"--hostname-override={self.name}", f"--node-ip={self.ip}",
            "--node-labels=edl.dev/plane-node=real", "--v=1"])
        self._spawn("kube-proxy", [str(self.bin / "kube-proxy"), f"--config={self.dir / 'kube-proxy.yaml'}",
                                   "--v=1"])

    def _wait_for_socket(self, name: str, socket: Path, timeout_s: float = 30) -> None:
        deadline = time.monotonic() + timeout_s
        while not socket.exists():
            self.check()
            if time.monotonic() > deadline:
                raise NodeError(f"{name} of node {self.name} made no socket in {timeout_s:.0f} s:\n"
                                f"{tail(self.logs / f'{name}-{self.name}.log')}")
            time.sleep(0.05)

    # ------------------------------------------------------------ teardown
    def stop(self) -> None:
        teardown(self.dir, self.cgroup_root, self.pids)
        self.pids.clear()


def teardown(node_dir: Path, cgroup_root: str, pids: dict[str, int]) -> None:
    """A node's processes, its containers, mounts and cgroups: nothing of it stays (also for a node
    whose processes are gone already, from what ``./dev cluster down`` finds in the plane's state)."""
    for name in ("kube-proxy", "kubelet"):
        if pids.get(name):
            stop_pid(pids[name], 10)
    kill_cgroup_tree(cgroup_root)
    shims = processes_naming(str(node_dir / "containerd.sock"))  # they outlive containerd
    sockets = [path for pid in shims for path in unix_sockets(pid) if path.startswith(SHIM_SOCKETS)]
    for pid in shims:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for name in ("containerd", "snapshotter"):
        if pids.get(name):
            stop_pid(pids[name], 10)
    for path in sockets:  # a killed shim leaves its socket; containerd 1.6 keeps them all in one place
        Path(path).unlink(missing_ok=True)
    for d in (f"{SHIM_SOCKETS}", "/run/containerd"):  # made by the first node's shim; removed by the last
        try:
            os.rmdir(d)
        except OSError:
            pass
    unmount_under(node_dir)
    remove_cgroups(cgroup_root)
    remove_log_links(node_dir)


def tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def processes_naming(text: str) -> list[int]:
    """Processes whose command line contains ``text``."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if text.encode() in (d / "cmdline").read_bytes():
                    out.append(int(d.name))
            except OSError:
                continue
    return [p for p in out if p != os.getpid()]


def unix_sockets(pid: int) -> list[str]:
    """The paths of the unix sockets process ``pid`` has open."""
    inodes = set()
    try:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
        table = Path(f"/proc/{pid}/net/unix").read_text().splitlines()[1:]
    except OSError:
        return []
    return [w[7] for w in (line.split() for line in table) if len(w) >= 8 and w[6] in inodes]


def cgroup_dirs(root: str) -> list[Path]:
    """Every cgroup at or under ``root`` in every v1 hierarchy, deepest first."""
    out: list[Path] = []
    for h in cgroup_hierarchies():
        top = h / root.lstrip("/")
        if top.is_dir():
            out += [Path(p) for p, _, _ in os.walk(top)]
    return sorted(out, key=lambda p: len(p.parts), reverse=True)


def kill_cgroup_tree(root: str, timeout_s: float = 10) -> None:
    """SIGKILL every process in the cgroups under ``root`` until none is left."""
    deadline = time.monotonic() + timeout_s
    while True:
        pids = set()
        for d in cgroup_dirs(root):
            try:
                pids |= {int(p) for p in (d / "cgroup.procs").read_text().split()}
            except (OSError, ValueError):
                continue
        if not pids or time.monotonic() > deadline:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.05)


def remove_cgroups(root: str) -> None:
    for d in cgroup_dirs(root):
        for _ in range(50):
            try:
                d.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError:  # busy until its last process is reaped
                time.sleep(0.05)


def mounts_under(path: Path) -> list[str]:
    """Mount points at or under ``path``, deepest first (from this process's mountinfo)."""
    prefix = str(path.resolve())
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].encode().decode("unicode_escape")
        if point == prefix or point.startswith(prefix + "/"):
            out.append(point)
    return sorted(set(out), key=len, reverse=True)


def unmount_under(path: Path) -> None:
    for point in mounts_under(path):
        subprocess.run(["umount", "-l", point], capture_output=True)


def remove_log_links(node_dir: Path) -> None:
    """The kubelet's links in /var/log/containers that point into this node (a node that is stopped,
    not drained, leaves them)."""
    logs = Path("/var/log/containers")
    if not logs.is_dir():
        return
    prefix = str(node_dir.resolve())
    for link in logs.iterdir():
        try:
            if link.is_symlink() and os.readlink(link).startswith(prefix):
                link.unlink()
        except OSError:
            continue
