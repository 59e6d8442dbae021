"""Pauses of generation changes, and failure recovery against torchrun's restart-all elasticity.

    python bench/recovery.py

1. edl, edl.zoo.mlp: 1 trainer -> scale to 2 (scale-up pause) -> scale to 1 (drain
   pause) -> scale to 2 -> SIGKILL one trainer (failure pause, kill to next step).
2. torchrun --standalone --nproc_per_node 2 (restart-all) with the same MLP in DDP: SIGKILL one
   worker; time from the kill to the next completed step after the restart.
Prints a table and writes bench/results/recovery.json.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ROOT, EdlJob, write_result  # noqa: E402


def scale(job: EdlJob, n: int) -> None:
    subprocess.run([sys.executable, "-m", "edl", "scale", job.name, "--trainers", str(n)], check=True,
                   env={**os.environ, "EDL_HOME": str(job.home)}, stdout=subprocess.DEVNULL)


def edl_pauses(tmp: Path, data: Path, batch: int, rounds: int) -> dict:
    job = EdlJob("recovery", [
        "--model-def", "edl.zoo.mlp", "--data", str(data), "--epochs", "100", "--batch-size", str(batch),
        "--min-trainers", "1", "--max-trainers", "2", "--trainers", "1",
        "--checkpoint-uri", str(tmp / "ckpt"), "--checkpoint-interval", "1e9",
    ], tmp / "home", tmp / "edl.log")
    out: dict = {"scale_up": [], "scale_down": [], "failure": [], "kill_to_next_step_s": [], "rolled_back": []}
    try:
        st = job.wait_for(lambda s: s["step"] > 20)
        for _ in range(rounds):
            g = st["generation"]
            scale(job, 2)
            st = job.wait_for(lambda s: s["generation"] > g and s["generations"][-1]["pause_s"] is not None)
            out["scale_up"].append(st["generations"][-1]["pause_s"])
            st = job.wait_for(lambda s, n=st["step"]: s["step"] > n + 20)
            g = st["generation"]
            scale(job, 1)
            st = job.wait_for(lambda s: s["generation"] > g and s["generations"][-1]["pause_s"] is not None)
            out["scale_down"].append(st["generations"][-1]["pause_s"])
            st = job.wait_for(lambda s, n=st["step"]: s["step"] > n + 20)
        g = st["generation"]
        scale(job, 2)
        st = job.wait_for(lambda s: s["world_size"] == 2 and s["generations"][-1]["pause_s"] is not None)
        for _ in range(rounds):
            st = job.wait_for(lambda s, n=st["step"]: s["world_size"] == 2 and s["step"] > n + 20
                              and s["generations"][-1]["pause_s"] is not None)
            g = st["generation"]
            victim = next(t for t in st["trainers"] if t["rank"] == 1)
            t_kill = time.time()
            os.kill(victim["pid"], signal.SIGKILL)
            st = job.wait_for(lambda s: any(x["master_generation"] > g and x["reason"] == "failure" and x["first_step_at"] is not None
                                            for x in s["generations"]))
            # The failure generation (a replacement's scale-up may already have followed it).
            fail = next(x for x in st["generations"] if x["master_generation"] > g and x["reason"] == "failure")
            out["failure"].append(fail["pause_s"])
            out["kill_to_next_step_s"].append(fail["first_step_at"] - t_kill)
            out["rolled_back"].append(fail["rolled_back_steps"])
    finally:
        job.stop()
    return out


def torchrun_recovery(tmp: Path, data: Path, batch: int, rounds: int) -> dict:
    work = tmp / "torch"
    work.mkdir()
    log = (tmp / "torchrun.log").open("wb")
    proc = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                             "--max-restarts", str(rounds + 1), "--monitor-interval", "0.1",
                             str(ROOT / "bench" / "_torch_ddp.py"), "--data", str(data), "--workdir", str(work),
                             "--batch-size", str(batch)], stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)

    def steps() -> list[tuple[int, float]]:
        path = work / "steps.log"
        if not path.exists():
            return []
        out = []
        for line in path.read_text().splitlines():
            parts = line.split()
            if len(parts) == 2:
                out.append((int(parts[0]), float(parts[1])))
        return out

    def wait_steps(after: float, n: int, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if sum(1 for _, t in steps() if t > after) >= n:
                return
            if proc.poll() is not None:
                raise RuntimeError(f"torchrun exited with {proc.returncode}; see {tmp / 'torchrun.log'}")
            time.sleep(0.05)
        raise TimeoutError("torchrun made no progress")

    out: dict = {"kill_to_next_step_s": [], "redone_steps": []}
    try:
        wait_steps(0, 40)
        for _ in range(rounds):
            wait_steps(time.time(), 20)
            last_step = steps()[-1][0]
            pid = int((work / "pid-1").read_text())
            t_kill = time.time()
            os.kill(pid, signal.SIGKILL)
            wait_steps(t_kill, 1)
            nxt = next((s, t) for s, t in steps() if t > t_kill)
            out["kill_to_next_step_s"].append(nxt[1] - t_kill)
            out["redone_steps"].append(max(0, last_step - nxt[0] + 1))
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
    return out


def main() -> int:
    p = argparse.ArgumentParser(description="edl pauses and failure recovery vs torchrun")
    p.add_argument("--rounds", type=int, default=3, help="repetitions of each disturbance (default 3)")
    p.add_argument("--batch-size", type=int, default=256, help="records per trainer per step (default 256)")
    a = p.parse_args()
    console = Console()
    with tempfile.TemporaryDirectory(prefix="edl-bench-") as d:
        tmp = Path(d)
        from edl.data.prepare import prepare_synthetic

        prepare_synthetic(str(tmp / "data"), 50000, 256, 10, shards=4)
        data = tmp / "data" / "train"
        console.print("edl: scale-up, drain and SIGKILL ...")
        edl = edl_pauses(tmp, data, a.batch_size, a.rounds)
        console.print("torchrun: SIGKILL of one worker ...")
        tr = torchrun_recovery(tmp, data, a.batch_size, a.rounds)

    def med(xs: list[float]) -> float:
        s = sorted(xs)
        return s[len(s) // 2]

    result = {
        "model": "mlp 256-1024-1024-1024-10", "batch_per_trainer": a.batch_size, "rounds": a.rounds,
        "edl": edl, "torchrun": tr,
        "median": {
            "edl_scale_up_pause_s": med(edl["scale_up"]), "edl_drain_pause_s": med(edl["scale_down"]),
            "edl_failure_pause_s": med(edl["failure"]),
            "edl_kill_to_next_step_s": med(edl["kill_to_next_step_s"]),
            "torchrun_kill_to_next_step_s": med(tr["kill_to_next_step_s"]),
        },
    }
    result["median"]["edl_over_torchrun"] = (result["median"]["edl_kill_to_next_step_s"]
                                             / result["median"]["torchrun_kill_to_next_step_s"])
    path = write_result("recovery", result)
    m = result["median"]
    t = Table(title=f"generation changes, median of {a.rounds} (seconds)")
    t.add_column("event")
    t.add_column("edl", justify="right")
    t.add_column("torchrun", justify="right")
    t.add_column("target", justify="right")
    t.add_row("graceful scale-up pause", f"{m['edl_scale_up_pause_s']:.2f}", "-", "≤ 1")
    t.add_row("graceful drain pause", f"{m['edl_drain_pause_s']:.2f}", "-", "≤ 1")
    t.add_row("SIGKILL pause (master learns → next step)", f"{m['edl_failure_pause_s']:.2f}", "-", "≤ 2")
    t.add_row("SIGKILL → next completed step", f"{m['edl_kill_to_next_step_s']:.2f}",
              f"{m['torchrun_kill_to_next_step_s']:.2f}", "edl ≤ 0.2 × torchrun")
    console.print(t)
    console.print(f"edl / torchrun = {m['edl_over_torchrun']:.3f}; steps rolled back by edl after a kill: "
                  f"{edl['rolled_back']}; steps redone by torchrun: {tr['redone_steps']}; written to {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
