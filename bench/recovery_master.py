"""The master killed: how long the job pauses and how many steps it rolls back.

    python bench/recovery_master.py [--rounds 3] [--batch-size 256]

edl.zoo.mlp on 2 trainers, checkpoints far behind (one requested, then ``--checkpoint-interval 1e9``
until the restarted master asks for the next): SIGKILL the master, the launcher restarts it, the
trainers re-register with where they stopped. A case of ``bench/recovery.py`` (``edl_master_restart``),
kept in its own file; prints a table and writes bench/results/recovery_master.json. No peer is
measured for this case; "rolled back" is what edl itself did before: every step since the checkpoint.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import EdlJob, write_result  # noqa: E402


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
                 "behind_checkpoint": [], "source": []}
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
            t_kill = time.monotonic()
            os.kill(job.info()["master_pid"], signal.SIGKILL)
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
    finally:
        job.stop()
    return out


def main() -> int:
    p = argparse.ArgumentParser(description="edl: pause and rollback when the master is killed")
    p.add_argument("--rounds", type=int, default=3, help="master kills (default 3)")
    p.add_argument("--batch-size", type=int, default=256, help="records per trainer per step (default 256)")
    a = p.parse_args()
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

    result = {"model": "mlp 256-1024-1024-1024-10", "trainers": 2, "batch_per_trainer": a.batch_size,
              "rounds": a.rounds, "edl": out,
              "median": {k: med(out[k]) for k in ("pause_s", "kill_to_next_step_s", "new_master_up_s")}}
    path = write_result("recovery_master", result)
    m = result["median"]
    t = Table(title=f"master SIGKILLed, 2 trainers, median of {a.rounds} (seconds)")
    t.add_column("measure")
    t.add_column("edl", justify="right")
    t.add_column("target", justify="right")
    t.add_row("pause (first re-registration -> next step)", f"{m['pause_s']:.2f}", "<= 2")
    t.add_row("kill -> next step of the new generation", f"{m['kill_to_next_step_s']:.2f}", "-")
    t.add_row("kill -> new master answers", f"{m['new_master_up_s']:.2f}", "-")
    t.add_row("steps rolled back", " ".join(str(x) for x in out["rolled_back"]), "0")
    t.add_row("steps past the checkpoint at the kill", " ".join(str(x) for x in out["behind_checkpoint"]), "-")
    console.print(t)
    console.print(f"state source of each resume generation: {out['source']}; written to {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
