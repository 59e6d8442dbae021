"""``edl train``: run a whole elastic job on this machine as local processes.

The launcher owns the processes: it starts the master, keeps the number of
trainers at the master's desired count (spawning, or draining the youngest
first), reports trainer exits to the master, restarts a master that died, and
shows progress. A relaunch of the same command resumes from the checkpoint.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import time
from pathlib import Path

import httpx
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from edl.data.dataset import Dataset
from edl.errors import PermanentError, UserError
from edl.jobargs import spec_to_argv
from edl.cluster.local import LocalProcesses, Proc
from edl.master.job import JobSpec
from edl.master.main import prepare_job
from edl.trainer.audit import audit
from edl.net import free_port


def edl_home() -> Path:
    return Path(os.environ.get("EDL_HOME", Path.home() / ".edl"))


def job_dir(job: str, home: Path | None = None) -> Path:
    return (home or edl_home()) / "jobs" / job


def read_job_file(job: str, home: Path | None = None) -> dict:
    path = job_dir(job, home) / "job.json"
    if not path.exists():
        raise UserError(f"no local job named {job!r} (looked for {path})")
    return json.loads(path.read_text())


def local_job_status(job: str, home: Path | None = None, timeout_s: float = 3.0) -> dict | None:
    """A running local job's status, or ``None`` while it cannot be read (starting, restarting, gone)."""
    try:
        info = read_job_file(job, home)
        r = httpx.get(f"http://{info['address']}/v1/status",
                      headers={"Authorization": f"Bearer {info['token']}"}, timeout=timeout_s)
        return r.json() if r.status_code == 200 else None
    except (UserError, OSError, ValueError, KeyError, httpx.HTTPError):
        return None


def write_json_atomic(path: Path, data: dict, mode: int = 0o644) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.chmod(tmp, mode)
    os.replace(tmp, path)


