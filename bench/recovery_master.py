"""The master killed: how long the job pauses and how many steps it rolls back.

    python bench/recovery_master.py [--rounds 3] [--batch-size 256] [--cold]

edl.zoo.mlp on 2 trainers, checkpoints far behind (one requested, then ``--checkpoint-interval 1e9``
until the restarted master asks for the next): SIGKILL the master, the launcher restarts it, the
trainers re-register with where they stopped. A case of ``bench/recovery.py`` (``edl_master_restart``),
kept in its own file; prints a table and writes bench/results/recovery_master.json. No peer is
measured for this case; "rolled back" is what edl itself did before: every step since the checkpoint.

The launcher wakes its spare master (``edl master --standby``, imports done); ``--cold`` runs without
one (``EDL_STANDBY_MASTER=0``): every restart starts a new Python process, as a master pod's
container restart does on Kubernetes, where the kubelet's restart of the container comes on top
(writes recovery_master_cold.json). Each kill's timeline (seconds from the kill, from the job's logs)
is printed and kept under "timeline".
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import signal
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import EdlJob, write_result  # noqa: E402


_LOG_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) (\S+) (.*)$")


def _log_events(path: Path, since_wall: float) -> list[tuple[float, str]]:
    """(wall time, message) of a job log's timestamped lines at or after ``since_wall``."""
    out = []
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return out
    for line in text.splitlines():
        m = _LOG_LINE.match(line)
        if m is None:
            continue
        t = datetime.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
        if t >= since_wall - 0.002:  # asctime is cut to the millisecond
            out.append((t, m.group(3)))
    return out


def _first(events: list[tuple[float, str]], pattern: str, t0: float) -> float | None:
    for t, msg in events:
        if re.search(pattern, msg):
            return round(t - t0, 3)
    return None


def timeline(logs: Path, kill_wall: float, spawned_s: float, answers_s: float, first_step_s: float) -> dict:
    """Seconds from the kill to each stage of the restart, from the bench's own clock (spawned, answers,
    first step) and the job's logs (the master's start-up phases, the trainers' re-registration, the
    new generation's group and state)."""
    master = _log_events(logs / "master.log", kill_wall)
    trainers = [_log_events(p, kill_wall) for p in sorted(logs.glob("*.log")) if p.name != "master.log"]
    out: dict = {"spawned": round(spawned_s, 3)}
    for t, msg in master:
        m = re.search(r"master up: (.*)$", msg)
        if m:  # "master up: imports 1.234 s, checks ..., listening at 2.345 s (since the process started)"
            out["master_phases"] = m.group(1)
            break
    out["checkpoint_read"] = _first(master, r"resuming from", kill_wall)
    out["answers"] = round(answers_s, 3)
    regs = [t for t, msg in master if re.search(r"registered \(pid \d+\), stopped at", msg)]
    out["first_reregistered"] = round(min(regs) - kill_wall, 3) if regs else None
    out["last_reregistered"] = round(max(regs) - kill_wall, 3) if regs else None
    out["generation_formed"] = _first(master, r"generation \d+ formed", kill_wall)
    joined = []
    for events in trainers:
        for t, msg in events:
            m = re.search(r"group formed in ([\d.]+) s, state in ([\d.]+) s", msg)
            if m:
                joined.append((t - kill_wall, float(m.group(1)), float(m.group(2))))
                break
    if joined:
        out["trainers_joined"] = round(max(j[0] for j in joined), 3)
        out["group_formed_s"] = max(j[1] for j in joined)
        out["state_s"] = max(j[2] for j in joined)
    out["first_step"] = round(first_step_s, 3)
    return out


