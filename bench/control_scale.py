"""The control traffic of many jobs' sidecars on a real apiserver: 1,000 hollow nodes, 20,000 pods.

    python bench/control_scale.py [--jobs 1,10,50,100] [--nodes 1000] [--pods 20000] [--period 10]

A plane of etcd and kube-apiserver alone (``tests/plane``, built by ``./dev test``). Its nodes are hollow:
Node objects with a Ready status that no kubelet keeps (nothing marks them NotReady: no controller
runs). Its pods are bound by name and marked Running by this script, 500 of them the trainers of 100
jobs (5 each). Each job's sidecar is a process (``bench/_hollow_sidecar.py``) with the real informers of
nodes, pods and demand Leases of the one that decides for the namespace, the Leases, and the ``edl``
policy; its master is a double.

For each number of jobs: the sidecars start and list the cluster, then for ``--window`` seconds, while
``--churn`` pods a second come and go, the apiserver's CPU and memory are read from /proc and the watch
events it sent and the requests it served from its /metrics; each sidecar reports its decisions' times
and its memory. Writes bench/results/control_scale.json and docs/control_scale.png.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path

import psutil
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ROOT, write_result  # noqa: E402

sys.path.insert(0, str(ROOT))
from tests.plane.plane import ControlPlane  # noqa: E402

TEAMS = 20  # namespaces the services' pods are spread over
TRAINERS_PER_JOB = 5
ALL_JOBS = 100


def kube_client(plane: ControlPlane):
    from kubernetes import client, config

    cfg = client.Configuration()
    config.load_kube_config(config_file=str(plane.admin_kubeconfig), client_configuration=cfg)
    cfg.connection_pool_maxsize = 32
    return client.CoreV1Api(client.ApiClient(cfg))


def in_parallel(console: Console, what: str, fn, items: list) -> None:
    with Progress(console=console, transient=True) as bar, ThreadPoolExecutor(16) as pool:
        task = bar.add_task(what, total=len(items))
        for _ in pool.map(fn, items):
            bar.advance(task)
    console.print(f"{what}: {len(items)}")


def node_body(i: int) -> tuple[dict, dict]:
    name = f"hollow-{i:04d}"
    now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    size = {"cpu": "32", "memory": "128Gi", "pods": "110"}
    return ({"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}}, "spec": {}},
            {"status": {"capacity": size, "allocatable": size,
                        "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "hollow",
                                        "lastHeartbeatTime": now, "lastTransitionTime": now}]}})


def pod_body(name: str, node: str, cpu: str, memory: str, labels: dict) -> dict:
    return {"metadata": {"name": name, "labels": labels},
            "spec": {"nodeName": node, "automountServiceAccountToken": False, "terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "main", "image": "hollow:1",
                                     "resources": {"requests": {"cpu": cpu, "memory": memory}}}]}}


def create_pod(core, ns: str, body: dict) -> None:
    core.create_namespaced_pod(ns, body, _preload_content=False)
    core.patch_namespaced_pod_status(body["metadata"]["name"], ns, {"status": {"phase": "Running"}},
                                     _preload_content=False)


def populate(core, console: Console, nodes: int, pods: int) -> None:
    for ns in ["ml", *(f"team-{k}" for k in range(TEAMS))]:
        core.create_namespace({"metadata": {"name": ns}})
        core.create_namespaced_service_account(ns, {"metadata": {"name": "default"}})

    def node(i: int) -> None:
        body, status = node_body(i)
        core.create_node(body, _preload_content=False)
        core.patch_node_status(body["metadata"]["name"], status, _preload_content=False)

    in_parallel(console, "hollow nodes", node, list(range(nodes)))
    trainers = [(f"job-{j:03d}", k) for j in range(ALL_JOBS) for k in range(TRAINERS_PER_JOB)]
    in_parallel(console, "trainer pods", lambda jk: create_pod(core, "ml", pod_body(
        f"{jk[0]}-trainer-{jk[1]}", f"hollow-{(int(jk[0][4:]) * TRAINERS_PER_JOB + jk[1]) * 7 % nodes:04d}", "1", "2Gi",
        {"edl.dev/job": jk[0], "edl.dev/role": "trainer"})), trainers)
    in_parallel(console, "service pods", lambda i: create_pod(core, f"team-{i % TEAMS}", pod_body(
        f"svc-{i}", f"hollow-{i % nodes:04d}", "500m", "1Gi", {"app": f"svc-{i % 300}"})),
        list(range(pods - len(trainers))))


class Churn:
    """``rate`` pods a second created (bound, Running), and the oldest deleted once 50 are there."""

    made = itertools.count()  # pod names across measurements

    def __init__(self, core, rate: float, nodes: int) -> None:
        self.core, self.rate, self.nodes = core, rate, nodes
        self.stop = threading.Event()
        self.live: list[tuple[str, str]] = []
        self.errors = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.wait(1 / self.rate):
            n = next(self.made)
            ns, name = f"team-{n % TEAMS}", f"churn-{n}"
            try:
                create_pod(self.core, ns, pod_body(name, f"hollow-{n % self.nodes:04d}", "250m", "256Mi", {"app": "churn"}))
                self.live.append((ns, name))
                if len(self.live) > 50:
                    ns, name = self.live.pop(0)
                    self.core.delete_namespaced_pod(name, ns, grace_period_seconds=0, _preload_content=False)
            except Exception:  # noqa: BLE001 - counted and reported: the load goes on
                self.errors += 1


def apiserver_counters(plane: ControlPlane) -> dict[str, float]:
    """The apiserver's counters read from /metrics: watch events sent, requests by verb, open watches."""
    text = plane.admin_http().get(plane.state.apiserver + "/metrics").text
    out: dict[str, float] = defaultdict(float)
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "apiserver_watch_events_total":
                out["watch_events"] += s.value
            elif s.name == "apiserver_request_total":
                out[f"requests_{s.labels.get('verb', '?')}"] += s.value
                out["requests"] += s.value
            elif s.name == "apiserver_longrunning_requests" and s.labels.get("verb") == "WATCH":
                out["open_watches"] += s.value
    return out