class LocalLauncher:
    def __init__(self, spec: JobSpec, summary_out: Path | None, max_trainer_failures: int = 5,
                 console: Console | None = None) -> None:
        self.spec = spec
        self.summary_out = summary_out
        self.max_trainer_failures = max_trainer_failures
        self.console = console or Console()
        self.dir = job_dir(spec.job)
        self.token = secrets.token_urlsafe(32)
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.trainers: dict[str, Proc] = {}
        self.draining: set[str] = set()
        self.failures = 0
        self.master_restarts = 0
        self.counter = 0
        self.shown_generations = 0
        self.stopping = False

    # -------------------------------------------------------------- plumbing
    def _http(self) -> httpx.Client:
        return httpx.Client(base_url=f"http://{self.address}", headers={"Authorization": f"Bearer {self.token}"},
                            timeout=5.0)

    def _get(self, path: str) -> dict | None:
        try:
            r = self.http.get(path)
            return r.json() if r.status_code == 200 else None
        except httpx.TransportError:
            return None

    def _post(self, path: str, body: dict | None = None) -> dict | None:
        try:
            r = self.http.post(path, json=body or {})
            return r.json() if r.status_code == 200 else None
        except httpx.TransportError:
            return None

    def _save(self) -> None:
        write_json_atomic(self.dir / "job.json", {
            "job": self.spec.job, "address": self.address, "token": self.token,
            "launcher_pid": os.getpid(), "master_pid": self.master.pid,
            "trainers": {k: p.pid for k, p in self.trainers.items() if p.poll() is None},
        }, mode=0o600)

    def _start_master(self) -> None:
        self.master = self.procs.spawn("master", ["master", *spec_to_argv(self.spec), "--port", str(self.port)],
                                       {"EDL_TOKEN": self.token})
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.master.poll() is not None:
                line = self.master.last_line()
                raise UserError(line.removeprefix("edl: error: ") or f"master exited with code {self.master.poll()}")
            if self._get("/healthz") is not None:
                self._save()
                return
            time.sleep(0.05)
        raise PermanentError("master did not start within 60 s")

    def _spawn_trainer(self) -> None:
        self.counter += 1
        tid = f"{self.spec.job}-t{self.counter}"
        args = ["trainer", "--id", tid, "--master", self.address]
        if self.spec.audit:
            args += ["--audit-dir", str(self.dir / "audit")]
        self.trainers[tid] = self.procs.spawn(tid, args, {"EDL_TOKEN": self.token})
        self._save()

    # -------------------------------------------------------------- the loop
    def run(self) -> int:
        self.spec, _, ckpts = prepare_job(self.spec)  # fail fast on bad data or storage
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "logs").mkdir(exist_ok=True)
        resuming = bool(ckpts.committed())
        if not resuming and (self.dir / "audit").exists():
            shutil.rmtree(self.dir / "audit")
        env = dict(os.environ)
        env.setdefault("PYTHONUNBUFFERED", "1")
        self.procs = LocalProcesses(self.dir / "logs", env)
        self.http = self._http()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)
        self._start_master()
        self.console.print(
            f"[bold]job {self.spec.job}[/]: master at {self.address}, trainers "
            f"{self.spec.min_trainers}..{self.spec.max_trainers}, logs in {self.dir / 'logs'}"
            + (" (resuming from checkpoint)" if resuming else "")
        )
        status: dict | None = None
        progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                            TextColumn("{task.fields[info]}"), TimeElapsedColumn(), console=self.console,
                            transient=False, disable=not self.console.is_terminal)
        bars: dict[int, int] = {}
        last_line = 0.0
        try:
            with progress:
                while True:
                    self._watch_master()
                    st = self._get("/v1/status")
                    if st is not None:
                        status = st
                        self._show(st, progress, bars)
                        if st["status"] != "running":
                            break
                        self._reconcile(st)
                        if not self.console.is_terminal and time.monotonic() - last_line > 10:
                            last_line = time.monotonic()
                            self._plain_progress(st)
                    self._reap(status)
                    time.sleep(0.1)
            return self._finish()
        finally:
            self._teardown()

    def _on_signal(self, signum: int, _frame) -> None:
        self.stopping = True
        raise KeyboardInterrupt

    def _watch_master(self) -> None:
        code = self.master.poll()
        if code is None:
            return
        self.master_restarts += 1
        if self.master_restarts > 10:
            raise PermanentError(f"master keeps dying (last exit code {code}); see {self.master.log_path}")
        self.console.print(f"master exited with code {code}; restarting it (it resumes from the last checkpoint)")
        self._start_master()

    def _reap(self, status: dict | None) -> None:
        for tid, proc in list(self.trainers.items()):
            code = proc.poll()
            if code is None:
                continue
            del self.trainers[tid]
            self._post(f"/v1/trainers/{tid}/exited", {"code": code})
            drained = tid in self.draining
            self.draining.discard(tid)
            running = status is None or status["status"] == "running"
            if code != 0 and running and not drained:
                self.failures += 1
                self.console.print(f"trainer {tid} exited with code {code}: {proc.last_line()[:200]}")
                if code == 2:
                    raise UserError(proc.last_line().removeprefix("edl: error: "))
                if self.failures > self.max_trainer_failures:
                    raise PermanentError(
                        f"{self.failures} trainer failures (limit {self.max_trainer_failures}); last: {proc.last_line()[:200]}"
                    )
            self._save()

    def _reconcile(self, st: dict) -> None:
        live = [t for t, p in self.trainers.items() if p.poll() is None and t not in self.draining]
        desired = st["desired_trainers"]
        for _ in range(desired - len(live)):
            self._spawn_trainer()
        if len(live) > desired and st["phase"] == "running":
            # Drain trainers that are not in a generation yet first, then the youngest:
            # it has the least warmed-up state and cache.
            states = {t["id"]: t["state"] for t in st["trainers"]}
            victims = sorted(live, key=lambda t: (states.get(t) == "waiting", self.trainers[t].started_at),
                             reverse=True)[: len(live) - desired]
            for tid in victims:
                if self._post(f"/v1/trainers/{tid}/drain") is not None:
                    self.draining.add(tid)

    def _show(self, st: dict, progress: Progress, bars: dict[int, int]) -> None:
        for e in range(st["epochs"]):
            done = st["done_rows"][e]
            if e not in bars and (done > 0 or e == st["epoch"]):
                bars[e] = progress.add_task(f"epoch {e + 1}/{st['epochs']}", total=st["rows_per_epoch"], info="")
            if e in bars:
                progress.update(bars[e], completed=done,
                                info=f"gen {st['generation']} · {st['world_size']} trainers · step {st['step']}")
        gens = st["generations"]
        while self.shown_generations < len(gens):
            g = gens[self.shown_generations]
            if g["pause_s"] is None and self.shown_generations == len(gens) - 1 and st["status"] == "running":
                break  # wait until its pause is known
            prev = gens[self.shown_generations - 1]["world_size"] if self.shown_generations else 0
            pause = "" if g["pause_s"] is None else f", pause {g['pause_s']:.2f} s"
            back = f", rolled back {g['rolled_back_steps']} steps" if g["rolled_back_steps"] else ""
            progress.console.print(
                f"generation {g['id']}: {prev} → {g['world_size']} trainers ({g['reason']}){pause}{back}"
            )
            self.shown_generations += 1

    def _plain_progress(self, st: dict) -> None:
        e = min(st["epoch"], st["epochs"] - 1)
        pct = 100.0 * st["done_rows"][e] / max(1, st["rows_per_epoch"])
        self.console.print(f"epoch {e + 1}/{st['epochs']}: {pct:5.1f} % · {st['world_size']} trainers · step {st['step']}")

    def _finish(self) -> int:
        # Let trainers exit on their own (rank 0 finishes the export), then stop the master.
        deadline = time.monotonic() + 120
        while any(p.poll() is None for p in self.trainers.values()) and time.monotonic() < deadline:
            time.sleep(0.1)
        summary = self._get("/v1/summary") or {"job": self.spec.job, "status": "failed", "error": "master lost"}
        if self.spec.audit:
            ids = Dataset(self.spec.data).all_ids()
            result = audit(self.dir / "audit", ids, self.spec.epochs)
            summary["lost_samples"] = result.lost
            summary["duplicate_samples"] = result.duplicates
            summary["audited_samples_per_epoch"] = result.samples_per_epoch
        summary["trainer_failures"] = self.failures
        summary["master_restarts"] = self.master_restarts
        if self.summary_out:
            self.summary_out.parent.mkdir(parents=True, exist_ok=True)
            write_json_atomic(self.summary_out, summary)
        if summary["status"] == "succeeded":
            m = summary.get("metrics", {})
            acc = f", held-out accuracy {m['accuracy']:.3f}" if "accuracy" in m else ""
            audit_txt = (f", lost {summary['lost_samples']}, duplicated {summary['duplicate_samples']}"
                         if self.spec.audit else "")
            self.console.print(
                f"[green]job {self.spec.job} succeeded[/]: {summary['epochs_completed']} epochs, "
                f"{summary['steps']} steps, {summary['throughput_samples_per_s']:.0f} samples/s{acc}{audit_txt}; "
                f"model at {summary['final_model_uri']}"
            )
            return 0
        raise PermanentError(f"job {self.spec.job} failed: {summary.get('error')}")

    def _teardown(self) -> None:
        self._post("/v1/shutdown")
        procs = list(self.trainers.values())
        if getattr(self, "master", None) is not None:
            procs.append(self.master)
        LocalProcesses.stop_all(procs, 3.0)
        self.http.close()
