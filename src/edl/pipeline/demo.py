"""``edl demo``: the retraining pipeline, run whole on this machine by ``kfp.local``.

The same pipeline that runs on Kubeflow Pipelines: prepare digits → elastic train
(master, autoscale sidecar and trainers as local processes; other tenants take
trainer slots on a schedule, so the job grows and shrinks) → evaluate on held-out
data → publish to a local registry if better; then the published model in use: ``edl serve``
on a free port, the held-out records sent to it over HTTP (Open Inference Protocol), the
served accuracy beside the evaluate step's. Writes DIR/summary.json (the training summary
plus the evaluation and the serving), DIR/timeline.html and .png, and prints a final table.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import re
import shutil
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

from edl.console import Console, add_row, clip, plain_console, progress_bars, say, table, text
from edl.errors import PermanentError
from edl.pipeline.tasks import CURRENT

# Other tenants on this 2-core machine: both trainer slots free, then one taken, then free again (early in
# the job, so that a fast machine still shows the job shrink and grow back before the data is done).
DEMO_SLOTS = 2
DEMO_SCHEDULE = "0:0,6:1,14:0"
SERVED_REQUESTS = 4  # the held-out split, sent to the served model in this many requests


def _latest_run(root: Path) -> Path:
    runs = [p for p in root.iterdir() if p.is_dir() and p.name.startswith("edl-retrain-")]
    if not runs:
        raise PermanentError(f"kfp.local left no run under {root}")
    return max(runs, key=lambda p: p.stat().st_mtime)


def _executor_output(task_dir: Path) -> dict:
    path = task_dir / "executor_output.json"
    return json.loads(path.read_text()) if path.exists() else {}


LOG_NAME = "pipeline.log"  # under --out: everything kfp.local and the steps print
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_TASK_STARTED = re.compile(r"Executing task '(?P<task>[^']+)'")
_TASK_ENDED = re.compile(r"Task '(?P<task>[^']+)' finished with status (?P<status>[A-Z]+)")
# The elastic-train step's own significant events (the launcher's lines), shown as they come.
_TRAIN_EVENT = re.compile(r"^(generation \d+: |job \S+ succeeded|job \S+: master at |autoscale sidecar: )")
_ERROR = re.compile(r"^(edl\.errors\.)?[A-Za-z]*Error: ")


def classify(line: str) -> tuple[str, str] | None:
    """One line kfp.local printed, as an event for people: ``("started", task)``, ``("ended", "task:
    STATUS")``, ``("event", text)`` (the training's own), ``("error", text)``, or ``None`` (log only)."""
    text = _ANSI.sub("", line).strip()
    if m := _TASK_STARTED.search(text):
        return "started", m["task"]
    if m := _TASK_ENDED.search(text):
        return "ended", f"{m['task']}: {m['status']}"
    if _TRAIN_EVENT.match(text):
        return "event", text
    if _ERROR.match(text):
        return "error", text
    return None


class PipelineLog(io.TextIOBase):
    """Where kfp.local's output goes while the pipeline runs (its own logs and every step's streamed
    output, executor dumps included): all of it into the log file; each line's event, if it has one,
    to ``on_event``."""

    def __init__(self, path: Path, on_event: Callable[[str, str], None]) -> None:
        self.file = path.open("a", encoding="utf-8")
        self.on_event = on_event
        self.partial = ""
        self.last_error: str | None = None  # the last error line a step printed (its traceback's end)

    def writable(self) -> bool:
        return True

    def write(self, s: str) -> int:
        self.file.write(s)
        lines = (self.partial + s).split("\n")
        self.partial = lines.pop()
        for line in lines:
            event = classify(line)
            if event is not None:
                if event[0] == "error":
                    self.last_error = event[1]
                else:
                    self.on_event(*event)
        return len(s)

    def flush(self) -> None:
        self.file.flush()

    def close(self) -> None:
        super().close()  # flushes first
        self.file.close()


class DemoView:
    """On a terminal: a bar for the training (read from the job's master) under the lines of the
    pipeline's events; elsewhere the lines alone."""

    def __init__(self, console: Console, home: Path, since: float) -> None:
        self.console = console
        self.home, self.since = home, since
        self.progress = progress_bars(console, done="percent", redirect_stdout=False, redirect_stderr=False)
        self.bar = self.progress.add_task("starting the pipeline", total=None)
        self.training = False
        self.started: dict[str, float] = {}
        self.stop = threading.Event()
        self.poller = threading.Thread(target=self._poll, name="edl-demo-progress", daemon=True)

    def __enter__(self) -> DemoView:
        self.progress.__enter__()
        if self.console.is_terminal:
            self.poller.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        if self.poller.is_alive():
            self.poller.join(timeout=5)
        self.progress.__exit__(*exc)

    def event(self, kind: str, text: str) -> None:
        if kind == "started":
            self.started[text] = time.monotonic()
            self.training = text == "elastic-train"
            self.progress.update(self.bar, description=f"step {text}")
            say(self.progress.console, f"step {text} started")
        elif kind == "ended":
            task, _, status = text.partition(": ")
            took = time.monotonic() - self.started.get(task, time.monotonic())
            say(self.progress.console, f"step {task}: {status.lower()} in {took:.1f} s")
        else:
            say(self.progress.console, f"  {text}")

    def _poll(self) -> None:
        """The training's progress from its master, every half second while it runs."""
        from edl.launcher.local import local_job_status

        while not self.stop.wait(0.5):
            job = self._job() if self.training else None
            st = local_job_status(job, self.home, timeout_s=1.0) if job else None
            if st is None:
                continue
            total = st.epochs * st.rows_per_epoch
            self.progress.update(self.bar, total=total or None, completed=sum(st.done_rows),
                                 description=f"step elastic-train: epoch {min(st.epoch + 1, st.epochs)}/{st.epochs}"
                                             f" · {st.world_size} trainers")

    def _job(self) -> str | None:
        """The job this run's training step started: the newest job file under EDL_HOME since the demo began."""
        files = [f for f in (self.home / "jobs").glob("*/job.json") if f.stat().st_mtime >= self.since]
        return max(files, key=lambda f: f.stat().st_mtime).parent.name if files else None


@contextlib.contextmanager
def _root_logging_to(stream: io.TextIOBase):
    """The root logger's records into ``stream`` meanwhile: a handler set up before (``edl``'s, to the
    real stderr) holds its own stream, which redirecting ``sys.stderr`` does not reach (kfp.local logs
    its workspace clean-up there)."""
    root = logging.getLogger()
    saved = root.handlers[:]
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(message)s"))
    root.handlers[:] = [handler]
    try:
        yield
    finally:
        root.handlers[:] = saved


DIGITS = {"paddle": "edl.zoo.digits", "torch": "edl.zoo.torch.digits"}  # the model by framework


def run_demo(out: Path, epochs: int = 150, console: Console | None = None, framework: str = "paddle") -> int:
    from kfp import local

    from edl.pipeline.retrain import retrain

    console = console or plain_console(file=sys.stdout)  # bound now: the pipeline's output is redirected
    out = out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    root = out / "kfp"
    root.mkdir(exist_ok=True)
    registry = out / "registry"
    log_path = out / LOG_NAME
    log_path.write_text("")  # this run's output only
    # The step's launcher keeps its job files (trainer logs) here, where the demo can watch the job.
    home = Path(os.environ.setdefault("EDL_HOME", str(out / "edl-home")))
    say(console, ("edl demo", "bold"), f": the retraining pipeline through kfp.local ({DIGITS[framework]}); "
                                       f"artifacts in {root}, the steps' output in {log_path}")
    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(root), raise_on_error=True)
    started = time.monotonic()
    with DemoView(console, home, time.time() - 1.0) as view, PipelineLog(log_path, view.event) as log:
        try:
            with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log), _root_logging_to(log):
                retrain(registry_uri=str(registry), checkpoint_uri=str(out / "checkpoints"), data_kind="digits",
                        epochs=epochs, batch_size=16, learning_rate=0.003, min_trainers=1, max_trainers=DEMO_SLOTS,
                        capacity_slots=DEMO_SLOTS, capacity_schedule=DEMO_SCHEDULE, sidecar_period_s=2.0,
                        sidecar_jitter_s=0.5, audit=True, model_def=DIGITS[framework])
        except RuntimeError as e:  # kfp.local: a task failed; the log holds its output
            why = f": {log.last_error}" if log.last_error else ""
            raise PermanentError(f"{_ANSI.sub('', str(e)).splitlines()[0]}{why} (its output is in {log_path})") from None
    wall = time.monotonic() - started
    run = _latest_run(root)
    train_dir = run / "elastic-train"
    summary = json.loads((train_dir / "summary").read_text())
    evaluation: dict[str, Any] = {}
    for art in (_executor_output(run / "evaluate").get("artifacts") or {}).get("metrics", {}).get("artifacts", []):
        evaluation.update(art.get("metadata") or {})
    published = (registry / "current.json").exists()
    summary["evaluation"] = evaluation
    summary["published"] = published
    summary["pipeline_wall_s"] = round(wall, 1)
    summary["served"] = _serve_published(registry / CURRENT, run / "prepare-data" / "dataset", out, console)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    from edl.pipeline.timeline import embedded_png

    shutil.copyfile(train_dir / "timeline", out / "timeline.html")  # the HTML artifact the KFP UI renders
    (out / "timeline.png").write_bytes(embedded_png((train_dir / "timeline").read_text()) or b"")
    _table(console, summary, out)
    say(console, f"the steps' output (kfp.local's log and the executors'): {log_path}")
    return 0