def cpu_s(pid: int) -> float:
    t = psutil.Process(pid).cpu_times()
    return t.user + t.system


def measure(plane: ControlPlane, core, console: Console, jobs: int, period: float, window: float, churn: float,
            nodes: int, work: Path) -> dict:
    outs = [work / f"j{jobs}-{j:03d}.json" for j in range(jobs)]
    logs = [(work / f"j{jobs}-{j:03d}.log").open("wb") for j in range(jobs)]
    started = time.time()
    procs = [subprocess.Popen([sys.executable, str(ROOT / "bench" / "_hollow_sidecar.py"), str(plane.admin_kubeconfig),
                               "ml", f"job-{j:03d}", str(period), str(outs[j])], stdout=logs[j],
                              stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True) for j in range(jobs)]
    try:
        with Progress(console=console, transient=True) as bar:
            task = bar.add_task(f"{jobs} sidecars listing the cluster", total=jobs)
            while (ready := sum(o.with_name(o.name + ".ready").exists() for o in outs)) < jobs:
                bar.update(task, completed=ready)
                if any(p.poll() is not None for p in procs):
                    raise RuntimeError(f"a sidecar exited early: see {work}")
                if time.time() - started > 1200:
                    raise TimeoutError(f"{jobs} sidecars not synced in 20 minutes")
                time.sleep(0.5)
        synced_s = time.time() - started
        time.sleep(2 * period)  # every sidecar has decided and published its Lease
        ch = Churn(core, churn, nodes)
        ch.thread.start()
        api, etcd = plane.state.pids["kube-apiserver"], plane.state.pids["etcd"]
        before, c0, e0, w0 = apiserver_counters(plane), cpu_s(api), cpu_s(etcd), time.time()
        time.sleep(window)
        after, c1, e1, w1 = apiserver_counters(plane), cpu_s(api), cpu_s(etcd), time.time()
        ch.stop.set()
        ch.thread.join(10)
        if ch.errors:
            console.print(f"{ch.errors} pod changes of the churn failed")
        rss = psutil.Process(api).memory_info().rss / 2 ** 20
        process_rss = [psutil.Process(p.pid).memory_info().rss / 2 ** 20 for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
        for f in logs:
            f.close()
    reports = [json.loads(o.read_text()) for o in outs if o.exists()]
    if len(reports) < jobs:
        console.print(f"{jobs - len(reports)} sidecars wrote no report: see {work}")
    took = sorted(d for r in reports for start, d, planned in r["decisions"] if w0 <= start <= w1 and planned)
    # Each sidecar's own memory: its process's, less what the process (the launcher) held before it started.
    own = [now - json.loads(o.with_name(o.name + ".ready").read_text())["rss_before_mib"]
           for o, now in zip(outs, process_rss)]
    deciding = [m for r, m in zip(reports, own) if any(planned for _, _, planned in r["decisions"])]
    elapsed = w1 - w0
    rates = {k: (after.get(k, 0.0) - before.get(k, 0.0)) / elapsed for k in after if k != "open_watches"}
    return {"jobs": jobs, "synced_s": synced_s, "window_s": elapsed, "apiserver_cpu_cores": (c1 - c0) / elapsed,
            "etcd_cpu_cores": (e1 - e0) / elapsed, "apiserver_rss_mib": rss,
            "watch_events_per_s": rates.get("watch_events", 0.0), "requests_per_s": rates.get("requests", 0.0),
            "requests_per_s_by_verb": {k.removeprefix("requests_"): v for k, v in rates.items()
                                       if k.startswith("requests_")},
            "open_watches": after.get("open_watches", 0.0), "decisions": len(took),
            "decision_median_s": took[len(took) // 2] if took else None, "decision_max_s": took[-1] if took else None,
            "process_rss_mib_each": sorted(process_rss)[len(process_rss) // 2],
            "sidecar_mib_each": sorted(own)[len(own) // 2], "sidecar_mib_deciding": max(deciding, default=None),
            "sidecar_mib_all": sum(own), "pods_cached_all": sum(r["pods_cached"] for r in reports)}


def figure(rows: list[dict], before: list[dict], path: Path) -> None:
    """The apiserver's load and the sidecars' memory as jobs grow; ``before``, dashed: another run's rows
    (an earlier design) for comparison."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    for data, style, tag in ((rows, "o-", ""), (before, "s--", " (before)")):
        if not data:
            continue
        jobs = [r["jobs"] for r in data]
        axes[0].plot(jobs, [r["watch_events_per_s"] for r in data], style, color="C0", label=f"watch events{tag}")
        axes[1].plot(jobs, [r["apiserver_cpu_cores"] for r in data], style, color="C0", label=f"kube-apiserver{tag}")
        axes[1].plot(jobs, [r["etcd_cpu_cores"] for r in data], style, color="C1", label=f"etcd{tag}")
        axes[2].plot(jobs, [r.get("sidecar_mib_all", r.get("sidecar_rss_mib_all", 0)) for r in data], style,
                     color="C3", label=f"all sidecars{tag}")
    axes[0].set(title="watch events the apiserver sent (/s)", xlabel="jobs")
    axes[1].set(title="CPU (cores)", xlabel="jobs")
    axes[2].set(title="memory of all sidecars (MiB, log scale)", xlabel="jobs", yscale="log")
    for ax in axes[:2]:
        ax.set_ylim(bottom=0)
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jobs", default="1,10,50,100", help="numbers of jobs, one measurement each (default 1,10,50,100)")
    p.add_argument("--nodes", type=int, default=1000, help="hollow nodes (default 1000)")
    p.add_argument("--pods", type=int, default=20_000, help="pods, the jobs' trainers included (default 20000)")
    p.add_argument("--period", type=float, default=10.0, help="each sidecar's decision period in s (default 10)")
    p.add_argument("--window", type=float, default=60.0, help="seconds measured per number of jobs (default 60)")
    p.add_argument("--churn", type=float, default=10.0, help="pods created (and deleted) per second (default 10)")
    p.add_argument("--before", type=Path, help="a result of an earlier run (another design), drawn dashed beside "
                                               "this one's and kept in the result under 'before'")
    p.add_argument("--out", type=Path, help="write control_scale.json and control_scale.png here instead of "
                                            "bench/results and docs")
    p.add_argument("--replot", action="store_true", help="measure nothing: print the table and draw the figure "
                                                         "of bench/results/control_scale.json again")
    a = p.parse_args()
    before = json.loads(a.before.read_text())["rows"] if a.before else []
    if a.replot:
        result = json.loads((ROOT / "bench" / "results" / "control_scale.json").read_text())
        report(Console(), result, before or result.get("before", []))
        return 0
    counts = [int(x) for x in a.jobs.split(",")]
    if not counts or min(counts) < 1 or max(counts) > ALL_JOBS:
        p.error(f"--jobs: numbers of jobs from 1 to {ALL_JOBS}, comma-separated (got {a.jobs!r})")
    console = Console()
    rows = []
    with tempfile.TemporaryDirectory(prefix="edl-control-scale-") as tmp:
        work = Path(tmp)
        plane = ControlPlane(work / "plane", ip_base=245).start_api_only()  # its bridge clear of the others
        try:
            core = kube_client(plane)
            populate(core, console, a.nodes, a.pods)
            for jobs in counts:
                rows.append(measure(plane, core, console, jobs, a.period, a.window, a.churn, a.nodes, work))
                r = rows[-1]
                console.print(f"{jobs} jobs: synced in {r['synced_s']:.0f} s, apiserver {r['apiserver_cpu_cores']:.2f} "
                              f"cores, {r['watch_events_per_s']:.0f} watch events/s")
        finally:
            plane.stop()
    result = {"nodes": a.nodes, "pods": a.pods, "period_s": a.period, "churn_per_s": a.churn, "rows": rows}
    if before:
        result["before"] = before
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / "control_scale.json").write_text(json.dumps(result, indent=2) + "\n")
        report(console, result, before, a.out / "control_scale.png")
        console.print(f"written to {a.out}")
    else:
        report(console, result, before)
        console.print(f"written to {write_result('control_scale', result)} and docs/control_scale.png")
    return 0


def sidecar_mib(r: dict) -> str:
    """The sidecars' own memory, one / the deciding one / all; a row of the earlier design (each sidecar a
    process of its own) has only its processes' resident memory, one / all."""
    if "sidecar_mib_all" not in r:
        return f"{r['sidecar_rss_mib_each']:.0f} / {r['sidecar_rss_mib_all']:.0f} (processes)"
    deciding = r["sidecar_mib_deciding"]
    return (f"{r['sidecar_mib_each']:.1f} / {'-' if deciding is None else f'{deciding:.0f}'} / "
            f"{r['sidecar_mib_all']:.0f}")


def report(console: Console, result: dict, before: list[dict], png: Path = ROOT / "docs" / "control_scale.png") -> None:
    rows = result["rows"]
    table = Table(title=f"{result['nodes']} hollow nodes, {result['pods']} pods, sidecars every {result['period_s']:g} s, "
                        f"{result['churn_per_s']:g} pods/s churn")
    for col in ("jobs", "ready s", "API CPU", "etcd CPU", "API MiB", "events/s", "req/s", "watches", "plan ms",
                "sidecar MiB", "process MiB", "pods cached"):
        table.add_column(col, justify="right")
    for r in [*rows, *({**r, "jobs": f"{r['jobs']} before"} for r in before)]:
        table.add_row(str(r["jobs"]), f"{r['synced_s']:.0f}", f"{r['apiserver_cpu_cores']:.2f}", f"{r['etcd_cpu_cores']:.2f}",
                      f"{r['apiserver_rss_mib']:.0f}", f"{r['watch_events_per_s']:.0f}", f"{r['requests_per_s']:.1f}",
                      f"{r['open_watches']:.0f}",
                      f"{1000 * (r['decision_median_s'] or 0):.0f} / {1000 * (r['decision_max_s'] or 0):.0f}",
                      sidecar_mib(r), f"{r.get('process_rss_mib_each', r.get('sidecar_rss_mib_each', 0)):.0f}",
                      str(r.get("pods_cached_all", "")))
    console.print(table)
    console.print("ready s: until every sidecar followed the cluster; API, etcd: kube-apiserver and etcd (CPU in "
                  "cores); events/s: watch events the apiserver sent; watches: open; plan ms: the decisions that "
                  "planned the namespace, median / max; sidecar MiB: the sidecars' own memory (their processes' "
                  "resident memory less what the launcher held before), one (median) / the deciding one / all together; "
                  "process MiB: one sidecar's process (median), launcher included; pods cached: by all sidecars together")
    first, last = rows[0], rows[-1]
    if len(rows) > 1:
        console.print(f"{last['jobs']} jobs against {first['jobs']}: watch events x"
                      f"{last['watch_events_per_s'] / max(first['watch_events_per_s'], 1e-9):.1f}, apiserver CPU x"
                      f"{last['apiserver_cpu_cores'] / max(first['apiserver_cpu_cores'], 1e-9):.1f}, pods the sidecars "
                      f"cache x{last['pods_cached_all'] / max(first['pods_cached_all'], 1):.1f}, their resident memory x"
                      f"{last['sidecar_mib_all'] / max(first['sidecar_mib_all'], 1e-9):.1f} (targets: x2 at most)")
    figure(rows, before, png)


if __name__ == "__main__":
    raise SystemExit(main())
