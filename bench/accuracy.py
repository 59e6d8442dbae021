"""Held-out accuracy on digits: a fixed 2-trainer run vs an elastic run with scale events and a crash.

    python bench/accuracy.py

Same data, model, epochs and seed. The elastic run starts with 1 trainer, grows
to 3, loses one to SIGKILL (replaced by the launcher), and shrinks to 2.
Writes bench/results/accuracy.json.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import EdlJob, write_result  # noqa: E402

EPOCHS = 40


def args(tmp: Path, name: str, trainers: int) -> list[str]:
    return ["--model-def", "edl.zoo.digits", "--data", str(tmp / "data"), "--epochs", str(EPOCHS),
            "--batch-size", "16", "--learning-rate", "0.003", "--min-trainers", "1", "--max-trainers", "3",
            "--trainers", str(trainers), "--checkpoint-uri", str(tmp / f"ckpt-{name}"), "--audit",
            "--summary-out", str(tmp / f"{name}.json")]


def scale(job: EdlJob, n: int) -> None:
    subprocess.run([sys.executable, "-m", "edl", "scale", job.name, "--trainers", str(n)], check=True,
                   env={**os.environ, "EDL_HOME": str(job.home)}, stdout=subprocess.DEVNULL)


def main() -> int:
    console = Console()
    with tempfile.TemporaryDirectory(prefix="edl-bench-") as d:
        tmp = Path(d)
        from edl.data.prepare import prepare_digits

        prepare_digits(str(tmp / "data"))
        console.print("fixed: 2 trainers ...")
        fixed = EdlJob("fixed", args(tmp, "fixed", 2), tmp / "home", tmp / "fixed.log")
        fixed.proc.wait()
        console.print("elastic: 1 -> 3 -> SIGKILL -> 2 ...")
        job = EdlJob("elastic", args(tmp, "elastic", 1), tmp / "home", tmp / "elastic.log")
        st = job.wait_for(lambda s: s["epochs_completed"] >= 5)
        scale(job, 3)
        st = job.wait_for(lambda s: s["world_size"] == 3 and s["phase"] == "running")
        st = job.wait_for(lambda s, e=st["epochs_completed"]: s["epochs_completed"] >= e + 5)
        g = st["generation"]
        os.kill(next(t for t in st["trainers"] if t["rank"] == 1)["pid"], signal.SIGKILL)
        st = job.wait_for(lambda s: s["generation"] > g + 1 and s["world_size"] == 3 and s["phase"] == "running")
        scale(job, 2)
        job.proc.wait()
        f = json.loads((tmp / "fixed.json").read_text())
        e = json.loads((tmp / "elastic.json").read_text())
    result = {
        "epochs": EPOCHS,
        "fixed": {k: f[k] for k in ("metrics", "lost_samples", "duplicate_samples", "generations")},
        "elastic": {k: e[k] for k in ("metrics", "lost_samples", "duplicate_samples", "generations")},
        "accuracy_gap_points": 100 * (f["metrics"]["accuracy"] - e["metrics"]["accuracy"]),
    }
    path = write_result("accuracy", result)
    t = Table(title=f"digits, {EPOCHS} epochs, held-out accuracy")
    for c in ("run", "accuracy", "generations", "lost", "duplicated"):
        t.add_column(c)
    for name, s in (("fixed 2 trainers", f), ("elastic 1→3→kill→2", e)):
        t.add_row(name, f"{s['metrics']['accuracy']:.4f}", str(len(s["generations"])), str(s["lost_samples"]),
                  str(s["duplicate_samples"]))
    console.print(t)
    console.print(f"gap = {result['accuracy_gap_points']:.2f} points (target: ≥ 95 % and within 1 point); "
                  f"written to {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
