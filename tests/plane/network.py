"""The plane's network: a bridge on the host, one network namespace per node, routes between them,
and blackhole routes that keep every pod and Service address on this machine.

One plane owns ``10.B.0.0/16`` (``B`` its base, distinct per plane: one per pytest-xdist worker,
another for ``./dev cluster``):

- ``10.B.0.1/24`` on the host's bridge ``edlB``: the apiserver, the registry, MinIO and CoreDNS
  listen there, reachable from the host and from every node;
- node ``i`` is the namespace ``edlB-nI`` with ``eth0`` at ``10.B.0.(10+i)`` on that bridge (a veth
  pair, ``edlBvI`` on the host's side) and its pods in ``10.B.(i+1).0/24`` behind its own CNI
  bridge; nodes route each other's pod ranges over the bridge, the host routes them to the node;
- Services get ``10.B.250.0/24`` (kube-proxy's rules live in each node's namespace only).

Before any node starts, ``10.B.0.0/16`` is a blackhole route on the host: a pod or Service address
that no node answers for is dropped here, never sent to the default gateway. A node's namespace has
no default route at all: nothing in a pod can reach past this machine.
"""

from __future__ import annotations

import ipaddress
import subprocess
from dataclasses import dataclass
from pathlib import Path

NETNS_DIR = Path("/run/netns")


class NetworkError(RuntimeError):
    pass


