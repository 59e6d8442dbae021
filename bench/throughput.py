"""Steady-state throughput: edl with 2 trainers vs the framework's own data parallelism, and the cost of checkpoints.

    python bench/throughput.py [--framework paddle|torch] [--rounds 14] [--window 5]

Three contenders run at once on the same model (edl.zoo.mlp, or edl.zoo.torch.mlp), batch per
trainer and data: the peer (``paddle.distributed.launch --nproc_per_node 2`` with
``paddle.DataParallel``, or ``torchrun --nproc_per_node 2`` with ``DistributedDataParallel``, one
thread per worker as torchrun sets it); ``edl train`` with 2 trainers and no checkpoints;
``edl train`` with a checkpoint every 30 s. Only one runs at a time: the others
are frozen with SIGSTOP, and the contenders take turns in short windows for
several rounds. So all three see the same machine
(this one is noisy: its speed drifts by tens of percent over minutes) and the
ratios are paired per round. edl's step count is the master's, which hears it
with each heartbeat (about once a second): each window's ends are read as the count
moves (``fresh_count``), so that neither end is up to a second old. Windows stay
short (5 s, and about a second at each end for the count to move): a job is frozen for
two turns, and a trainer frozen mid-collective for over 15 s is taken by its master for
one held up by a stuck peer.
With ``--compare-src DIR`` the checkpointing run is replaced by the same edl job
imported from DIR (another version's ``src``): an A/B of two versions, written to
bench/results/throughput_ab.json. The table also gives each contender's CPU per
step, in its training processes and in the rest (launcher, master).
Prints a table and writes bench/results/throughput.json (throughput_torch.json for PyTorch).
"""

from __future__ import annotations

import argparse
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


