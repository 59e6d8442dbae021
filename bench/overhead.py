"""Where the CPU of a steady 2-trainer job goes, process by process and thread by thread, edl beside
``paddle.DataParallel``.

    python bench/overhead.py [--window 30] [--rounds 2] [--compare-src DIR]

The same job as ``bench/throughput.py`` (edl.zoo.mlp, 256 records per trainer per step, 2 trainers), but
one contender at a time and for a longer window: each is started, warmed up (past its fifth step and
the start of edl's spare master), measured for ``--window`` seconds and stopped; the contenders take
turns for ``--rounds`` rounds. For every process of a contender (edl: launcher, master, spare master,
each trainer; DataParallel: its launcher and workers) and every thread in it, the CPU time spent in the
window (``/proc/PID/task/TID/stat``) is reported per second and per step. Threads are told apart by
name: ``bench/_threadnames`` goes first on the contenders' PYTHONPATH and gives each Python thread its
name as the OS's. The launcher's and the master's costs are mostly paid per second whatever the step
rate (their polls), the trainers' per step. ``--compare-src DIR`` adds the same edl job imported from
DIR (another version's ``src``): an A/B of two versions. Prints a table and writes
bench/results/overhead.json.
"""

from __future__ import annotations

import argparse
import collections
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ROOT, EdlJob, write_result  # noqa: E402
from throughput import process_tree, signal_tree  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")
THREAD_NAMES = ROOT / "bench" / "_threadnames"


def role(pid: int) -> str:
    """What a process of a contender is, from its command line."""
    try:
        argv = [a.decode(errors="replace") for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if a]
    except OSError:
        return "?"
    if "trainer" in argv:
        return "trainer"
    if "master" in argv:
        return "spare master" if "--standby" in argv else "master"
    if "train" in argv:
        return "launcher"
    if any(a.endswith("_paddle_dp.py") for a in argv):
        return "DataParallel worker"
    if "paddle.distributed.launch" in argv:
        return "paddle.distributed.launch"
    return " ".join(argv)[:40]


def cpu_by_thread(root: int) -> dict[tuple[int, int], tuple[str, str, float]]:
    """(pid, tid) -> (role, thread name, CPU seconds) for every thread of the tree under ``root``."""
    out = {}
    for pid in process_tree(root):
        r = role(pid)
        for task in Path(f"/proc/{pid}/task").glob("*"):
            try:
                fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
                name = (task / "comm").read_text().strip()
            except OSError:
                continue
            out[(pid, int(task.name))] = (r, name, (int(fields[11]) + int(fields[12])) / TICK)
    return out


