"""Failure recovery, case by case, against torchrun's restart-all elasticity.

    python bench/recovery.py [--framework paddle|torch] [--sizes 2 3 4] [--batch-size 64] [--rounds 3]

1. edl, edl.zoo.mlp (``--framework torch``: edl.zoo.torch.mlp, the same network), one job per group size n (``--trainers n``): each rank in turn is
   SIGKILLed (the launcher starts a replacement, which joins before the next case); then rank 0
   and the last rank in turn are stopped with SIGSTOP (a trainer that hangs without dying), woken
   with SIGCONT once the others went on, and must leave on its own.
   Per case: the pause (the master's: from learning of the fault to the next completed step),
   fault to next completed step, steps rolled back, whether every survivor stayed, and for a hang
   how long until it was excluded and how the woken trainer ended.
2. edl, graceful changes: scale-up 1 -> 2 -> ... -> ``--graceful-largest`` (default 4) and drain back
   to 1, ``--rounds`` times, each change by both protocols, one job after the other in this run: a
   prepared generation switched into at a step (edl's way now), and the stop at a step boundary with
   the next generation formed after it (``EDL_PREPARED_CHANGES=0``, edl's way before). Per change and
   group size: the master's pause (from the change's trigger to the next completed step; for a switch
   the trigger is the switch itself, the training going on until then), and *stop -> next step*: from
   the moment the old generation stopped stepping (its first member's report) to the new one's first
   completed step, one step included, the same measure for both (``--skip-faults``: only these).
3. torchrun --standalone --nproc_per_node 2 (restart-all) with the same MLP in DDP: SIGKILL one
   worker; time from the kill to the next completed step after the restart. torch is in the
   optional ``bench`` extra; without it the column reads "not installed".
Prints a table and writes bench/results/recovery.json (recovery_torch.json for PyTorch).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
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

from edl.procs import wait_ended

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ROOT, EdlJob, write_result  # noqa: E402


def _settled(n: int, after_step: int):
    """The job is back at ``n`` trainers, its last change's pause measured, and it stepped past ``after_step``."""
    return lambda s: (s["world_size"] == n and s["phase"] == "running" and s["step"] > after_step
                      and s["generations"][-1]["pause_s"] is not None)


def _failure_after(g: int):
    def find(s: dict) -> dict | None:
        return next((x for x in s["generations"] if x["master_generation"] > g and x["reason"] == "failure"
                     and x["first_step_at"] is not None), None)
    return find


def one_case(job: EdlJob, n: int, rank: int, kind: str, st: dict) -> tuple[dict, dict]:
    g = st["generation"]
    victim = next(t for t in st["trainers"] if t["rank"] == rank)
    survivors = {t["id"] for t in st["trainers"] if t["rank"] is not None and t["id"] != victim["id"]}
    step_before = st["step"]
    t_fault = time.monotonic()
    os.kill(victim["pid"], signal.SIGKILL if kind == "sigkill" else signal.SIGSTOP)
    find = _failure_after(g)
    st = job.wait_for(lambda s: find(s) is not None, timeout=120)
    fail = find(st)
    case = {
        "fault": kind, "group_size": n, "rank": rank,
        "pause_s": fail["pause_s"],
        "fault_to_next_step_s": round(fail["first_step_at"] - t_fault, 3),
        "rolled_back_steps": fail["rolled_back_steps"],
        "base_step": fail["base_step"], "step_seen_before": step_before,
        "source": fail["source"],
        "survivors_kept": survivors <= set(fail["members"]),
    }
    if kind == "sigstop":
        case["excluded_after_s"] = round(fail["triggered_at"] - t_fault, 3)
        st = job.wait_for(lambda s, m=st["step"]: s["step"] > m + 5, timeout=120)  # the others go on
        os.kill(victim["pid"], signal.SIGCONT)
        case["woken_left_cleanly"] = wait_ended(victim["pid"], 30)
        log = job.home / "jobs" / job.name / "logs" / f"{victim['id']}.log"
        case["woken_told"] = "dropped from the job" in log.read_text(errors="replace")
    st = job.wait_for(_settled(n, st["step"] + 10), timeout=180)  # the replacement joined
    return case, st


MODELS = {("paddle", "mlp"): "edl.zoo.mlp", ("torch", "mlp"): "edl.zoo.torch.mlp",
          ("paddle", "transformer"): "edl.zoo.transformer", ("torch", "transformer"): "edl.zoo.torch.transformer"}
