"""``edl demo``: the retraining pipeline, run whole on this machine by ``kfp.local``.

The same pipeline that runs on Kubeflow Pipelines: prepare digits → elastic train
(master, autoscale sidecar and trainers as local processes; other tenants take
trainer slots on a schedule, so the job grows and shrinks) → evaluate on held-out
data → publish to a local registry if better. Writes DIR/summary.json (the training
summary plus the evaluation), DIR/timeline.html and .png, and prints a final table.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from edl.errors import PermanentError

# Other tenants on this 2-core machine: both trainer slots free, then one taken, then free again.
DEMO_SLOTS = 2
DEMO_SCHEDULE = "0:0,12:1,24:0"


def _latest_run(root: Path) -> Path:
    runs = [p for p in root.iterdir() if p.is_dir() and p.name.startswith("edl-retrain-")]
    if not runs:
        raise PermanentError(f"kfp.local left no run under {root}")
    return max(runs, key=lambda p: p.stat().st_mtime)


def _executor_output(task_dir: Path) -> dict:
    path = task_dir / "executor_output.json"
    return json.loads(path.read_text()) if path.exists() else {}


def run_demo(out: Path, epochs: int = 60, console: Console | None = None) -> int:
    from kfp import local

    from edl.pipeline.retrain import retrain

    console = console or Console()
    out = out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    root = out / "kfp"
    root.mkdir(exist_ok=True)
    registry = out / "registry"
    console.print(f"[bold]edl demo[/]: the retraining pipeline through kfp.local; artifacts in {root}")
    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(root), raise_on_error=True)
    started = time.monotonic()
    try:
        retrain(registry_uri=str(registry), checkpoint_uri=str(out / "checkpoints"), data_kind="digits",
                epochs=epochs, batch_size=16, learning_rate=0.003, min_trainers=1, max_trainers=DEMO_SLOTS, capacity_slots=DEMO_SLOTS, capacity_schedule=DEMO_SCHEDULE,
                sidecar_period_s=2.0, sidecar_jitter_s=0.5, audit=True)
    except RuntimeError as e:  # kfp.local: a task failed; its log above says why
        raise PermanentError(str(e).splitlines()[0] + " (the task's error is in the log above)") from None
    wall = time.monotonic() - started
    run = _latest_run(root)
    train_dir = run / "elastic-train"
    summary = json.loads((train_dir / "summary").read_text())
    evaluation = {}
    for art in (_executor_output(run / "evaluate").get("artifacts") or {}).get("metrics", {}).get("artifacts", []):
        evaluation.update(art.get("metadata") or {})
    published = (registry / "current.json").exists()
    summary["evaluation"] = evaluation
    summary["published"] = published
    summary["pipeline_wall_s"] = round(wall, 1)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    from edl.pipeline.step import embedded_png

    shutil.copyfile(train_dir / "timeline", out / "timeline.html")  # the HTML artifact the KFP UI renders
    (out / "timeline.png").write_bytes(embedded_png((train_dir / "timeline").read_text()) or b"")
    _table(console, summary, out)
    return 0


def _table(console: Console, s: dict, out: Path) -> None:
    gens = s.get("generations") or []
    t = Table(title=f"edl demo: {s['job']} {s['status']} in {s['pipeline_wall_s']:.0f} s (pipeline)")
    t.add_column("what")
    t.add_column("value", justify="right")
    ev = s.get("evaluation") or {}
    t.add_row("held-out accuracy (evaluate step)", f"{ev.get('accuracy', float('nan')):.4f}")
    t.add_row("epochs", str(s.get("epochs_completed")))
    t.add_row("scale events", str(max(0, len(gens) - 1)))
    for g in gens[1:]:
        t.add_row(f"  generation {g['id']}: {g['world_size']} trainers ({g['reason']})",
                  "-" if g["pause_s"] is None else f"pause {g['pause_s']:.2f} s")
    lost, dup = s.get("lost_samples"), s.get("duplicate_samples")
    t.add_row("exactly-once (lost / duplicated samples)", f"{lost} / {dup}")
    t.add_row("published as the current model", "yes" if s.get("published") else "no (not better)")
    console.print(t)
    console.print(f"written: {out / 'summary.json'}, {out / 'timeline.png'} (and .html)")
