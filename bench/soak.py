"""A soak: one local job for N minutes under a seeded rain of faults, and how much of its life it trained.

    python bench/soak.py [--minutes 30] [--interval 15] [--seed 1] [--kinds K,K,...] [--epochs E]

``edl.zoo.mlp`` on 40,000 synthetic rows of 256 features, 1..3 trainers (2 to start), a checkpoint every
4 s, ``--audit``. The job's epochs are sized by a fault-free pilot (one epoch) to last ``--minutes``
without faults (``--epochs`` skips the pilot). While it runs, one fault every ``--interval`` seconds on
average (uniform in 2/3..4/3 of it), drawn from ``--kinds``:

- ``trainer-sigkill``, ``trainer-sigterm`` (a trainer's pod deleted or preempted), ``master-sigkill``;
- ``trainer-hang``: a trainer stopped (SIGSTOP) for 4 s;
- ``scale``: ``edl scale`` to another size in 1..3;
- ``s3-outage``: the checkpoints' S3 server (MinIO, from the test plane's build cache) down for 2-5 s;
  only where MinIO has been built (``./dev test`` builds it), else checkpoints go to a local directory;
- ``launcher-restart``: the launcher SIGKILLed and the same command run again, as a workflow engine
  retries a step: it adopts the master and trainers, which trained on meanwhile.

It reports the **effective training time ratio**: the time spent in the steps the final model kept, over
the wall time from its first step to its last (the start-up before and the export after are left out),
from the audit log, where each trainer records when it made each step (``account``). Time in which no
kept step was made (a pause, a restart, a stall longer than four typical steps, steps made and then
rolled back) is lost, and charged to the latest fault before training went on; the table gives each
kind's count and its lost seconds. A stricter ratio counts every step at most at its generation's median
pace (a slow step's excess lost too). Writes
bench/results/soak.json and docs/soak.png (the kept steps over time, the faults marked).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ROOT, EdlJob, write_result  # noqa: E402

from edl.storage.audit import KeptStep, kept_steps, read_audit_lines  # noqa: E402
from edl.storage.store import open_store  # noqa: E402

KINDS = ("trainer-sigkill", "trainer-sigterm", "master-sigkill", "trainer-hang", "scale", "s3-outage",
         "launcher-restart")
POLL_S = 0.1
HANG_S = 4.0
STALL_STEPS = 4.0  # a gap between kept steps longer than this many typical steps is a stall (``account``)


# ------------------------------------------------------------------ the accounting (pure)
@dataclass(frozen=True)
class Fault:
    t: float  # wall-clock seconds
    kind: str
    detail: str = ""


@dataclass
class Accounting:
    first_at: float = 0.0  # the first kept step's time (wall clock)
    wall_s: float = 0.0  # from the first kept step to the last
    kept_s: float = 0.0  # in steps the final model kept
    lost_s: dict[str, float] = field(default_factory=dict)  # per fault kind ("start": before the first fault)
    lost_each: dict[int, float] = field(default_factory=dict)  # per fault (its index): seconds lost after it
    # Per fault: the steps after it slower than their generation's median, by how much in all (not lost: the
    # cost of training on slowed down, a replacement starting beside the survivors, and the machine's noise)
    slow_each: dict[int, float] = field(default_factory=dict)
    step_s: float = 0.0  # the median step's length
    timeline: list[tuple[float, int]] = field(default_factory=list)  # (wall time, step) of the kept steps
    paced_s: float = 0.0  # in the kept steps at their generation's median pace (every slow step's excess lost)

    @property
    def ratio(self) -> float:
        return self.kept_s / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def paced_ratio(self) -> float:
        """A stricter figure: a step slower than its generation's median loses the difference too."""
        return self.paced_s / self.wall_s if self.wall_s > 0 else 0.0