def process_tree(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def signal_tree(root: int, sig: int = signal.SIGKILL) -> None:
    """``sig`` to every process under ``root``, those gone already skipped (paddle.distributed.launch puts
    its workers in sessions of their own: a process group does not reach them)."""
    for pid in process_tree(root):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of one process (0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _is_worker(pid: int) -> bool:
    """A training process (an edl trainer, a DataParallel or DDP worker), not a launcher or a master."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return b"trainer" in argv or any(a.endswith((b"_paddle_dp.py", b"_torch_ddp.py")) for a in argv)


def fresh_count(counter, every_s: float = 0.02, limit_s: float = 2.0) -> tuple[int, float]:
    """The count as it moves, and when: ``counter`` is read until its value changes, and the new value is
    taken with the time it was first seen. edl's count is the master's, which hears it with each trainer's
    heartbeat (about once a second), so a read at an arbitrary moment is up to a second old; and after a
    thaw the heartbeats come in step with the bench's own sleeps, so that age was not even random: a window
    could gain or lose up to a second's steps in six. Read as it moves, a count is as old as one read (tens
    of milliseconds), for DataParallel's per-step count as for edl's."""
    first, deadline = counter(), time.monotonic() + limit_s
    while time.monotonic() < deadline:
        time.sleep(every_s)
        value = counter()
        if value != first:
            return value, time.monotonic()
    return first, time.monotonic()


class Contender:
    def __init__(self, name: str, pgid: int, counter, samples_per_step: int) -> None:
        self.name, self.pgid, self.counter, self.samples_per_step = name, pgid, counter, samples_per_step
        self.rates: list[float] = []
        self.cpu = {"workers": 0.0, "others": 0.0}  # CPU seconds spent in the measured windows
        self.steps = 0

    def _cpu(self) -> dict[int, float]:
        return {pid: _cpu_s(pid) for pid in process_tree(self.pgid)}

    def _signal(self, sig: int) -> None:
        signal_tree(self.pgid, sig)

    def freeze(self) -> None:
        self._signal(signal.SIGSTOP)

    def thaw(self) -> None:
        self._signal(signal.SIGCONT)

    def measure(self, window: float) -> float:
        self.thaw()
        # The count's first move after the thaw is the step in flight, or the heartbeat held over the freeze:
        # the window starts at its next move (about a second for edl, a step or two for DataParallel).
        fresh_count(self.counter)
        c0, t0 = fresh_count(self.counter)
        cpu0 = self._cpu()
        time.sleep(window)
        c1, t1 = fresh_count(self.counter)
        cpu1 = self._cpu()
        self.freeze()
        for pid, v in cpu1.items():
            self.cpu["workers" if _is_worker(pid) else "others"] += v - cpu0.get(pid, 0.0)
        self.steps += c1 - c0
        rate = (c1 - c0) * self.samples_per_step / (t1 - t0)
        self.rates.append(rate)
        return rate


def main() -> int:
    p = argparse.ArgumentParser(description="edl vs the framework's data parallelism: throughput (interleaved)")
    p.add_argument("--framework", choices=("paddle", "torch"), default="paddle",
                   help="paddle: edl.zoo.mlp against paddle.DataParallel; torch: edl.zoo.torch.mlp against "
                        "DistributedDataParallel under torchrun (default paddle)")
    p.add_argument("--rounds", type=int, default=14, help="turns per contender (default 14)")
    p.add_argument("--window", type=float, default=5.0,
                   help="seconds measured per turn (default 5; a turn also waits about a second for the count to "
                        "move at each end, and over 15 s frozen a job takes its trainers for stuck)")
    p.add_argument("--batch-size", type=int, default=256, help="records per trainer per step (default 256)")
    p.add_argument("--rows", type=int, default=100000, help="synthetic rows (default 100000)")
    p.add_argument("--compare-src", metavar="DIR", help="replace the checkpointing run by edl imported from DIR "
                   "(e.g. `git archive BASE src | tar -x -C /tmp/base`, then /tmp/base/src): an A/B of two versions")
    a = p.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a timeout still cleans up (``finally``)
    console = Console()
    os.environ["EDL_LEASE_S"] = "600"  # a frozen job must not declare its own trainers dead
    procs: list[subprocess.Popen] = []
    jobs: list[EdlJob] = []
    with tempfile.TemporaryDirectory(prefix="edl-bench-") as d:
        tmp = Path(d)
        from edl.data.prepare import prepare_synthetic

        prepare_synthetic(str(tmp / "data"), a.rows, 256, 10, shards=8)
        data = tmp / "data" / "train"
        step_samples = a.batch_size * 2
        try:
            progress = tmp / "dp-progress"
            if a.framework == "torch":
                peer_name, model_def = "torch DDP (torchrun)", "edl.zoo.torch.mlp"
                cmd = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                       str(ROOT / "bench" / "_torch_ddp.py"), "--workdir", str(tmp), "--snapshot-every", "0"]
            else:
                peer_name, model_def = "paddle.DataParallel", "edl.zoo.mlp"
                cmd = ["-m", "paddle.distributed.launch", "--nproc_per_node", "2", "--log_dir", str(tmp / "dp-logs"),
                       str(ROOT / "bench" / "_paddle_dp.py")]
            dp = subprocess.Popen([sys.executable, *cmd, "--data", str(data), "--batch-size", str(a.batch_size),
                                   "--progress", str(progress)],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
            procs.append(dp)

            def dp_steps() -> int:
                try:
                    return int(progress.read_text().strip() or 0)
                except (OSError, ValueError):
                    return 0

            contenders = [Contender(peer_name, dp.pid, dp_steps, step_samples)]
            runs = [("edl", "1e9", None), ("edl + checkpoint every 30 s", "30", None)]
            if a.compare_src:  # in place of the checkpointing run: the same job from another tree's edl
                runs[1] = (f"edl from {a.compare_src}", "1e9", a.compare_src)
            for name, interval, src in runs:
                if src:
                    os.environ["PYTHONPATH"] = src  # before the venv's own edl, for the job's every process
                job = EdlJob(f"tp-{len(jobs)}", [
                    "--model-def", model_def, "--data", str(data), "--epochs", "1000",
                    "--batch-size", str(a.batch_size), "--min-trainers", "2", "--max-trainers", "2",
                    "--trainers", "2", "--checkpoint-uri", str(tmp / f"ckpt-{len(jobs)}"),
                    "--checkpoint-interval", interval, "--rows-per-task", str(a.batch_size * 8),
                    # Frozen in the others' turns, the launcher is silent that long (its master's clock
                    # runs on): its dead-man switch must not end the job.
                    "--launcher-timeout", "3600",
                ], tmp / "home", tmp / f"edl-{len(jobs)}.log")
                os.environ.pop("PYTHONPATH", None) if src else None
                jobs.append(job)
                contenders.append(Contender(name, job.proc.pid, lambda j=job: (j.status() or {}).get("step", 0),
                                            step_samples))
            console.print("warming up all three ...")
            deadline = time.monotonic() + 120
            while dp_steps() < 5 or any((j.status() or {}).get("step", 0) < 5 for j in jobs):
                if time.monotonic() > deadline:
                    raise RuntimeError("contenders did not start")
                time.sleep(0.5)
            for c in contenders:
                c.freeze()
            for r in range(a.rounds):
                # Always in the same order: any other order freezes a job for more than two windows
                # between its turns (see ``--window``).
                rates = [c.measure(a.window) for c in contenders]
                console.print(f"round {r + 1}/{a.rounds}: " + ", ".join(f"{c.name} {x:.0f}" for c, x in zip(contenders, rates)))
            for c in contenders:
                c.thaw()
            ckpts = len((jobs[1].status() or {"checkpoints": []})["checkpoints"])
        finally:
            for root in [j.proc.pid for j in jobs] + [pr.pid for pr in procs]:
                signal_tree(root, signal.SIGCONT)
            for j in jobs:
                j.stop()
            for pr in procs:
                signal_tree(pr.pid)
                pr.wait()
    dp_c, edl_c, ck_c = contenders
    per_round = [e / d for e, d in zip(edl_c.rates, dp_c.rates)]
    ck_round = [k / e for k, e in zip(ck_c.rates, edl_c.rates)]
    result = {
        "framework": a.framework, "peer": peer_name,
        "model": f"{model_def} (256-1024-1024-1024-10)", "batch_per_trainer": a.batch_size, "trainers": 2,
        "rounds": a.rounds, "window_s": a.window,
        "samples_per_s": {c.name: c.rates for c in contenders},
        "mean_samples_per_s": {c.name: statistics.mean(c.rates) for c in contenders},
        "edl_over_peer": statistics.mean(edl_c.rates) / statistics.mean(dp_c.rates),
        "edl_over_peer_median_round": statistics.median(per_round),
        "edl_over_paddle_dp": statistics.mean(edl_c.rates) / statistics.mean(dp_c.rates),
        "edl_over_paddle_dp_per_round": per_round,
        "edl_over_paddle_dp_median_round": statistics.median(per_round),
        **({"compare_src": a.compare_src,
            "edl_over_compare_per_round": [e / k for e, k in zip(edl_c.rates, ck_c.rates)],
            "edl_over_compare_median_round": statistics.median(e / k for e, k in zip(edl_c.rates, ck_c.rates)),
            "compare_over_paddle_dp_median_round": statistics.median(k / d for k, d in zip(ck_c.rates, dp_c.rates))}
           if a.compare_src else
           {"checkpoint_cost": 1 - statistics.mean(ck_c.rates) / statistics.mean(edl_c.rates),
            "checkpoints_written": ckpts}),
        # Where the CPU went, per step of the job: in its training processes, and in the rest (edl's
        # launcher and master, paddle.distributed.launch). The machine has os.cpu_count() cores.
        "cpu_ms_per_step": {c.name: {k: 1e3 * v / max(c.steps, 1) for k, v in c.cpu.items()} for c in contenders},
        "cpu_count": os.cpu_count(),
    }
    name = "throughput_ab" if a.compare_src else "throughput"
    path = write_result(name if a.framework == "paddle" else f"{name}_torch", result)
    t = Table(title=f"steady-state throughput, 2 trainers, {a.rounds} interleaved rounds of {a.window:.0f} s")
    t.add_column("run")
    t.add_column("samples/s (mean)", justify="right")
    t.add_column(f"ratio to {peer_name}", justify="right")
    t.add_column("CPU ms/step: workers", justify="right")
    t.add_column("others", justify="right")
    base = statistics.mean(dp_c.rates)
    for c in contenders:
        m = statistics.mean(c.rates)
        cpu = result["cpu_ms_per_step"][c.name]
        t.add_row(c.name, f"{m:.0f}", f"{m / base:.3f}", f"{cpu['workers']:.0f}", f"{cpu['others']:.0f}")
    console.print(t)
    if a.compare_src:
        console.print(f"edl / Paddle DP = {result['edl_over_paddle_dp']:.3f} (median round "
                      f"{statistics.median(per_round):.3f}); edl / edl from {a.compare_src}: median round "
                      f"{result['edl_over_compare_median_round']:.3f}; that one / Paddle DP: median round "
                      f"{result['compare_over_paddle_dp_median_round']:.3f}; written to {path}")
        return 0
    console.print(
        f"edl / {peer_name} = {result['edl_over_paddle_dp']:.3f} (per round {min(per_round):.3f}..{max(per_round):.3f}, "
        f"median {statistics.median(per_round):.3f}; "
        f"target ≥ 1.00); checkpoint every 30 s costs {100 * result['checkpoint_cost']:.1f} % "
        f"(per round {100 * (1 - max(ck_round)):.1f}..{100 * (1 - min(ck_round)):.1f} %; target ≤ 3 %; "
        f"{ckpts} checkpoints written); written to {path}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
