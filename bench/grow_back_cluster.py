"""A job on ``./dev cluster`` hands its capacity to higher-priority work and grows back once the work leaves.

    eval "$(./dev cluster up --nodes 4 --cpu 2)"
    python bench/grow_back_cluster.py [--period 10]

``edl.zoo.mlp`` with 1-CPU trainers, 1..6, PriorityClass ``edl-low``, the autoscale sidecar deciding every
``--period`` seconds. Once six trainers run, a Deployment of PriorityClass ``edl-high`` (3 pods of 1.5 CPU)
arrives: the sidecar hands trainers back and the scheduler preempts what the pods still need. Once the
Deployment is Ready and the job has settled, the Deployment is deleted. It reports how long the job took
to shrink and to grow back (from the Deployment's pods gone to six trainers running, also in sidecar
periods), whether any trainer pod was started that the scheduler could find no room for, and the
sidecar's reason for the job's size at each stage (the demand Lease's annotation). Writes
bench/results/grow_back_cluster.json.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ROOT, write_result  # noqa: E402
from soak_cluster import NEEDS, launch_args, prepare  # noqa: E402

NAMESPACE = "growback"
JOB = "growback"
PRIORITY_CLASSES = {"edl-low": 100, "edl-high": 100000}
MAX_TRAINERS = 6


def web(image: str) -> dict:
    """The higher-priority work: 3 pods of 1.5 CPU (4.5 of the cluster's 8)."""
    spec = {"priorityClassName": "edl-high", "terminationGracePeriodSeconds": 2,
            "containers": [{"name": "web", "image": image, "command": ["sleep", "3600"],
                            "resources": {"requests": {"cpu": "1500m", "memory": "64Mi"}}}]}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
            "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "web"}},
                     "template": {"metadata": {"labels": {"app": "web"}}, "spec": spec}}}


class Watch:
    """What the bench looks at, each poll: the job's trainer pods and the sidecar's reason."""

    def __init__(self, core, coord) -> None:
        self.core, self.coord = core, coord
        self.t0 = time.time()  # the reasons' times are from here: the job's launch
        self.unschedulable: set[str] = set()  # trainer pods the scheduler found no room for
        self.reasons: list[tuple[float, str, str]] = []  # (t from t0, cause, text), each change

    def trainers(self) -> list:
        pods = self.core.list_namespaced_pod(NAMESPACE, label_selector=f"edl.dev/job={JOB},edl.dev/role=trainer").items
        for p in pods:
            if p.status.phase == "Pending" and any(c.type == "PodScheduled" and c.reason == "Unschedulable"
                                                   for c in p.status.conditions or []):
                self.unschedulable.add(p.metadata.name)
        return [p for p in pods if p.status.phase == "Running" and p.metadata.deletion_timestamp is None]

    def reason(self) -> tuple[str, str]:
        from kubernetes.client.exceptions import ApiException

        from edl.cluster.demand_lease import REASON_ANNOTATION

        try:
            lease = self.coord.read_namespaced_lease(f"edl-{JOB}-demand", NAMESPACE)
        except ApiException:
            return "", ""
        raw = (lease.metadata.annotations or {}).get(REASON_ANNOTATION)
        said = json.loads(raw) if raw else {}
        cause, text = said.get("cause", ""), said.get("text", "")
        if not self.reasons or self.reasons[-1][1:] != (cause, text):
            self.reasons.append((round(time.time() - self.t0, 2), cause, text))
        return cause, text

    def until(self, what: str, pred, timeout_s: float, t0: float, launcher: subprocess.Popen) -> float:
        """Poll every 0.5 s until ``pred(running trainers)``; the time it took, from ``t0``."""
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            if launcher.poll() is not None:
                raise SystemExit(f"grow_back_cluster: the job ended (exit {launcher.returncode}) while waiting "
                                 f"for {what}")
            running = len(self.trainers())
            self.reason()
            if pred(running):
                return time.time() - t0
            time.sleep(0.5)
        raise SystemExit(f"grow_back_cluster: no {what} within {timeout_s:.0f} s; reasons: {self.reasons[-3:]}")