def _serve_published(model_dir: Path, data: Path, out: Path, console: Console) -> dict:
    """The published model in use: served by ``edl serve``, the held-out split sent to it over HTTP."""
    from edl.data.dataset import Dataset
    from edl.data.splits import resolve_splits
    from edl.modeldef import load_model_def
    from edl.serving.client import running_server, served_accuracy

    _, test = resolve_splits(str(data))
    assert test is not None  # the prepared digits hold their held-out part
    x, y = load_model_def("edl.zoo.digits").collate(Dataset(test, "held-out data").read_all())
    say(console, f"serving {model_dir} with edl serve (ONNX Runtime, KServe's model server) ...")
    with running_server(str(model_dir), "digits", out / "serve.log") as served:
        accuracy = served_accuracy(served, x, y, SERVED_REQUESTS)
    return {"accuracy": accuracy, "requests": SERVED_REQUESTS, "records": int(len(y)), "url": served.url}


def _table(console: Console, s: dict, out: Path) -> None:
    gens = s.get("generations") or []
    t = table("what", ("value", "right"),
              title=text(f"edl demo: {s['job']} {s['status']} in {s['pipeline_wall_s']:.0f} s (pipeline)"))
    ev = s.get("evaluation") or {}
    add_row(t, "held-out accuracy (evaluate step)", f"{ev.get('accuracy', float('nan')):.4f}")
    sv = s.get("served") or {}
    add_row(t, f"held-out accuracy (served: edl serve, {sv.get('requests')} requests over HTTP)",
            f"{sv.get('accuracy', float('nan')):.4f}")
    add_row(t, "epochs", str(s.get("epochs_completed")))
    add_row(t, "scale events", str(max(0, len(gens) - 1)))
    for g in gens[1:]:
        add_row(t, f"  generation {g['id']}: {g['world_size']} trainers ({g['reason']})",
                  "-" if g["pause_s"] is None else f"pause {g['pause_s']:.2f} s")
    reasons = s.get("size_reasons") or []
    for r in reasons:
        add_row(t, f"  why this size, from {r['t']:.0f} s: {r['cause'].replace('_', ' ')}", clip(r["text"], 70))
    kinds = [g["reason"] for g in gens]
    if "scale_down" in kinds and "scale_up" not in kinds[len(kinds) - kinds[::-1].index("scale_down"):]:
        last = reasons[-1]["text"] if reasons else "the sidecar gave none"
        add_row(t, "not grown back after the capacity returned", clip(last, 70))
    lost, dup = s.get("lost_samples"), s.get("duplicate_samples")
    add_row(t, "exactly-once (lost / duplicated samples)", f"{lost} / {dup}")
    add_row(t, "published as the current model", "yes" if s.get("published") else "no (not better)")
    console.print(t)
    say(console, f"written: {out / 'summary.json'}, {out / 'timeline.png'} (and .html)")
