"""The soak on a cluster: one ``edl launch`` job on ``./dev cluster`` under a seeded rain of cluster faults.

    eval "$(./dev cluster up --nodes 3 --cpu 2)"
    python bench/soak_cluster.py [--epochs 6] [--interval 15] [--seed 1] [--kinds K,K,...]

``edl.zoo.mlp`` on 40,000 synthetic rows of 256 features in the cluster's MinIO, 1..3 trainers of 1 CPU
(the autoscale sidecar sizes the job), a checkpoint every 4 s, ``--audit``, the launcher on this
machine (``--master-via pod-ip``). One fault every ``--interval`` seconds on average, drawn from:

- ``pod-delete``: a trainer pod deleted as the scheduler preempts one (its grace period, SIGTERM first);
- ``pod-kill``: a trainer pod deleted with no grace period (SIGKILL);
- ``master-delete``: the serving master pod deleted (its spare takes over);
- ``node-lost``: a trainer's node lost for 20 s (its link cut: the node goes Unknown, its pods run on
  unreachable and are evicted; the launcher replaces them after ``--node-lost-timeout 15``);
- ``apiserver-stop``: the apiserver stopped (SIGSTOP) for 10 s.

The same report as ``bench/soak.py``: the effective training time ratio from the audit's records of the
final model's steps, each kind's count and lost seconds. Writes bench/results/soak_cluster.json and
docs/soak-cluster.png.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from rich.console import Console
from rich.progress import Progress, TextColumn, TimeElapsedColumn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ROOT, provenance  # noqa: E402
from soak import Fault, _signal, account, made_steps, parse_kinds, report, result  # noqa: E402

from edl.cluster.manifests import master_selector  # noqa: E402
from edl.storage.audit import kept_steps, read_audit_lines  # noqa: E402
from edl.storage.store import open_store  # noqa: E402

KINDS = ("pod-delete", "pod-kill", "master-delete", "node-lost", "apiserver-stop")
NAMESPACE = "soak"
JOB = "soak"
NEEDS = ("KUBECONFIG", "AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "EDL_REGISTRY")


class ClusterSoak:
    def __init__(self, core, state, rng: random.Random) -> None:
        self.core, self.state, self.rng = core, state, rng
        self.faults: list[Fault] = []
        self.timers: list[threading.Timer] = []
        self.stopped: set[int] = set()  # pids under SIGSTOP now
        self.cut: set[str] = set()  # nodes whose link is cut now

    def pods(self, labels: dict[str, str]) -> list:
        selector = ",".join(f"{k}={v}" for k, v in labels.items())
        return [p for p in self.core.list_namespaced_pod(NAMESPACE, label_selector=selector).items
                if p.status.phase == "Running" and p.metadata.deletion_timestamp is None]

    def _pause(self, pid: int, seconds: float) -> bool:
        if pid in self.stopped or not _signal(pid, signal.SIGSTOP):
            return False
        self.stopped.add(pid)

        def resume() -> None:
            _signal(pid, signal.SIGCONT)
            self.stopped.discard(pid)

        timer = threading.Timer(seconds, resume)
        timer.start()
        self.timers.append(timer)
        return True

    def _cut(self, node, seconds: float) -> bool:
        """The node's link cut for ``seconds``: nothing reaches it, its pods run on."""
        from tests.plane.network import PlaneNet

        if node.name in self.cut:
            return False
        net = PlaneNet(self.state.base)
        net.cut(node.index)
        self.cut.add(node.name)

        def mend() -> None:
            net.mend(node.index)
            self.cut.discard(node.name)

        timer = threading.Timer(seconds, mend)
        timer.start()
        self.timers.append(timer)
        return True

    def fault(self, kind: str) -> None:
        from kubernetes.client.exceptions import ApiException

        detail = ""
        try:
            if kind in ("pod-delete", "pod-kill", "node-lost"):
                trainers = self.pods({"edl.dev/job": JOB, "edl.dev/role": "trainer"})
                if not trainers:
                    return
                pod = self.rng.choice(trainers)
                detail = pod.metadata.name
                if kind == "node-lost":
                    node = next((n for n in self.state.nodes if n.name == pod.spec.node_name), None)
                    if node is None or not self._cut(node, 20.0):
                        return
                    on_it = sorted(p.metadata.name for p in trainers if p.spec.node_name == node.name)
                    detail = f"{node.name}: {', '.join(on_it)}"
                else:
                    self.core.delete_namespaced_pod(pod.metadata.name, NAMESPACE,
                                                    grace_period_seconds=0 if kind == "pod-kill" else None)
            elif kind == "master-delete":
                masters = self.pods(master_selector(JOB))  # the serving master (the Service's), not its spare
                if not masters:
                    return
                self.core.delete_namespaced_pod(masters[0].metadata.name, NAMESPACE)
            elif kind == "apiserver-stop":
                if not self._pause(self.state.pids["kube-apiserver"], 10.0):
                    return
        except ApiException:
            return  # the apiserver is stopped, or the pod went meanwhile: no fault this time
        except OSError:
            return
        self.faults.append(Fault(time.time(), kind, detail))