def account(kept: list[KeptStep], faults: list[Fault]) -> Accounting:
    """Split the time from the final model's first step to its last into time spent in those steps and
    time lost, from the audit's records of the kept steps (``edl.storage.audit.kept_steps``: when each
    trainer logged each step, before its all-reduce; a step's time is its latest trainer's).

    A gap between two kept steps up to ``STALL_STEPS`` times what a step takes in their generation (its
    median) is a step, however slow (a busy machine, a collection of garbage, a peer starting beside
    it); a longer one is a stall: the job spent a step's time in it, the rest is lost (a pause, a
    restart, a hang, or steps made and then rolled back, which are not in the lineage) and charged to
    the latest fault before training went on (the one that caused it: a rollback's lost steps were made
    before it). A gap over several steps (``s - p`` of them) is judged as that many. ``paced_s`` counts
    every step at most at the median's pace; ``slow_each`` charges the rest of each slow step to the
    latest fault before it."""
    out = Accounting()
    when: dict[int, tuple[tuple[int, int], float]] = {}
    for s in kept:
        if s.at is not None:
            seen = when.get(s.step)
            when[s.step] = (s.key, s.at if seen is None else max(seen[1], s.at))
    order = sorted(when)
    if len(order) < 2:
        return out
    out.timeline = [(when[s][1], s) for s in order]
    out.first_at = when[order[0]][1]
    out.wall_s = when[order[-1]][1] - out.first_at
    per_gen: dict[tuple[int, int], list[float]] = {}
    for p, s in zip(order, order[1:]):
        if when[p][0] == when[s][0]:
            per_gen.setdefault(when[s][0], []).append((when[s][1] - when[p][1]) / (s - p))
    everywhere = [x for xs in per_gen.values() for x in xs]
    out.step_s = statistics.median(everywhere) if everywhere else out.wall_s / (order[-1] - order[0])
    typical = {k: statistics.median(xs) for k, xs in per_gen.items()}
    fault_at = [f.t for f in faults]
    for p, s in zip(order, order[1:]):
        gap = when[s][1] - when[p][1]
        expected = typical.get(when[s][0], out.step_s) * (s - p)
        excess = gap - expected
        out.paced_s += min(max(0.0, gap), expected)
        i = max((k for k, ft in enumerate(fault_at) if ft <= when[s][1]), default=-1)
        if gap <= max(STALL_STEPS * expected, expected + 1e-3):  # a step, however slow (1 ms: the records' resolution)
            out.kept_s += max(0.0, gap)
            if excess > 0 and i >= 0:
                out.slow_each[i] = out.slow_each.get(i, 0.0) + excess
            continue
        out.kept_s += expected
        kind = faults[i].kind if i >= 0 else "start"
        out.lost_s[kind] = out.lost_s.get(kind, 0.0) + excess
        if i >= 0:
            out.lost_each[i] = out.lost_each.get(i, 0.0) + excess
    return out


# Past this after a fault, a change the master heard of is not the fault's (a fault whose job never changed:
# an apiserver stop, a fault while the job was already changing).
CHAIN_WINDOW_S = 60.0


def breakdown(faults: list[Fault], generations: list[dict], lost_each: dict[int, float]) -> list[dict]:
    """Where each fault's time went: the change the master began for it (before the next fault, within
    ``CHAIN_WINDOW_S``) and its chain, from the run summary's records of the generations (``wall_at``:
    when the master heard of the change; its chain, in seconds after that): ``told_s`` from the fault to
    the master hearing of it, then ``stopped``, ``formed`` and ``first_step`` after that; ``cause`` is
    how it heard, ``source`` where the state came from.

    The fault's change is a new master's first generation for a master's fault; the first whose cause
    names a trainer the fault's ``detail`` names (its pod, the pods on its node); failing that, for a
    fault whose detail names no trainer edl knows by that name (a pid, a count), the first change after
    it. A fault with no detail (the apiserver stopped) changes nothing by itself: only its ``lost_s``."""
    out = []
    begun = sorted((g for g in generations if g.get("wall_at") is not None), key=lambda g: g["wall_at"])
    for i, f in enumerate(faults):
        until = min(faults[i + 1].t if i + 1 < len(faults) else float("inf"), f.t + CHAIN_WINDOW_S)
        window = [g for g in begun if f.t <= g["wall_at"] < until]
        names = set(re.findall(r"[\w.-]+", f.detail))
        if "master" in f.kind:
            g = next((g for g in window if (g.get("cause") or "").startswith("a new master")), None)
        elif names:
            g = next((g for g in window if (g.get("cause") or " ").split(" ", 1)[0] in names), None)
            if g is None and not any("trainer" in n for n in names):
                g = window[0] if window else None
        else:
            g = None
        row: dict = {"kind": f.kind, "lost_s": round(lost_each.get(i, 0.0), 3)}
        if g is not None:
            row.update(generation=g["id"], cause=g.get("cause", ""), source=g.get("source"),
                       told_s=round(g["wall_at"] - f.t, 3), **{f"{k}_s": v for k, v in (g.get("chain") or {}).items()})
        out.append(row)
    return out