class Run:
    """One contender: how to start it, count its steps and stop it; what its windows measured."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.seconds = 0.0
        self.steps = 0
        self.by_role: collections.Counter[str] = collections.Counter()  # CPU seconds, summed over windows
        self.by_thread: collections.Counter[tuple[str, str]] = collections.Counter()
        self.rates: list[float] = []  # steps per second, per window

    def measure(self, root: int, steps, window: float) -> None:
        c0, s0, t0 = cpu_by_thread(root), steps(), time.monotonic()
        time.sleep(window)
        c1, s1, t1 = cpu_by_thread(root), steps(), time.monotonic()
        for key, (r, name, v) in c1.items():
            spent = v - c0.get(key, (r, name, 0.0))[2]
            self.by_role[r] += spent
            self.by_thread[(r, _thread(name))] += spent
        self.seconds += t1 - t0
        self.steps += s1 - s0
        self.rates.append((s1 - s0) / (t1 - t0))


def _thread(name: str) -> str:
    # A process's main thread carries the program's name ("python"); edl's threads their own.
    return "main" if name.startswith("python") else name


def main() -> int:
    p = argparse.ArgumentParser(description="CPU per process and thread: edl vs Paddle DataParallel")
    p.add_argument("--window", type=float, default=30.0, help="seconds measured per turn (default 30)")
    p.add_argument("--rounds", type=int, default=2, help="turns per contender (default 2)")
    p.add_argument("--batch-size", type=int, default=256, help="records per trainer per step (default 256)")
    p.add_argument("--rows", type=int, default=100000, help="synthetic rows (default 100000)")
    p.add_argument("--compare-src", metavar="DIR", help="also edl imported from DIR (another version's src)")
    a = p.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    console = Console()
    own_path = os.environ.get("PYTHONPATH", "")
    runs = [Run("paddle.DataParallel"), Run("edl")] + ([Run(f"edl from {a.compare_src}")] if a.compare_src else [])
    with tempfile.TemporaryDirectory(prefix="edl-overhead-") as d:
        tmp = Path(d)
        from edl.data.prepare import prepare_synthetic

        prepare_synthetic(str(tmp / "data"), a.rows, 256, 10, shards=8)
        data = tmp / "data" / "train"
        for r in range(a.rounds):
            for k, run in enumerate(runs if r % 2 == 0 else runs[::-1]):  # turns in alternating order
                src = a.compare_src if run.name.startswith("edl from") else own_path
                os.environ["PYTHONPATH"] = os.pathsep.join(x for x in (str(THREAD_NAMES), src) if x)
                tag = f"{r}-{k}"
                if run.name == "paddle.DataParallel":
                    _measure_dp(run, tmp, data, tag, a)
                else:
                    _measure_edl(run, tmp, data, tag, a)
                os.environ["PYTHONPATH"] = own_path
                console.print(f"round {r + 1}/{a.rounds}: {run.name}: {run.rates[-1]:.2f} steps/s")
    result = {
        "model": "edl.zoo.mlp (256-1024-1024-1024-10)", "batch_per_trainer": a.batch_size, "trainers": 2,
        "rounds": a.rounds, "window_s": a.window, "cpu_count": os.cpu_count(),
        "contenders": {
            run.name: {
                "steps_per_s": statistics.mean(run.rates), "steps_per_s_per_round": run.rates,
                "cpu_ms_per_s": {k: 1e3 * v / run.seconds for k, v in sorted(run.by_role.items())},
                "cpu_ms_per_step": {k: 1e3 * v / max(run.steps, 1) for k, v in sorted(run.by_role.items())},
                "threads_cpu_ms_per_s": {f"{r}/{t}": 1e3 * v / run.seconds
                                         for (r, t), v in sorted(run.by_thread.items()) if v > 0},
            } for run in runs
        },
        **({"compare_src": a.compare_src} if a.compare_src else {}),
    }
    path = write_result("overhead", result)
    t = Table(title=f"CPU per process and thread, 2 trainers, {a.rounds} turns of {a.window:.0f} s each")
    t.add_column("contender")
    t.add_column("process / thread")
    t.add_column("CPU ms/s", justify="right")
    t.add_column("CPU ms/step", justify="right")
    for run in runs:
        t.add_row(run.name, f"({statistics.mean(run.rates):.2f} steps/s)", "", "", end_section=False)
        for r, v in sorted(run.by_role.items(), key=lambda x: -x[1]):
            t.add_row("", r, f"{1e3 * v / run.seconds:.1f}", f"{1e3 * v / max(run.steps, 1):.1f}")
            for (rr, name), tv in sorted(run.by_thread.items(), key=lambda x: -x[1]):
                if rr == r and tv > 0 and len([n for (q, n) in run.by_thread if q == r]) > 1:
                    t.add_row("", f"  {name}", f"{1e3 * tv / run.seconds:.1f}", f"{1e3 * tv / max(run.steps, 1):.1f}")
        t.add_section()
    console.print(t)
    console.print(f"written to {path}")
    return 0


def _warm(steps, deadline_s: float = 180.0) -> None:
    deadline = time.monotonic() + deadline_s
    while steps() < 5:
        if time.monotonic() > deadline:
            raise RuntimeError("the contender did not start")
        time.sleep(0.5)
    time.sleep(6.0)  # past edl's spare master's start (5 s after the master) and the first checkpoints' pause


def _measure_dp(run: Run, tmp: Path, data: Path, tag: str, a: argparse.Namespace) -> None:
    progress = tmp / f"dp-progress-{tag}"
    dp = subprocess.Popen([sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", "2",
                           "--log_dir", str(tmp / f"dp-logs-{tag}"), str(ROOT / "bench" / "_paddle_dp.py"),
                           "--data", str(data), "--batch-size", str(a.batch_size), "--progress", str(progress)],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)

    def steps() -> int:
        try:
            return int(progress.read_text().strip() or 0)
        except (OSError, ValueError):
            return 0

    try:
        _warm(steps)
        run.measure(dp.pid, steps, a.window)
    finally:
        signal_tree(dp.pid)
        dp.wait()


def _measure_edl(run: Run, tmp: Path, data: Path, tag: str, a: argparse.Namespace) -> None:
    job = EdlJob(f"oh-{tag}", [
        "--model-def", "edl.zoo.mlp", "--data", str(data), "--epochs", "1000", "--batch-size", str(a.batch_size),
        "--min-trainers", "2", "--max-trainers", "2", "--trainers", "2", "--checkpoint-uri", str(tmp / f"ckpt-{tag}"),
        "--checkpoint-interval", "1e9", "--rows-per-task", str(a.batch_size * 8),
    ], tmp / "home", tmp / f"edl-{tag}.log")

    def steps() -> int:
        return (job.status() or {}).get("step", 0)

    try:
        _warm(steps)
        run.measure(job.proc.pid, steps, a.window)
    finally:
        job.stop()


if __name__ == "__main__":
    raise SystemExit(main())