def ip(*args: str, netns: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    """``ip ARGS`` (in ``netns`` if given); a failure raises ``NetworkError`` naming the command."""
    argv = ["ip", *(["-n", netns] if netns else []), *args]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if check and r.returncode != 0:
        raise NetworkError(f"{' '.join(argv)}: {r.stderr.strip()}")
    return r


def in_netns(netns: str, argv: list[str]) -> list[str]:
    """``argv`` run in the node's network namespace only (its mounts stay the host's, so the kubelet's
    volume mounts are seen by runc; ``ip netns exec`` would give it a mount namespace of its own)."""
    return ["nsenter", f"--net={NETNS_DIR / netns}", "--", *argv]


@dataclass(frozen=True)
class PlaneNet:
    """The addresses of one plane, all derived from its base ``B`` (20-249)."""

    base: int

    def __post_init__(self) -> None:
        if not 1 <= self.base <= 249:
            raise NetworkError(f"plane network base {self.base} is not within 1-249")

    @property
    def cidr(self) -> str:
        return f"10.{self.base}.0.0/16"

    @property
    def bridge(self) -> str:
        return f"edl{self.base}"

    @property
    def host_ip(self) -> str:
        return f"10.{self.base}.0.1"

    @property
    def service_cidr(self) -> str:
        return f"10.{self.base}.250.0/24"

    @property
    def kubernetes_service_ip(self) -> str:
        return f"10.{self.base}.250.1"

    @property
    def dns_service_ip(self) -> str:
        return f"10.{self.base}.250.10"

    def node_ip(self, index: int) -> str:
        return f"10.{self.base}.0.{10 + index}"

    def pod_cidr(self, index: int) -> str:
        return f"10.{self.base}.{index + 1}.0/24"

    def netns(self, index: int) -> str:
        return f"edl{self.base}-n{index}"

    def veth(self, index: int) -> str:
        return f"edl{self.base}v{index}"

    def owns(self, address: str) -> bool:
        return ipaddress.ip_address(address) in ipaddress.ip_network(self.cidr)

    # ------------------------------------------------------------ host
    def up(self) -> None:
        """The blackhole first, then the bridge and its address. Idempotent."""
        ip("route", "replace", "blackhole", self.cidr)
        if ip("link", "show", self.bridge, check=False).returncode != 0:
            ip("link", "add", self.bridge, "type", "bridge")
        ip("addr", "replace", f"{self.host_ip}/24", "dev", self.bridge)
        ip("link", "set", self.bridge, "up")

    def down(self) -> None:
        """Every namespace, veth, route and the bridge of this plane, whatever is left of them."""
        for ns in self.namespaces():
            ip("netns", "delete", ns, check=False)
        for link in self.links():
            ip("link", "delete", link, check=False)
        ip("route", "del", "blackhole", self.cidr, check=False)

    def namespaces(self) -> list[str]:
        prefix = f"edl{self.base}-n"
        return sorted(p.name for p in NETNS_DIR.glob(f"{prefix}*")) if NETNS_DIR.is_dir() else []

    def links(self) -> list[str]:
        """The host's links of this plane (its bridge and the nodes' veths)."""
        r = ip("-o", "link", "show", check=False)
        names = [line.split(":")[1].strip().split("@")[0] for line in r.stdout.splitlines() if ":" in line]
        return [n for n in names if n == self.bridge or n.startswith(f"edl{self.base}v")]

    def routes(self) -> list[str]:
        """The host's routes into this plane's range (the blackhole, the bridge, the nodes' pods)."""
        net = ipaddress.ip_network(self.cidr)
        lines = [line.strip() for line in ip("route", "show", check=False).stdout.splitlines() if line.strip()]
        return [line for line in lines if (dest := destination(line)) is not None and dest.subnet_of(net)]

    # ------------------------------------------------------------ nodes
    def add_node(self, index: int, peers: list[int]) -> None:
        """Node ``index``'s namespace, joined to the bridge, with routes to its ``peers``' pods; the
        host's route to its pods; and the peers' routes to its pods."""
        ns, veth, node_ip = self.netns(index), self.veth(index), self.node_ip(index)
        ip("netns", "delete", ns, check=False)
        ip("link", "delete", veth, check=False)
        ip("netns", "add", ns)
        ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
        ip("link", "set", veth, "master", self.bridge, "up")
        ip("link", "set", "lo", "up", netns=ns)
        ip("addr", "add", f"{node_ip}/24", "dev", "eth0", netns=ns)
        ip("link", "set", "eth0", "up", netns=ns)
        # No default route. The Service range is on-link so that the node's own processes (the kubelet's
        # probes, a host-network pod) can connect to a ClusterIP: kube-proxy's OUTPUT rules rewrite it.
        ip("route", "add", self.service_cidr, "dev", "eth0", netns=ns)
        ip("route", "replace", self.pod_cidr(index), "via", node_ip)
        for peer in peers:
            ip("route", "replace", self.pod_cidr(peer), "via", self.node_ip(peer), netns=ns)
            ip("route", "replace", self.pod_cidr(index), "via", node_ip, netns=self.netns(peer))
        for key, value in (("net.ipv4.ip_forward", "1"), ("net.bridge.bridge-nf-call-iptables", "1")):
            r = subprocess.run(in_netns(ns, ["sysctl", "-qw", f"{key}={value}"]), capture_output=True, text=True)
            if r.returncode != 0:
                raise NetworkError(f"sysctl {key}={value} in {ns}: {r.stderr.strip()}")

    def remove_node(self, index: int, peers: list[int]) -> None:
        for peer in peers:
            ip("route", "del", self.pod_cidr(index), netns=self.netns(peer), check=False)
        ip("route", "del", self.pod_cidr(index), check=False)
        ip("netns", "delete", self.netns(index), check=False)
        ip("link", "delete", self.veth(index), check=False)

    def cut(self, index: int) -> None:
        """The node's link goes down: it reaches nothing and nothing reaches it; its processes run on."""
        ip("link", "set", self.veth(index), "down")

    def mend(self, index: int) -> None:
        ip("link", "set", self.veth(index), "up")


def destination(route: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network | None:
    """The network a line of ``ip route show`` is for (``default`` is 0.0.0.0/0), ``None`` if unreadable."""
    words = route.split()
    dest = words[1] if words and words[0] in ("blackhole", "unreachable", "prohibit") and len(words) > 1 else (
        words[0] if words else "")
    try:
        return ipaddress.ip_network("0.0.0.0/0" if dest == "default" else dest, strict=False)
    except ValueError:
        return None


def deciding_route(address: str) -> str:
    """The host's most specific route for ``address`` (``ip route show match``), the one the kernel takes."""
    lines = [line.strip() for line in ip("route", "show", "match", address).stdout.splitlines() if line.strip()]
    return max(lines, key=lambda line: (d.prefixlen if (d := destination(line)) else -1)) if lines else ""


def route_of(address: str) -> str:
    """What ``ip route get ADDRESS`` says on the host (``RTNETLINK answers: ...`` for a blackhole)."""
    r = ip("route", "get", address, check=False)
    return (r.stdout or r.stderr).strip()
