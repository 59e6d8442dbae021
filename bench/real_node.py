"""What a real node of the plane costs: the time it takes to join Ready, to pull edl's images, a pod's
start on it, and its memory when idle (the upstream kubelet, containerd with edl's snapshotter, and
kube-proxy; ``tests/plane/node.py``).

    python bench/real_node.py [--nodes 2] [--pods 10] [--settle 20]

Starts a plane of its own (root, as ``./dev cluster``), adds ``--nodes`` real nodes one after another
(each timed from its start to Ready as the apiserver reports it). edl's images' layers are unpacked on
the machine where they are not yet (timed; kept for later runs), then a first pod of the runtime image
on node-0 is timed from its creation to its container running, the image pulled; then every node pulls
the runtime, CPU trainer and PyTorch images (the plane's pre-pull, each node timed), and each node's
image store is measured on disk. Then ``--pods`` pods of the runtime image start on node-0 one after
another, each timed from its creation to Running with its container started (the image cached). After
``--settle`` seconds with no pod, each node's processes' memory is read from /proc: resident (RSS, which
counts the pages of the Kubernetes binary they share with the control plane in full) and proportional
(PSS, shared pages split between their users). Writes bench/results/real_node.json.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ROOT, provenance, write_result  # noqa: E402

sys.path.insert(0, str(ROOT))
from tests.plane import build, images  # noqa: E402
from tests.plane.plane import PLANES, ControlPlane  # noqa: E402

BASE = 240  # the plane's network, clear of the tests' and ./dev cluster's
PULLED = ("runtime", "trainer-cpu", "trainer-torch-gpu")


def memory_mb(pid: int) -> tuple[float, float]:
    """(RSS, PSS) of ``pid`` in MiB."""
    fields = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        key, value, *_ = line.split()
        fields[key.rstrip(":")] = int(value)
    return fields["Rss"] / 1024, fields["Pss"] / 1024


def disk_mb(path: Path) -> float:
    """What ``path`` takes on disk (``du``: blocks, each file once)."""
    out = subprocess.run(["du", "-sx", "--block-size=1", str(path)], capture_output=True, text=True, check=True)
    return int(out.stdout.split()[0]) / 2**20


def pod_start(core, namespace: str, name: str, image: str, node: str, timeout_s: float = 120) -> float:
    """Seconds from the pod's creation to Running with its container started."""
    body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"nodeName": node, "restartPolicy": "Never", "terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "c", "image": image, "command": ["sleep", "300"],
                                     "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}}}]}}
    t0 = time.monotonic()
    core.create_namespaced_pod(namespace, body)
    while time.monotonic() - t0 < timeout_s:
        p = core.read_namespaced_pod(name, namespace)
        statuses = p.status.container_statuses or []
        if p.status.phase == "Running" and statuses and statuses[0].state.running:
            took = time.monotonic() - t0
            core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
            return took
        time.sleep(0.02)
    raise TimeoutError(f"pod {name} not Running in {timeout_s:.0f} s")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=2, help="real nodes to add, each timed to Ready (default 2)")
    ap.add_argument("--pods", type=int, default=10, help="pods started one after another on a warm node (default 10)")
    ap.add_argument("--settle", type=float, default=20, help="seconds idle before memory is read (default 20)")
    a = ap.parse_args()
    if a.nodes < 1 or a.pods < 1:
        ap.error("--nodes and --pods must be at least 1")
    console = Console(stderr=True)
    from kubernetes import client, config

    build.build(build.KUBEPLANE)
    build.build(build.COREDNS)
    images.build_images()
    PLANES.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="bench-node-", dir=PLANES))
    plane = ControlPlane(root, ip_base=BASE)
    joins: list[float] = []
    starts: list[float] = []
    memory: dict[str, dict[str, list[float]]] = {}
    try:
        with console.status("control plane"):
            plane.start()
        for i in range(a.nodes):
            with console.status(f"node-{i} joining"):
                t0 = time.monotonic()
                plane.add_node(f"node-{i}", cpu="2", memory="4Gi")
                joins.append(time.monotonic() - t0)
        core = client.CoreV1Api(config.new_client_from_config(config_file=str(plane.admin_kubeconfig)))
        while not core.list_namespaced_service_account("default").items:
            time.sleep(0.1)
        image = plane.image("runtime")
        unpacked_before = all(images.unpacked(name) for name in PULLED)
        with console.status("unpacking edl's images' layers on the machine"):
            t0 = time.monotonic()
            images.unpack_layers(PULLED)
            unpack = time.monotonic() - t0
        with console.status("pulling the runtime image on node-0"):
            first = pod_start(core, "default", "pull", image, "node-0", timeout_s=600)
        prepull: dict[str, float] = {}
        with console.status(f"every node pulling {', '.join(PULLED)}"):
            t0 = time.monotonic()
            plane.prepull(PULLED, pulled=lambda name, took: prepull.__setitem__(name, round(took, 2)))
            prepull_all = time.monotonic() - t0
        stores = {n.name: round(disk_mb(Path(n.dir) / "containerd" / "root"), 1) for n in plane.state.nodes}
        for k in range(a.pods):
            with console.status(f"pod {k + 1} of {a.pods}"):
                while core.list_namespaced_pod("default").items:  # the one before is gone
                    time.sleep(0.05)
                starts.append(pod_start(core, "default", f"p{k}", image, "node-0"))
        while core.list_namespaced_pod("default").items:
            time.sleep(0.1)
        with console.status(f"idle for {a.settle:.0f} s"):
            time.sleep(a.settle)
        for n in plane.state.nodes:
            memory[n.name] = {name: list(memory_mb(pid)) for name, pid in n.pids.items()}
    finally:
        plane.stop()
        shutil.rmtree(root, ignore_errors=True)
    per_node = {name: {"rss_mb": round(sum(v[0] for v in procs.values()), 1),
                       "pss_mb": round(sum(v[1] for v in procs.values()), 1),
                       "processes": {k: {"rss_mb": round(v[0], 1), "pss_mb": round(v[1], 1)} for k, v in procs.items()}}
                for name, procs in memory.items()}
    result = {
        **provenance("bench/real_node.py", sys.argv[1:]),
        "at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": {"cores": __import__("os").cpu_count()},
        "node_join_s": [round(x, 2) for x in joins],
        "layers_unpacked_s": round(unpack, 2),
        "layers_were_unpacked_before": unpacked_before,
        "first_pod_with_pull_s": round(first, 2),
        "prepull": {"images": list(PULLED), "nodes_s": prepull, "all_s": round(prepull_all, 2)},
        "pod_start_cached_s": {"median": round(statistics.median(starts), 2), "max": round(max(starts), 2),
                               "all": [round(x, 2) for x in starts]},
        "idle_node_memory": per_node,
        "image_store_mb": stores,
    }
    path = write_result("real_node", result)
    table = Table(title=f"real nodes ({path.relative_to(ROOT)})")
    table.add_column("what")
    table.add_column("figure", justify="right")
    table.add_row("node join to Ready", ", ".join(f"{x:.1f} s" for x in joins))
    table.add_row("edl's layers unpacked on the machine" + (" (they were already)" if unpacked_before else ""),
                  f"{unpack:.1f} s")
    table.add_row("first pod, runtime image pulled", f"{first:.1f} s")
    table.add_row(f"every node pulls {', '.join(PULLED)}", f"{prepull_all:.1f} s")
    table.add_row(f"pod start, cached (median / max of {a.pods})",
                  f"{statistics.median(starts):.2f} / {max(starts):.2f} s")
    for name, mb in stores.items():
        table.add_row(f"{name} image store, the three images pulled", f"{mb:.0f} MiB")
    for name, m in per_node.items():
        table.add_row(f"{name} idle: {' + '.join(memory[name])}", f"RSS {m['rss_mb']:.0f} MiB, PSS {m['pss_mb']:.0f} MiB")
    Console().print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