def edl(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "edl", *args], capture_output=True, text=True, **kw)


def prepare(core, work: Path, namespace: str, launch_args: list[str], data: str, console: Console) -> None:
    """The namespace, the S3 Secret, edl's RBAC (``edl k8s render`` of ``launch_args``) and the data in MinIO
    at ``data`` (40,000 rows of 256 features; ``DATA/train`` is the training split). Idempotent."""
    from kubernetes import client

    from edl.data.prepare import prepare_synthetic

    try:
        core.create_namespace({"metadata": {"name": namespace}})
    except client.exceptions.ApiException as e:
        if e.status != 409:
            raise
    env = {k: os.environ[k] for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL")}
    try:
        core.create_namespaced_secret(namespace, {"metadata": {"name": "minio"}, "stringData": env})
    except client.exceptions.ApiException as e:
        if e.status != 409:
            raise
    r = edl("k8s", "render", *launch_args, "--out", str(work / "k8s"), timeout=120)
    if r.returncode != 0:
        raise SystemExit(f"edl k8s render failed: {r.stderr.strip()}")
    import yaml
    from kubernetes import utils

    for obj in yaml.safe_load_all((work / "k8s" / "00-rbac.yaml").read_text()):
        if not obj:
            continue
        try:
            utils.create_from_dict(core.api_client, obj, namespace=namespace)
        except utils.FailToCreateError as e:
            if not all(getattr(x, "status", None) == 409 for x in e.api_exceptions):
                raise
    console.print("preparing 40,000 rows in MinIO ...")
    prepare_synthetic(data, 40000, 256, 10)


def launch_args(job: str, namespace: str, data: str, epochs: int, checkpoints: str, trainers: tuple[int, int, int],
                *extra: str) -> list[str]:
    """``edl launch``'s flags for ``edl.zoo.mlp`` on ``DATA/train`` with 1-CPU trainers (min, max, first)."""
    reg = os.environ["EDL_REGISTRY"]
    lo, hi, first = trainers
    return ["--job-name", job, "--model-def", "edl.zoo.mlp", "--data", f"{data}/train", "--epochs", str(epochs),
            "--batch-size", "64", "--min-trainers", str(lo), "--max-trainers", str(hi), "--trainers", str(first),
            "--checkpoint-uri", checkpoints, "--s3-secret", "minio", "--namespace", namespace,
            "--trainer-cpu", "1", "--trainer-memory", "2Gi", "--image", f"{reg}/edl-runtime:0.1.0",
            "--trainer-image", f"{reg}/edl-trainer-cpu:0.1.0", *extra]


def common_args(a: argparse.Namespace) -> list[str]:
    return launch_args(JOB, NAMESPACE, f"s3://soak-data/{a.seed}", a.epochs, a.checkpoints, (1, 3, 2),
                       "--checkpoint-interval", "4")


def run(a: argparse.Namespace, work: Path, console: Console) -> dict:
    from kubernetes import client, config

    from tests.plane.plane import PlaneState

    state = PlaneState.load(Path(os.environ["KUBECONFIG"]).resolve().parent)
    if state is None:
        raise SystemExit("soak_cluster: KUBECONFIG is not a ./dev cluster's (no plane.json beside it)")
    core = client.CoreV1Api(config.new_client_from_config(os.environ["KUBECONFIG"]))
    prepare(core, work, NAMESPACE, common_args(a), f"s3://soak-data/{a.seed}", console)
    rng = random.Random(a.seed)
    soak = ClusterSoak(core, state, rng)
    t0 = time.time()
    log = (work / "launcher.log").open("wb")
    launcher = subprocess.Popen([sys.executable, "-m", "edl", "launch", *common_args(a), "--audit",
                                 "--kubeconfig", os.environ["KUBECONFIG"], "--master-via", "pod-ip",
                                 "--node-lost-timeout", "15", "--summary-out", str(work / "summary.json")],
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        next_at = time.time() + 60  # the job's start: pods pulled and training
        with Progress(TextColumn("{task.description}"), TextColumn("{task.fields[info]}"), TimeElapsedColumn(),
                      console=console, transient=True) as bar:
            task = bar.add_task("cluster soak", info="starting")
            while launcher.poll() is None:
                if time.time() >= next_at:
                    soak.fault(rng.choice(a.kinds))
                    next_at = time.time() + rng.uniform(a.interval * 2 / 3, a.interval * 4 / 3)
                    bar.update(task, info=f"{len(soak.faults)} faults")
                time.sleep(0.2)
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGTERM)
        code = launcher.wait()
        log.close()
        for timer in soak.timers:
            timer.cancel()
            timer.function(*timer.args)  # nothing left stopped
    summary = json.loads((work / "summary.json").read_text()) if (work / "summary.json").exists() else {}
    lines = list(read_audit_lines(open_store(a.checkpoints, "--checkpoint-uri")))
    kept = kept_steps(lines)
    acc = account(kept, soak.faults)
    return {**provenance("bench/soak_cluster.py", sys.argv[1:]),
            **result(a, a.epochs, code, summary, soak.faults, t0, acc,
                     len(made_steps(lines) - {(k.key, k.step) for k in kept}))}


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="edl: one job on ./dev cluster under a seeded rain of cluster faults; "
                                            "prints the effective training time ratio and what each fault cost")
    p.add_argument("--epochs", type=int, default=6, help="the job's epochs; default 6")
    p.add_argument("--interval", type=float, default=15.0,
                   help="mean seconds between faults (each gap uniform in 2/3..4/3 of it); default 15")
    p.add_argument("--seed", type=int, default=1, help="seed of the fault schedule (and the job's data prefix)")
    p.add_argument("--kinds", default=",".join(KINDS),
                   help=f"comma-separated faults to draw from; default all: {','.join(KINDS)}")
    p.add_argument("--keep", default=None, metavar="DIR",
                   help="work in DIR and leave it there (the launcher's log, the rendered objects); default a "
                        "temporary directory, removed at the end")
    p.add_argument("--out", default=None, help="result JSON; default bench/results/soak_cluster.json")
    p.add_argument("--plot", default=str(ROOT / "docs" / "soak-cluster.png"),
                   help="figure of the steps with the faults marked; '' for none")
    a = p.parse_args(argv)
    a.kinds = parse_kinds(p, a.kinds, KINDS)
    if a.epochs < 1 or a.interval <= 0:
        p.error("--epochs must be at least 1 and --interval positive")
    a.checkpoints = f"s3://soak/run-{int(time.time())}"  # a fresh job each run, never one resumed
    missing = [k for k in NEEDS if not os.environ.get(k)]
    if missing:
        p.error(f"{', '.join(missing)} not set: run eval \"$(./dev cluster up --nodes 3 --cpu 2)\" first")
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    sys.path.insert(0, str(ROOT))
    console = Console()
    if a.keep:
        Path(a.keep).mkdir(parents=True, exist_ok=True)
        res = run(a, Path(a.keep), console)
    else:
        with tempfile.TemporaryDirectory(prefix="edl-soak-cluster-") as d:
            res = run(a, Path(d), console)
    return report(res, "soak_cluster", a.out, a.plot, console)


if __name__ == "__main__":
    raise SystemExit(main())
