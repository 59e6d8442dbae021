"""``./dev cluster up|down|status``: a local cluster of real nodes to try ``edl launch`` on.

    ./dev cluster up --nodes 3 --cpu 2     # prints the export lines for kubectl, edl and S3
    ./dev cluster up --kserve              # and KServe's controller, serving ONNX models with edl serve
    ./dev cluster status
    ./dev cluster down                     # stops it and leaves nothing of it behind

The plane the tests use (real apiserver, scheduler, controller-manager, etcd; real nodes: the
upstream kubelet, containerd, runc, the CNI bridge and kube-proxy in a network namespace each;
CoreDNS; MinIO; a registry with edl's images, built from ``images/`` where missing), left running
in the background, with its state in ``--root``. Needs root (namespaces, cgroups, routes).
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from tests.plane import build, images
from tests.plane.plane import KSERVE_RUNTIME, PLANES, ControlPlane, PlaneState, stop_all
from tests.plane.procs import _alive
from tests.plane.registry import RegistryError
from tests.plane.s3 import ACCESS_KEY, SECRET_KEY, MinioServer

DEFAULT_ROOT = PLANES / "cluster"
PREPULLED = ("runtime", "trainer-cpu")  # what `edl launch` runs on a CPU cluster


def exports(state: PlaneState) -> list[str]:
    return [f"export KUBECONFIG={Path(state.root) / 'admin.kubeconfig'}", f"export AWS_ENDPOINT_URL={state.s3}",
            f"export AWS_ACCESS_KEY_ID={ACCESS_KEY}", f"export AWS_SECRET_ACCESS_KEY={SECRET_KEY}",
            f"export EDL_REGISTRY={state.registry}"]


def running(state: PlaneState | None) -> bool:
    return state is not None and any(_alive(pid) for pid in state.pids.values())


def up(a: argparse.Namespace) -> int:
    root = Path(a.root)
    state = PlaneState.load(root)
    if running(state):
        print(f"a cluster is already up in {root} (./dev cluster down stops it)", file=sys.stderr)
        print("\n".join(exports(state)))
        return 0
    try:
        build.build_all()
        images.build_images()
    except (build.BuildError, images.ImageError, RegistryError) as e:
        print(f"cluster: {e}", file=sys.stderr)
        return 1
    shutil.rmtree(root, ignore_errors=True)
    plane = ControlPlane(root, node_grace_s=a.node_grace)
    try:
        plane.start()
        for i in range(a.nodes):
            plane.add_node(f"node-{i}", cpu=a.cpu, memory=a.memory)
        if a.prepull:
            print(f"pre-pulling edl's images ({', '.join(PREPULLED)}) into each node "
                  f"(--no-prepull skips it)", file=sys.stderr)
            plane.prepull(PREPULLED, pulled=lambda name, s: print(f"  {name}: pulled in {s:.0f} s", file=sys.stderr))
        s3 = MinioServer(root / "minio", address=plane.net.host_ip).start()
        plane.state.pids["minio"] = s3.proc.pid  # type: ignore[union-attr]
        plane.state.s3 = s3.endpoint
        plane.state.save()
        if a.kserve:
            plane.start_kserve(storage_initializer=plane.image("storage-initializer"), runtime=plane.image("runtime"))
    except (RuntimeError, OSError) as e:
        plane.stop()
        print(f"cluster: could not start: {e}", file=sys.stderr)
        return 1
    except BaseException:
        plane.stop()
        raise
    if a.kserve:
        print(f"KServe's controller runs in raw-deployment mode; InferenceServices of ONNX models (protocol v2) are "
              f"served by the ClusterServingRuntime {KSERVE_RUNTIME} (edl serve)", file=sys.stderr)
    print(f"cluster up: {a.nodes} nodes of {a.cpu} CPU and {a.memory}, apiserver {plane.state.apiserver}, "
          f"S3 {plane.state.s3}, edl's images in {plane.state.registry} ({images.reference('REGISTRY', 'runtime')}, "
          f"{images.reference('REGISTRY', 'trainer-cpu')}); state and logs in {root}", file=sys.stderr)
    print("\n".join(exports(plane.state)))
    return 0


def down(a: argparse.Namespace) -> int:
    root = Path(a.root)
    state = PlaneState.load(root)
    if state is None:
        print(f"no cluster in {root}", file=sys.stderr)
        return 0
    stop_all(state)
    shutil.rmtree(root, ignore_errors=True)
    print(f"cluster in {root} stopped", file=sys.stderr)
    return 0


def status(a: argparse.Namespace) -> int:
    state = PlaneState.load(Path(a.root))
    if state is None:
        print(f"no cluster in {a.root}")
        return 1
    for name, pid in sorted(state.pids.items()):
        print(f"{name:26} pid {pid:<8} {'running' if _alive(pid) else 'STOPPED'}")
    for node in state.nodes:
        for name, pid in node.pids.items():
            print(f"{name + ' ' + node.name:26} pid {pid:<8} {'running' if _alive(pid) else 'STOPPED'}"
                  f"  ({node.cpu} CPU, {node.memory}, {node.ip})")
    print(f"apiserver {state.apiserver}, S3 {state.s3}, registry {state.registry}")
    print("\n".join(exports(state)))
    return 0 if running(state) else 1


def node_size_problem(cpu: str, memory: str) -> str | None:
    """Why a node of ``cpu`` and ``memory`` cannot be had here, or ``None``."""
    from kubernetes.utils.quantity import parse_quantity

    from tests.plane.node import machine_capacity

    cores, total = machine_capacity()
    for flag, value, most in (("--cpu", cpu, cores), ("--memory", memory, total)):
        try:
            q = parse_quantity(value)
        except ValueError:
            return f"{flag} {value}: not a Kubernetes quantity (e.g. {'2 or 1500m' if flag == '--cpu' else '8Gi'})"
        if q <= 0 or q > most:
            shown = f"{cores} cores" if flag == "--cpu" else f"{total / 2**30:.1f} GiB"
            return f"{flag} {value}: a node gives pods more than 0 and at most what this machine has ({shown})"
    return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="./dev cluster", description=__doc__.split("\n\n")[0])
    p.add_argument("--root", default=str(DEFAULT_ROOT), help=f"state and logs of the cluster (default {DEFAULT_ROOT})")
    sub = p.add_subparsers(dest="cmd", required=True)
    u = sub.add_parser("up", help="start the cluster and print the export lines for it")
    u.add_argument("--nodes", type=int, default=3, help="how many nodes (default 3)")
    u.add_argument("--cpu", default="2", help="CPU each node gives pods, a Kubernetes quantity (default 2); at most "
                                              "this machine's cores: every node runs on them, its kubelet reports them")
    u.add_argument("--memory", default="8Gi", help="memory each node gives pods (default 8Gi), at most this machine's")
    u.add_argument("--kserve", action="store_true",
                   help="also start KServe's controller (raw deployments) with edl's ONNX serving runtime, so that "
                        "the pipeline's deploy step is served")
    u.add_argument("--node-grace", type=int, default=20, metavar="SECONDS",
                   help="how long a node's Lease lasts: a node silent this long is Unknown, and its pods are evicted "
                        "10 s later (default 20; the tests' planes use 6, a busy laptop can miss that)")
    u.add_argument("--no-prepull", dest="prepull", action="store_false",
                   help="do not load edl's runtime and CPU trainer images into every node at start (a few "
                        "seconds once this machine has unpacked their layers, a minute or two the first time); a "
                        "node then pulls an image when a pod first needs it")
    sub.add_parser("down", help="stop every process of the cluster and remove its state")
    sub.add_parser("status", help="which processes run, and the export lines")
    a = p.parse_args(argv)
    if a.cmd == "up":
        if a.nodes < 1:
            p.error(f"--nodes must be at least 1 (got {a.nodes})")
        if a.node_grace < 2:
            p.error(f"--node-grace must be at least 2 seconds (got {a.node_grace})")
        problem = node_size_problem(a.cpu, a.memory)
        if problem:
            p.error(problem)
    return {"up": up, "down": down, "status": status}[a.cmd](a)


if __name__ == "__main__":
    raise SystemExit(main())