CHAIN_PARTS = ("told_s", "stopped_s", "formed_s", "first_step_s")


def chains_by_kind(rows: list[dict]) -> dict[str, dict]:
    """``breakdown``'s rows summed up per kind of fault: how many changed the job, the mean of each part
    of their chains and of the time lost, and how the master heard of them (the trainer's name left out),
    most often first."""
    out: dict[str, dict] = {}
    for kind in sorted({r["kind"] for r in rows}):
        mine = [r for r in rows if r["kind"] == kind]
        changed = [r for r in mine if "told_s" in r]
        causes: dict[str, int] = {}
        for r in changed:
            how = re.sub(r"^\S+-t(rainer-)?\d+\b", "a trainer", r["cause"] or "not recorded")
            causes[how] = causes.get(how, 0) + 1
        out[kind] = {"count": len(mine), "changed": len(changed),
                     **{part: round(statistics.mean(xs), 3) if (xs := [r[part] for r in changed if part in r])
                        else None for part in CHAIN_PARTS},
                     "lost_s": round(statistics.mean(r["lost_s"] for r in mine), 3),
                     "causes": dict(sorted(causes.items(), key=lambda kv: -kv[1]))}
    return out


# ------------------------------------------------------------------ the job and its faults
class Soak:
    """The job (its launcher relaunched after a ``launcher-restart``) and the faults done to it."""

    def __init__(self, work: Path, args: list[str], rng: random.Random, minio) -> None:
        self.work, self.args, self.rng, self.minio = work, args, rng, minio
        self.t0 = time.time()
        self.faults: list[Fault] = []
        self.timers: list[threading.Timer] = []  # the ends of hangs and outages
        self.incarnation = 0
        self.job = self._start()

    def _start(self) -> EdlJob:
        self.incarnation += 1
        return EdlJob("soak", self.args, self.work / "home", self.work / f"launcher-{self.incarnation}.log")

    def now(self) -> float:
        return time.time() - self.t0

    def _later(self, delay_s: float, fn, *args) -> None:
        timer = threading.Timer(delay_s, fn, args)
        timer.start()
        self.timers.append(timer)

    def ended(self) -> bool:
        return self.job.proc.poll() is not None

    def fault(self, kind: str, st: dict | None) -> None:
        try:
            info = self.job.info()
        except (OSError, ValueError):
            return  # between masters: job.json is being rewritten
        pids = [p for p in (info.get("trainers") or {}).values() if p]
        detail = ""
        if kind in ("trainer-sigkill", "trainer-sigterm", "trainer-hang"):
            if not pids:
                return
            pid = self.rng.choice(pids)
            sig = {"trainer-sigkill": signal.SIGKILL, "trainer-sigterm": signal.SIGTERM,
                   "trainer-hang": signal.SIGSTOP}[kind]
            if not _signal(pid, sig):
                return
            if kind == "trainer-hang":
                self._later(HANG_S, _signal, pid, signal.SIGCONT)
            detail = str(pid)
        elif kind == "master-sigkill":
            if not info.get("master_pid") or not _signal(info["master_pid"], signal.SIGKILL):
                return
        elif kind == "scale":
            now = st["desired_trainers"] if st else 2
            n = self.rng.choice([k for k in (1, 2, 3) if k != now])
            r = subprocess.run([sys.executable, "-m", "edl", "scale", "soak", "--trainers", str(n)],
                               env={**os.environ, "EDL_HOME": str(self.work / "home")}, capture_output=True,
                               timeout=30)
            if r.returncode != 0:
                return
            detail = str(n)
        elif kind == "s3-outage":
            if self.minio.proc is None:
                return  # still down from the last one
            down = self.rng.uniform(2, 5)
            self.minio.stop()
            self._later(down, self.minio.start)
            detail = f"{down:.1f} s"
        elif kind == "launcher-restart":
            _signal(self.job.proc.pid, signal.SIGKILL)
            self.job.proc.wait()
            self.job.log.close()
            self.job = self._start()
        self.faults.append(Fault(time.time(), kind, detail))