MODEL = MODELS[("paddle", "mlp")]  # --framework and --model set it


def step_time(job: EdlJob, steps: int = 8) -> float:
    """Seconds per step of the job as it trains now: the time ``steps`` steps take."""
    first = job.wait_for(lambda s: s["phase"] == "running", timeout=120)
    t0, s0 = time.monotonic(), first["step"]
    job.wait_for(lambda s: s["step"] >= s0 + steps, timeout=600)
    return (time.monotonic() - t0) / steps


def edl_cases(tmp: Path, data: Path, batch: int, sizes: list[int], console: Console) -> list[dict]:
    cases: list[dict] = []
    for n in sizes:
        job = EdlJob(f"recovery-{n}", [
            "--model-def", MODEL, "--data", str(data), "--epochs", "1000", "--batch-size", str(batch),
            "--min-trainers", "1", "--max-trainers", str(n), "--trainers", str(n),
            "--checkpoint-uri", str(tmp / f"ckpt-{n}"), "--checkpoint-interval", "1e9",
            "--max-trainer-failures", "100",  # every killed trainer and every woken one counts
        ], tmp / f"home-{n}", tmp / f"edl-{n}.log")
        try:
            st = job.wait_for(_settled(n, 20), timeout=300)
            step_s = step_time(job)
            plan = [("sigkill", r) for r in range(n)] + [("sigstop", 0), ("sigstop", n - 1)]
            for kind, rank in plan:
                case, st = one_case(job, n, rank, kind, st)
                case["step_s"] = round(step_s, 4)
                case["pause_in_steps"] = round(case["pause_s"] / step_s, 2)
                console.print(f"  {kind} rank {rank} of {n}: pause {case['pause_s']} s "
                              f"({case['pause_in_steps']} steps of {step_s:.3f} s), "
                              f"rolled back {case['rolled_back_steps']}, survivors kept {case['survivors_kept']}")
                cases.append(case)
        except Exception:
            console.print(f"job of {n} failed; its log: {tmp / f'edl-{n}.log'} and {tmp / f'home-{n}'}")
            raise
        finally:
            job.stop()
    return cases


def scale(job: EdlJob, n: int) -> None:
    subprocess.run([sys.executable, "-m", "edl", "scale", job.name, "--trainers", str(n)], check=True, timeout=60,
                   env={**os.environ, "EDL_HOME": str(job.home)}, stdout=subprocess.DEVNULL)


def graceful_pauses(tmp: Path, data: Path, batch: int, rounds: int, largest: int = 4, prepared: bool = True) -> dict:
    """Scale-up 1 -> 2 -> ... -> ``largest`` and drain back down to 1, ``rounds`` times: each change's pause
    and stop -> next step, by the group size it changes into (scale-up) or out of (drain). ``prepared``:
    through a prepared generation (else stop at a boundary, ``EDL_PREPARED_CHANGES=0``)."""
    name = "graceful" if prepared else "graceful-stop"
    job = EdlJob(name, [
        "--model-def", MODEL, "--data", str(data), "--epochs", "1000", "--batch-size", str(batch),
        "--min-trainers", "1", "--max-trainers", str(largest), "--trainers", "1",
        "--checkpoint-uri", str(tmp / f"ckpt-{name}"), "--checkpoint-interval", "1e9",
    ], tmp / f"home-{name}", tmp / f"edl-{name}.log", env={"EDL_PREPARED_CHANGES": "1" if prepared else "0"})
    out: dict = {"scale_up": [], "scale_down": [], "by_size": {}, "stop_to_step": {"scale_up": [], "scale_down": []},
                 "switched": 0, "changes": 0}
    steps = [(n, "scale_up", n) for n in range(2, largest + 1)] + [(n, "scale_down", n + 1) for n in range(largest - 1, 0, -1)]
    try:
        st = job.wait_for(_settled(1, 20))
        for _ in range(rounds):
            for n, key, size in steps:
                g = st["generation"]
                scale(job, n)
                st = job.wait_for(lambda s, g=g, n=n: s["generation"] > g and _settled(n, 0)(s))
                gen = st["generations"][-1]
                pause = gen["pause_s"]
                stop_to_step = round(gen["first_step_at"] - gen["stopped_at"], 3)
                out[key].append(pause)
                out["stop_to_step"][key].append(stop_to_step)
                out["changes"] += 1
                out["switched"] += gen["prepared_s"] is not None
                sizes = out["by_size"].setdefault(str(size), {"scale_up": [], "scale_down": [],
                                                             "stop_to_step_scale_up": [], "stop_to_step_scale_down": []})
                sizes[key].append(pause)
                sizes["stop_to_step_" + key].append(stop_to_step)
                st = job.wait_for(_settled(n, st["step"] + 20))
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

    def steps() -> list[tuple[int, float, int]]:
        """(step, wall time, restart round) of every step rank 0 completed."""
        path = work / "steps.log"
        if not path.exists():
            return []
        out = []
        for line in path.read_text().splitlines():
            parts = line.split()
            if len(parts) == 3:
                out.append((int(parts[0]), float(parts[1]), int(parts[2])))
        return out

    def wait_steps(after: float, n: int, timeout: float = 180, round_: int = 0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if sum(1 for _, t, r in steps() if t > after and r >= round_) >= n:
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
            last_step, _, round_ = steps()[-1]
            pid = int((work / "pid-1").read_text())
            t_kill = time.time()  # the steps log holds wall-clock times
            os.kill(pid, signal.SIGKILL)
            # The next step of the restarted workers (rank 0 may still log the step it was in).
            wait_steps(t_kill, 1, round_=round_ + 1)
            nxt = next((s, t) for s, t, r in steps() if t > t_kill and r > round_)
            out["kill_to_next_step_s"].append(nxt[1] - t_kill)
            out["redone_steps"].append(max(0, last_step - nxt[0] + 1))
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        for pid_file in work.glob("pid-*"):  # torchrun starts its workers in sessions of their own
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid_file.read_text()), signal.SIGKILL)
        log.close()
    return out


