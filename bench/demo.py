"""The engine's own demo: an elastic digits run on one machine with scale-up, drain and a trainer crash.

    ./dev demo [--out DIR]

Prepares scikit-learn's digits, starts ``edl train`` with one trainer, grows it
to three, kills one trainer with SIGKILL, shrinks to two, and prints the run
summary (held-out accuracy, generations with their pauses, exactly-once audit).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from edl.launcher.local import local_job_status


def edl(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "edl", *args], check=True, **kw)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="out/demo", help="directory for data, checkpoints and summary (default out/demo)")
    a = p.parse_args()
    out = Path(a.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    console = Console()
    os.environ.setdefault("EDL_HOME", str(out / "edl-home"))
    job = f"demo-{int(time.time())}"
    edl("data", "prepare", "digits", "--out", str(out / "data"))
    train = subprocess.Popen([
        sys.executable, "-m", "edl", "train", "--job-name", job, "--model-def", "edl.zoo.digits",
        "--data", str(out / "data"), "--epochs", "40", "--batch-size", "16", "--learning-rate", "0.003",
        "--min-trainers", "1", "--max-trainers", "3", "--trainers", "1",
        "--checkpoint-uri", str(out / "checkpoints" / job), "--checkpoint-interval", "5",
        "--audit", "--summary-out", str(out / "summary.json"),
    ])

    def status() -> dict | None:
        st = local_job_status(job)
        return None if st is None else st.to_json()

    def wait(pred, what: str) -> dict:
        while train.poll() is None:
            st = status()
            if st is not None and pred(st):
                return st
            time.sleep(0.2)
        raise SystemExit(f"the job ended before {what}")

    try:
        wait(lambda s: s["step"] > 150, "warming up")
        edl("scale", job, "--trainers", "3")
        st = wait(lambda s: s["world_size"] == 3 and s["phase"] == "running", "growing to 3")
        start = st["step"]
        st = wait(lambda s: s["step"] > start + 300, "training at 3")
        victim = next(t for t in st["trainers"] if t["rank"] == 2)
        console.print(f"[yellow]demo: killing trainer {victim['id']} (pid {victim['pid']}) with SIGKILL[/]")
        os.kill(victim["pid"], signal.SIGKILL)
        st = wait(lambda s: s["world_size"] == 3 and s["phase"] == "running"
                  and s["generation"] > st["generation"] + 1, "replacing the lost trainer")
        edl("scale", job, "--trainers", "2")
        code = train.wait()
    finally:
        if train.poll() is None:
            train.send_signal(signal.SIGTERM)
            train.wait()
    s = json.loads((out / "summary.json").read_text())
    t = Table(title=f"job {job}: {s['status']}")
    t.add_column("generation")
    t.add_column("trainers")
    t.add_column("reason")
    t.add_column("pause (s)")
    t.add_column("rolled back steps")
    for g in s["generations"]:
        t.add_row(str(g["id"]), str(g["world_size"]), g["reason"],
                  "-" if g["pause_s"] is None else f"{g['pause_s']:.2f}", str(g["rolled_back_steps"]))
    console.print(t)
    console.print(
        f"held-out accuracy {s['metrics'].get('accuracy', float('nan')):.3f} · epochs {s['epochs_completed']} · "
        f"steps {s['steps']} · lost samples {s['lost_samples']} · duplicate samples {s['duplicate_samples']} · "
        f"summary {out / 'summary.json'}"
    )
    return code


if __name__ == "__main__":
    raise SystemExit(main())