def _signal(pid: int, sig: int) -> bool:
    try:
        os.kill(pid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def _minio(work: Path):
    """MinIO from the test plane's build cache, or None where it has not been built."""
    sys.path.insert(0, str(ROOT))
    from tests.plane import build
    from tests.plane.s3 import MinioServer

    if not build.MINIO.path().exists():
        return None
    server = MinioServer(work / "minio").start()
    server.client().make_bucket("soak")
    os.environ.update(server.env)  # the jobs' and this process's S3 endpoint and keys
    return server


def job_args(data: Path, checkpoints: str, epochs: int, summary: Path) -> list[str]:
    return ["--model-def", "edl.zoo.mlp", "--data", str(data), "--epochs", str(epochs), "--batch-size", "64",
            "--min-trainers", "1", "--max-trainers", "3", "--trainers", "2", "--checkpoint-uri", checkpoints,
            "--checkpoint-interval", "4", "--audit", "--summary-out", str(summary)]


def pilot_epoch_s(work: Path, data: Path, checkpoints: str) -> float:
    """One fault-free epoch: seconds from its first step to its end."""
    job = EdlJob("pilot", job_args(data, checkpoints + "/pilot", 1, work / "pilot.json"), work / "home",
                 work / "pilot.log")
    try:
        job.wait_for(lambda s: s["step"] > 0, 300)
        began = time.monotonic()
        if job.proc.wait(900) != 0:
            raise RuntimeError(f"the pilot failed: see {work / 'pilot.log'}")
        return time.monotonic() - began
    finally:
        job.stop()


def run(a: argparse.Namespace, work: Path, console: Console) -> dict:
    from edl.data.prepare import prepare_synthetic

    prepare_synthetic(str(work / "data"), 40000, 256, 10)
    data = work / "data" / "train"
    minio = _minio(work) if "s3-outage" in a.kinds else None
    kinds = [k for k in a.kinds if k != "s3-outage" or minio is not None]
    if "s3-outage" in a.kinds and minio is None:
        console.print("MinIO is not built here (./dev test builds it): no s3-outage faults")
    checkpoints = "s3://soak/ckpt" if minio is not None else str(work / "ckpt")
    try:
        epochs, epoch_s = a.epochs, None
        if epochs is None:
            epoch_s = pilot_epoch_s(work, data, checkpoints)
            epochs = max(1, round(a.minutes * 60 / epoch_s))
            console.print(f"pilot: one epoch in {epoch_s:.1f} s: {epochs} epochs for about {a.minutes:g} minutes")
        rng = random.Random(a.seed)
        soak = Soak(work, job_args(data, checkpoints, epochs, work / "summary.json"), rng, minio)
        next_at = None
        with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[info]}"),
                      TimeElapsedColumn(), console=console, transient=True) as bar:
            task = bar.add_task("soak", total=epochs, info="starting")
            while not soak.ended():
                st = soak.job.status()
                if st is not None:
                    bar.update(task, completed=st["epochs_completed"],
                               info=f"step {st['step']}, {st['world_size']} trainer(s), {len(soak.faults)} faults")
                    if next_at is None:
                        next_at = soak.now() + rng.uniform(a.interval * 2 / 3, a.interval * 4 / 3)
                if next_at is not None and soak.now() >= next_at:
                    soak.fault(rng.choice(kinds), st)
                    next_at = soak.now() + rng.uniform(a.interval * 2 / 3, a.interval * 4 / 3)
                time.sleep(POLL_S)
        code = soak.job.proc.wait()
        soak.job.stop()
        for timer in soak.timers:
            timer.join()  # MinIO back before the audit is read
        summary = (json.loads((work / "summary.json").read_text()) if (work / "summary.json").exists()
                   else failed_without_summary(work / f"launcher-{soak.incarnation}.log", code))
        store = open_store(checkpoints, "--checkpoint-uri")  # (MinIO's keys: this process has them)
        lines = list(read_audit_lines(store))
        kept = kept_steps(lines)
        acc = account(kept, soak.faults)
        return result(a, epochs, code, summary, soak.faults, soak.t0, acc,
                      len(made_steps(lines) - {(k.key, k.step) for k in kept}), epoch_s)
    finally:
        if minio is not None:
            minio.stop()