def edl_master_restart(tmp: Path, data: Path, batch: int, rounds: int) -> dict:
    """SIGKILL the master of a 2-trainer job whose checkpoint is far behind; the launcher restarts it.

    ``pause_s``: the resume generation's pause (first re-registration -> first step); ``kill_to_next_step_s``:
    from the kill to that first step (the master's restart included; the trainers train on the rows they
    hold meanwhile); ``rolled_back``: steps the job went back (0: it went on from the trainers' step);
    ``behind_checkpoint``: how far past the checkpoint the job was when its master died.
    """
    job = EdlJob("mrestart", [
        "--model-def", "edl.zoo.mlp", "--data", str(data), "--epochs", "100", "--batch-size", str(batch),
        "--min-trainers", "1", "--max-trainers", "2", "--trainers", "2",
        "--checkpoint-uri", str(tmp / "ckpt-master"), "--checkpoint-interval", "1e9",
    ], tmp / "home-master", tmp / "edl-master.log")
    out: dict = {"pause_s": [], "kill_to_next_step_s": [], "new_master_up_s": [], "rolled_back": [],
                 "behind_checkpoint": [], "source": [], "timeline": []}
    try:
        st = job.wait_for(lambda s: s["world_size"] == 2 and s["step"] > 10)
        from edl.launcher.local import local_job_master

        local_job_master(job.name, job.home).request_checkpoint()  # one checkpoint, then far past it
        for _ in range(rounds):
            # A checkpoint of the current generation (the one asked for above, or the one a restarted
            # master asks for): the ledgers reach back to it.
            st = job.wait_for(lambda s: s["phase"] == "running" and s["checkpoints"]
                              and s["checkpoints"][-1]["step"] >= s["generations"][-1]["base_step"])
            ckpt = st["checkpoints"][-1]["step"]
            st = job.wait_for(lambda s, c=ckpt: s["step"] > c + 40 and s["phase"] == "running")
            old_uid, before = st["master_uid"], st["step"]
            old_pid = job.info()["master_pid"]
            t_kill, kill_wall = time.monotonic(), time.time()
            os.kill(old_pid, signal.SIGKILL)
            spawned_s = _wait_for_new_master_pid(job, old_pid) - t_kill
            job.wait_for(lambda s: s["master_uid"] != old_uid, timeout=120)
            out["new_master_up_s"].append(time.monotonic() - t_kill)
            # The new master's first generation has stepped (the ones before it come from the checkpoint).
            st = job.wait_for(lambda s: s["master_uid"] != old_uid and s["generation"] >= 1
                              and s["generations"][-1]["first_step_at"] is not None
                              and s["generations"][-1]["first_step_at"] > t_kill, timeout=120)
            g = st["generations"][-1]
            assert g["reason"] == "resume" and g["master_generation"] == 1, g
            out["pause_s"].append(g["pause_s"])
            out["kill_to_next_step_s"].append(g["first_step_at"] - t_kill)  # the master's clock is monotonic too
            out["rolled_back"].append(max(0, before - g["base_step"]))
            out["behind_checkpoint"].append(before - ckpt)
            out["source"].append(g["source"])
            time.sleep(0.5)  # the trainers' lines about the new generation reach their logs
            out["timeline"].append(timeline(job.home / "jobs" / job.name / "logs", kill_wall, spawned_s,
                                            out["new_master_up_s"][-1], out["kill_to_next_step_s"][-1]))
            print(json.dumps(out["timeline"][-1]), flush=True)
    finally:
        job.stop()
    return out


def _wait_for_new_master_pid(job: EdlJob, old_pid: int, timeout: float = 60.0) -> float:
    """When the launcher has spawned the next master (its pid in the job file), on the monotonic clock."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            pid = job.info().get("master_pid")
        except (OSError, ValueError):
            pid = None  # the file is being replaced
        if pid is not None and pid != old_pid:
            return time.monotonic()
        time.sleep(0.005)
    raise TimeoutError("the launcher did not start a new master")


def main() -> int:
    p = argparse.ArgumentParser(description="edl: pause and rollback when the master is killed")
    p.add_argument("--rounds", type=int, default=3, help="master kills (default 3)")
    p.add_argument("--batch-size", type=int, default=256, help="records per trainer per step (default 256)")
    p.add_argument("--cold", action="store_true", help="no spare master: every restart is a new process")
    a = p.parse_args()
    if a.cold:
        os.environ["EDL_STANDBY_MASTER"] = "0"
    console = Console()
    with tempfile.TemporaryDirectory(prefix="edl-bench-") as d:
        tmp = Path(d)
        from edl.data.prepare import prepare_synthetic

        prepare_synthetic(str(tmp / "data"), 50000, 256, 10, shards=4)
        console.print("edl: SIGKILL of the master ...")
        out = edl_master_restart(tmp, tmp / "data" / "train", a.batch_size, a.rounds)

    def med(xs: list[float]) -> float:
        s = sorted(xs)
        return s[len(s) // 2]

    stages = [k for k, v in out["timeline"][0].items() if isinstance(v, (int, float))] if out["timeline"] else []
    timeline_median = {k: med([t[k] for t in out["timeline"] if t.get(k) is not None])
                       for k in stages if any(t.get(k) is not None for t in out["timeline"])}
    result = {"model": "mlp 256-1024-1024-1024-10", "trainers": 2, "batch_per_trainer": a.batch_size,
              "rounds": a.rounds, "spare_master": not a.cold, "edl": out,
              "median": {k: med(out[k]) for k in ("pause_s", "kill_to_next_step_s", "new_master_up_s")},
              "timeline_median_s": timeline_median}
    path = write_result("recovery_master_cold" if a.cold else "recovery_master", result)
    m = result["median"]
    kind = "cold restart (no spare)" if a.cold else "the spare master woken"
    t = Table(title=f"master SIGKILLed, 2 trainers, {kind}, median of {a.rounds} (seconds)")
    t.add_column("measure")
    t.add_column("edl", justify="right")
    t.add_column("target", justify="right")
    t.add_row("pause (first re-registration -> next step)", f"{m['pause_s']:.2f}", "<= 2")
    t.add_row("kill -> next step of the new generation", f"{m['kill_to_next_step_s']:.2f}", "<= 2")
    t.add_row("kill -> new master answers", f"{m['new_master_up_s']:.2f}", "-")
    t.add_row("steps rolled back", " ".join(str(x) for x in out["rolled_back"]), "0")
    t.add_row("steps past the checkpoint at the kill", " ".join(str(x) for x in out["behind_checkpoint"]), "-")
    console.print(t)
    console.print("timeline, seconds from the kill (median): "
                  + ", ".join(f"{k} {v:.2f}" for k, v in timeline_median.items()))
    console.print(f"state source of each resume generation: {out['source']}; written to {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