def run(a: argparse.Namespace, work: Path, console: Console) -> dict:
    from kubernetes import client, config

    api = config.new_client_from_config(os.environ["KUBECONFIG"])
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    sched, coord = client.SchedulingV1Api(api), client.CoordinationV1Api(api)
    for name, value in PRIORITY_CLASSES.items():
        try:
            sched.create_priority_class(client.V1PriorityClass(metadata=client.V1ObjectMeta(name=name), value=value))
        except client.exceptions.ApiException as e:
            if e.status != 409:
                raise
    data = "s3://soak-data/growback"
    args = launch_args(JOB, NAMESPACE, data, 1000, f"s3://soak/growback-{int(time.time())}", (1, MAX_TRAINERS, 1),
                       "--priority-class", "edl-low", "--sidecar-period", str(a.period))
    prepare(core, work, NAMESPACE, args, data, console)
    log = (work / "launcher.log").open("wb")
    launcher = subprocess.Popen([sys.executable, "-m", "edl", "launch", *args, "--kubeconfig",
                                 os.environ["KUBECONFIG"], "--master-via", "pod-ip"],
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    watch = Watch(core, coord)
    t0 = watch.t0
    try:
        with console.status("growing to six trainers ..."):
            watch.until("six trainers training", lambda n: n == MAX_TRAINERS and
                        f"→ {MAX_TRAINERS} trainers" in (work / "launcher.log").read_text(errors="replace"),
                        600, t0, launcher)
        image = f"{os.environ['EDL_REGISTRY']}/edl-runtime:0.1.0"
        apps.create_namespaced_deployment(NAMESPACE, web(image))
        t_web = time.time()
        with console.status("the higher-priority Deployment takes its capacity ..."):
            watch.until("the Deployment Ready", lambda n: (apps.read_namespaced_deployment("web", NAMESPACE).status
                                                           .ready_replicas or 0) == 3, 300, t_web, launcher)
            shrunk_s = watch.until("the job at three trainers or fewer", lambda n: n <= 3, 120, t_web, launcher)
            settle = time.time() + 2 * a.period  # whatever replacement the launcher would start, it has
            while time.time() < settle:
                smaller = len(watch.trainers())
                watch.reason()
                time.sleep(0.5)
        during = watch.reasons[-1][1:] if watch.reasons else ("", "")
        apps.delete_namespaced_deployment("web", NAMESPACE)
        with console.status("the Deployment leaves ..."):
            watch.until("the Deployment's pods gone", lambda n: not core.list_namespaced_pod(
                NAMESPACE, label_selector="app=web").items, 120, time.time(), launcher)
        t_free = time.time()
        grown = None
        with console.status("growing back ..."):
            try:
                grown = watch.until("growth back to six trainers", lambda n: n == MAX_TRAINERS, 10 * a.period,
                                    t_free, launcher)
            except SystemExit as e:
                console.print(str(e))
        after = watch.reason()
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGTERM)
        launcher.wait(120)
        log.close()
        try:
            apps.delete_namespaced_deployment("web", NAMESPACE)
        except client.exceptions.ApiException:
            pass
    return {"period_s": a.period, "shrink_s": round(shrunk_s, 2), "trainers_while_the_work_ran": smaller,
            "reason_while_the_work_ran": {"cause": during[0], "text": during[1]},
            "unschedulable_trainer_pods": sorted(watch.unschedulable),
            "grow_back_s": None if grown is None else round(grown, 2),
            "grow_back_periods": None if grown is None else round(grown / a.period, 2),
            "reason_after": {"cause": after[0], "text": after[1]},
            "master_restarts": (work / "launcher.log").read_text(errors="replace").count("master lost"),
            "work_arrived_s": round(t_web - t0, 2), "work_gone_s": round(t_free - t0, 2),
            "reasons": [{"t": t, "cause": c, "text": x} for t, c, x in watch.reasons]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="edl: a job on ./dev cluster gives capacity to a higher-priority "
                                            "Deployment and grows back when it leaves; prints how long each took")
    p.add_argument("--period", type=float, default=10.0, help="the sidecar's period in seconds; default 10")
    p.add_argument("--out", default=None, help="result JSON; default bench/results/grow_back_cluster.json")
    a = p.parse_args(argv)
    if a.period <= 0:
        p.error("--period must be positive")
    missing = [k for k in NEEDS if not os.environ.get(k)]
    if missing:
        p.error(f"{', '.join(missing)} not set: run eval \"$(./dev cluster up --nodes 4 --cpu 2)\" first")
    sys.path.insert(0, str(ROOT))
    console = Console()
    with tempfile.TemporaryDirectory(prefix="edl-grow-back-") as d:
        res = run(a, Path(d), console)
    if a.out:
        Path(a.out).write_text(json.dumps(res, indent=2) + "\n")
    else:
        write_result("grow_back_cluster", res)
    console.print(f"shrunk to {res['trainers_while_the_work_ran']} trainers {res['shrink_s']} s after the work "
                  f"arrived ({res['reason_while_the_work_ran']['text']}); trainer pods with no room: "
                  f"{len(res['unschedulable_trainer_pods'])}")
    if res["grow_back_s"] is None:
        console.print(f"not grown back within {10 * a.period:.0f} s: {res['reason_after']['text']}")
        return 1
    console.print(f"grown back to {MAX_TRAINERS} trainers {res['grow_back_s']} s after the work's pods were gone "
                  f"({res['grow_back_periods']} sidecar periods)")
    return 0 if not res["unschedulable_trainer_pods"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