def failed_without_summary(log: Path, code: int) -> dict:
    """What the result says of a launcher that ended without a summary (it failed before the job's end):
    its error line."""
    errors = [line for line in log.read_text(errors="replace").splitlines() if line.startswith("edl: error:")]
    return {"status": "failed", "error": errors[-1].removeprefix("edl: error:").strip() if errors
            else f"the launcher exited {code} without a summary"}


def made_steps(lines: list[str]) -> set[tuple[tuple[int, int], int]]:
    """Every (generation, step) any trainer made, kept or not."""
    out = set()
    for line in lines:
        rec = json.loads(line)
        if "step" in rec:
            out.add(((int(rec["gen"][0]), int(rec["gen"][1])), int(rec["step"])))
    return out


def result(a: argparse.Namespace, epochs: int, code: int, summary: dict, faults: list[Fault], t0: float,
           acc: Accounting, rolled_back: int, pilot_epoch: float | None = None) -> dict:
    per_kind: dict[str, dict] = {}
    lost_by_fault: dict[int, float] = {}
    lost_by_fault.update(acc.lost_each)
    for i, f in enumerate(faults):
        k = per_kind.setdefault(f.kind, {"count": 0, "lost_s": [], "slow_s": []})
        k["count"] += 1
        k["lost_s"].append(round(lost_by_fault.get(i, 0.0), 3))
        k["slow_s"].append(round(acc.slow_each.get(i, 0.0), 3))
    return {
        "seed": a.seed, "minutes": getattr(a, "minutes", None) if a.epochs is None else None, "interval_s": a.interval, "epochs": epochs, "exit_code": code,
        "status": summary.get("status"), "error": summary.get("error"),
        "lost_samples": summary.get("lost_samples"), "duplicate_samples": summary.get("duplicate_samples"),
        "wall_s": round(acc.wall_s, 1), "kept_s": round(acc.kept_s, 1), "effective_ratio": round(acc.ratio, 4),
        "paced_ratio": round(acc.paced_ratio, 4),
        "pilot_epoch_s": round(pilot_epoch, 2) if pilot_epoch else None,
        "lost_before_first_fault_s": round(acc.lost_s.get("start", 0.0), 2), "median_step_s": round(acc.step_s, 4),
        "rolled_back_steps": rolled_back,  # made, then undone: not in the final model's lineage
        "faults": per_kind,
        "budgets": summary.get("budgets"), "generations": len(summary.get("generations") or []),
        "kept_steps": [[round(t - t0, 2), step] for t, step in acc.timeline[:: max(1, len(acc.timeline) // 4000)]],
        "fault_log": [[round(f.t - t0, 2), f.kind, f.detail] for f in faults],
        "breakdown": (rows := breakdown(faults, summary.get("generations") or [], acc.lost_each)),
        "chains": chains_by_kind(rows),
    }


def plot(res: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 4))
    ax.plot([t for t, _ in res["kept_steps"]], [s for _, s in res["kept_steps"]], color="black", linewidth=0.8,
            label="steps the final model kept")
    kinds = sorted({k for _, k, _ in res["fault_log"]})
    colors = dict(zip(kinds, plt.get_cmap("tab10").colors))
    for kind in kinds:
        ts = [t for t, k, _ in res["fault_log"] if k == kind]
        ax.vlines(ts, 0, 1, transform=ax.get_xaxis_transform(), colors=[colors[kind]], alpha=0.7, linewidth=1,
                  label=f"{kind} ({len(ts)})")
    ax.set_xlabel("seconds since the soak began")
    ax.set_ylabel("step")
    ax.set_title(f"{res['wall_s'] / 60:.0f} min, a fault every {res['interval_s']:g} s on average: "
                 f"effective training time {100 * res['effective_ratio']:.1f} %")
    ax.legend(loc="upper left", fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)


def print_table(res: dict, console: Console) -> None:
    verdict = (f"{res['status']}, lost {res['lost_samples']}, duplicated {res['duplicate_samples']}"
               if res["status"] == "succeeded" else f"{res['status']}: {res['error']}")
    t = Table(title=f"soak: {res['wall_s'] / 60:.0f} min of training, a fault every {res['interval_s']:g} s on average "
                    f"(seed {res['seed']}): {verdict}")
    t.add_column("fault")
    t.add_column("count", justify="right")
    t.add_column("lost: mean (s)", justify="right")
    t.add_column("max (s)", justify="right")
    t.add_column("total (s)", justify="right")
    t.add_column("slowed (s)", justify="right")  # the slower steps after it (not lost: see ``account``)
    for kind, k in sorted(res["faults"].items()):
        lost = k["lost_s"]
        t.add_row(kind, str(k["count"]), f"{statistics.mean(lost):.2f}", f"{max(lost):.2f}", f"{sum(lost):.1f}",
                  f"{sum(k.get('slow_s', [])):.1f}")
    console.print(t)
    if res.get("chains"):
        c = Table(title="where each kind's time went: mean seconds from the fault until the master heard of the change, "
                        "then after that until the old generation stopped, the new one formed, its first step")
        for col in ("fault", "changed the job", "told", "stopped", "formed", "first step", "lost", "how the master heard"):
            c.add_column(col, justify="left" if col in ("fault", "how the master heard") else "right")
        for kind, k in res["chains"].items():
            c.add_row(kind, f"{k['changed']} of {k['count']}",
                      *("" if k[p] is None else f"{k[p]:.2f}" for p in CHAIN_PARTS), f"{k['lost_s']:.2f}",
                      "; ".join(f"{how} ({n})" for how, n in k["causes"].items()))
        console.print(c)
    console.print(f"effective training time {100 * res['effective_ratio']:.1f} % of {res['wall_s']:.0f} s from the "
                  f"first step to the last (every step at the median's pace: {100 * res['paced_ratio']:.1f} %); "
                  f"{res['rolled_back_steps']} steps rolled back")


def parse_kinds(p: argparse.ArgumentParser, given: str, kinds: tuple[str, ...]) -> list[str]:
    """``--kinds``: a comma-separated list of ``kinds``; anything else is a one-line usage error."""
    out = [k.strip() for k in given.split(",") if k.strip()]
    unknown = [k for k in out if k not in kinds]
    if unknown or not out:
        p.error(f"--kinds: unknown {', '.join(unknown) or '(none given)'}; choose from {', '.join(kinds)}")
    return out


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="edl: one local job under a seeded rain of faults; prints the "
                                            "effective training time ratio and what each kind of fault cost")
    p.add_argument("--minutes", type=float, default=30.0,
                   help="how long the job trains without faults (its epochs are sized by a one-epoch pilot; "
                        "faults make it last longer); default 30")
    p.add_argument("--interval", type=float, default=15.0,
                   help="mean seconds between faults (each gap uniform in 2/3..4/3 of it); default 15")
    p.add_argument("--seed", type=int, default=1, help="seed of the fault schedule; default 1")
    p.add_argument("--kinds", default=",".join(KINDS),
                   help=f"comma-separated faults to draw from; default all: {','.join(KINDS)}")
    p.add_argument("--epochs", type=int, default=None, help="the job's epochs, skipping the pilot")
    p.add_argument("--keep", default=None, metavar="DIR",
                   help="work in DIR and leave it there (the job's logs, data and checkpoints); default a "
                        "temporary directory, removed at the end")
    p.add_argument("--out", default=None, help="result JSON; default bench/results/soak.json")
    p.add_argument("--plot", default=str(ROOT / "docs" / "soak.png"),
                   help="figure of the steps with the faults marked; '' for none; default docs/soak.png")
    a = p.parse_args(argv)
    a.kinds = parse_kinds(p, a.kinds, KINDS)
    if a.minutes <= 0 or a.interval <= 0:
        p.error("--minutes and --interval must be positive")
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    console = Console()
    if a.keep:
        Path(a.keep).mkdir(parents=True, exist_ok=True)
        res = run(a, Path(a.keep).resolve(), console)
    else:
        with tempfile.TemporaryDirectory(prefix="edl-soak-") as d:
            res = run(a, Path(d), console)
    return report(res, "soak", a.out, a.plot, console)


def report(res: dict, name: str, out: str | None, figure: str, console: Console) -> int:
    """Write the result (``out``, else bench/results/NAME.json) and the figure, print the table; the exit
    code: 0 when the job succeeded exactly once."""
    if out:
        path = Path(out)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(res, indent=2) + "\n")
    else:
        path = write_result(name, res)
    if figure:
        plot(res, Path(figure))
    print_table(res, console)
    console.print(f"written: {path}" + (f", {figure}" if figure else ""))
    return 0 if res["status"] == "succeeded" and res["lost_samples"] == 0 and res["duplicate_samples"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