def main() -> int:
    p = argparse.ArgumentParser(description="edl failure recovery per case vs torchrun")
    p.add_argument("--framework", choices=("paddle", "torch"), default="paddle",
                   help="the trainers' framework: edl.zoo.mlp or edl.zoo.torch.mlp (default paddle)")
    p.add_argument("--model", choices=("mlp", "transformer"), default="mlp",
                   help="the zoo's mlp, or its 23 M-parameter transformer on generated tokens (batch 16; no "
                        "torchrun comparison: its script trains the mlp); default mlp")
    p.add_argument("--sizes", type=int, nargs="+", default=[2, 3, 4], help="group sizes (default 2 3 4)")
    p.add_argument("--batch-size", type=int, default=64, help="records per trainer per step (default 64)")
    p.add_argument("--rounds", type=int, default=3, help="graceful changes and torchrun kills (default 3)")
    p.add_argument("--graceful-largest", type=int, default=4,
                   help="graceful changes scale 1 -> ... -> this and back (default 4)")
    p.add_argument("--skip-faults", action="store_true", help="only the graceful changes (and torchrun)")
    console = Console(width=150)
    p.add_argument("--keep", action="store_true", help="keep the jobs' directories (logs) for a look afterwards")
    a = p.parse_args()
    global MODEL
    MODEL = MODELS[(a.framework, a.model)]
    if a.model == "transformer" and a.batch_size == 64:
        a.batch_size = 16
    workdir = (contextlib.nullcontext(tempfile.mkdtemp(prefix="edl-bench-")) if a.keep
               else tempfile.TemporaryDirectory(prefix="edl-bench-"))
    with workdir as d:
        tmp = Path(d)
        from edl.data.prepare import prepare_synthetic, prepare_tokens

        if a.model == "transformer":
            prepare_tokens(str(tmp / "data"), 20000, 64, 8192, 10, shards=4)
        else:
            prepare_synthetic(str(tmp / "data"), 50000, 256, 10, shards=4)
        data = tmp / "data" / "train"
        cases: list[dict] = []
        if not a.skip_faults:
            console.print("edl: SIGKILL of every rank, SIGSTOP of the first and the last ...")
            cases = edl_cases(tmp, data, a.batch_size, a.sizes, console)
        console.print(f"edl: graceful scale-up 1 -> {a.graceful_largest} and drain back to 1, prepared ...")
        graceful = graceful_pauses(tmp, data, a.batch_size, a.rounds, a.graceful_largest)
        console.print("edl: the same, stopping at a step boundary (EDL_PREPARED_CHANGES=0) ...")
        graceful_stop = graceful_pauses(tmp, data, a.batch_size, a.rounds, a.graceful_largest, prepared=False)
        tr: dict | None = None
        if a.model == "mlp" and importlib.util.find_spec("torch") is not None:
            console.print("torchrun: SIGKILL of one worker ...")
            tr = torchrun_recovery(tmp, data, a.batch_size, a.rounds)
    torch_s = None if tr is None else statistics.median_high(tr["kill_to_next_step_s"])
    torch_cell = "not installed" if torch_s is None else f"{torch_s:.2f}"
    kills = [c for c in cases if c["fault"] == "sigkill"]
    stops = [c for c in cases if c["fault"] == "sigstop"]
    result = {
        "framework": a.framework, "model": MODEL, "batch_per_trainer": a.batch_size,
        "sizes": a.sizes,
        "command": "python bench/recovery.py " + " ".join(sys.argv[1:]),
        "cases": cases, "graceful": graceful, "graceful_stop": graceful_stop,
        "torchrun": tr if tr is not None else "not installed",
        "median": {"scale_up_pause_s": statistics.median_high(graceful["scale_up"]), "drain_pause_s": statistics.median_high(graceful["scale_down"])},
        "graceful_median_by_size": {n: {k: statistics.median_high(v) for k, v in d.items() if v} for n, d in graceful["by_size"].items()},
        "graceful_stop_median_by_size": {n: {k: statistics.median_high(v) for k, v in d.items() if v}
                                         for n, d in graceful_stop["by_size"].items()},
        "worst": {
            "sigkill_pause_s": max(c["pause_s"] for c in kills) if kills else None,
            "sigkill_fault_to_next_step_s": max(c["fault_to_next_step_s"] for c in kills) if kills else None,
            "sigkill_rolled_back_steps": max(c["rolled_back_steps"] for c in kills) if kills else None,
            "sigstop_excluded_after_s": max(c["excluded_after_s"] for c in stops) if stops else None,
            "sigstop_rolled_back_steps": max(c["rolled_back_steps"] for c in stops) if stops else None,
            "survivors_lost": sum(not c["survivors_kept"] for c in cases),
        },
        "torchrun_kill_to_next_step_s": torch_s,
    }
    name = "recovery_graceful" if a.skip_faults else "recovery"  # keeps the faults' figures
    name += ("" if a.framework == "paddle" else "_torch") + ("" if a.model == "mlp" else "_transformer")
    path = write_result(name, result)
    t = Table(title="trainer faults, one row per case (seconds; target: SIGKILL pause ≤ 1, hang excluded ≤ 10)")
    for col in ("fault", "n", "rank", "pause", "fault → next step", "excluded after", "rolled back",
                "survivors kept", "woken left", "torchrun (restart-all)"):
        t.add_column(col, justify="right")
    for c in cases:
        t.add_row(c["fault"], str(c["group_size"]), str(c["rank"]), f"{c['pause_s']:.2f}",
                  f"{c['fault_to_next_step_s']:.2f}", f"{c['excluded_after_s']:.2f}" if "excluded_after_s" in c else "-",
                  str(c["rolled_back_steps"]), "yes" if c["survivors_kept"] else "NO",
                  ("yes" if c["woken_left_cleanly"] and c["woken_told"] else "NO") if "woken_told" in c else "-",
                  torch_cell if c["fault"] == "sigkill" and c["group_size"] == 2 else "-")
    console.print(t)
    g = Table(title=f"graceful changes, median of {a.rounds} (seconds; target: pause ≤ 0.3)")
    for col in ("change", "group", "prepared: pause", "prepared: stop → next step", "stop at boundary: pause",
                "stop at boundary: stop → next step"):
        g.add_column(col, justify="right")
    for key, label in (("scale_up", "scale-up into"), ("scale_down", "drain out of")):
        for n in sorted(result["graceful_median_by_size"], key=int):
            now, before = result["graceful_median_by_size"][n], result["graceful_stop_median_by_size"].get(n, {})
            if key in now:
                g.add_row(label, n, f"{now[key]:.2f}", f"{now['stop_to_step_' + key]:.2f}",
                          f"{before[key]:.2f}" if key in before else "-",
                          f"{before['stop_to_step_' + key]:.2f}" if key in before else "-")
    console.print(g)
    console.print(f"prepared changes switched into without a stop: {graceful['switched']} of {graceful['changes']}")
    console.print(f"worst: {result['worst']}; graceful, median of {a.rounds}: {result['median']}; written to {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
