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
3. The peers, on the same MLP, batch and data (``--peers``; torch, torchft and DLRover are in the optional
   ``bench`` extra: a peer that is missing reads "not installed", one that fails "cannot run here: <why>"):
   - torchrun --standalone --nproc_per_node 2 (restart-all) with the MLP in DDP (_torch_ddp.py): SIGKILL
     one worker ``--rounds`` times; time from the kill to the next completed step after the restart.
   - ``--framework torch`` only: dlrover-run --standalone (DLRover 0.6.1, restart-all too), the same script
     and kills; then one worker stopped (SIGSTOP) for ``--peer-hang-window`` seconds: the steps it
     completes meanwhile.
   - ``--framework torch`` only: torchft 0.2.0 (per-step quorums), n = each of ``--sizes`` replica groups of
     one process (_torchft_peer.py): SIGKILL the first and the last group in turn (restarted once the
     survivors stepped; it rejoins by a checkpoint transfer), SIGSTOP the last (woken after 5 steps of
     the others), then group n + 1 joins. Per case: the survivors' fault -> next step, their longest gap
     between steps, the (re)started or woken group's time to its first step, steps not committed.
   ``--only-peers`` runs the peers alone (recovery_peers_torch.json).
Prints tables and writes bench/results/recovery.json (recovery_torch.json for PyTorch).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from rich.console import Console
from rich.table import Table

from edl.net import free_port
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


# ---- the peers: torchrun's and DLRover's restart-all, torchft's per-step fault tolerance ----------------

PeerResult = dict | str  # the figures, or why there are none ("not installed", "cannot run here: ...")


def spawn(cmd: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    """``cmd`` in a session of its own (so that ``kill_session`` ends it and whatever it started), output to ``log``."""
    with log.open("ab") as out:
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", **(env or {})})


def kill_session(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(10)


def restart_all_recovery(tmp: Path, name: str, launcher: list[str], data: Path, batch: int, rounds: int,
                         env: dict[str, str] | None = None, hang_window_s: float = 0) -> dict:
    """``launcher`` (torchrun's or dlrover-run's, 2 workers) runs _torch_ddp.py: SIGKILL worker 1 ``rounds``
    times, each time the kill to the next step completed after the restart, and the steps done again.
    ``hang_window_s``: then SIGSTOP worker 1 and count the steps completed in that many seconds."""
    work = tmp / name
    work.mkdir()
    log_path = tmp / f"{name}.log"
    proc = spawn([*launcher, "--nproc_per_node", "2", "--max-restarts", str(rounds + 1), "--monitor-interval", "0.1",
                  str(ROOT / "bench" / "_torch_ddp.py"), "--data", str(data), "--workdir", str(work),
                  "--batch-size", str(batch)], log_path, env)

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
                raise RuntimeError(f"{name} exited with {proc.returncode}; see {log_path}")
            time.sleep(0.05)
        raise TimeoutError(f"{name} made no progress in {timeout} s; see {log_path}")

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
        if hang_window_s:
            out["sigstop"] = restart_all_hang(work, steps, hang_window_s)
    finally:
        kill_session(proc)
        for pid_file in work.glob("pid-*"):  # torchrun starts its workers in sessions of their own
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid_file.read_text()), signal.SIGKILL)
    return out


def restart_all_hang(work: Path, steps: Callable[[], list[tuple[int, float, int]]], window_s: float) -> dict:
    """SIGSTOP worker 1 for ``window_s`` seconds: the steps rank 0 completes meanwhile (its all-reduce waits for
    the stopped worker until Gloo's timeout, 30 min by default), then SIGCONT."""
    pid = int((work / "pid-1").read_text())
    before = len(steps())
    t_stop = time.time()
    os.kill(pid, signal.SIGSTOP)
    try:
        time.sleep(window_s)
        done = [t for _, t, _ in steps()[before:] if t > t_stop + 1]  # a step under way at the stop may end
        return {"window_s": window_s, "steps_completed_in_window": len(done),
                "next_step_after_s": round(done[0] - t_stop, 3) if done else None}
    finally:
        os.kill(pid, signal.SIGCONT)


def torchrun_recovery(tmp: Path, data: Path, batch: int, rounds: int) -> dict:
    return restart_all_recovery(tmp, "torchrun", [sys.executable, "-m", "torch.distributed.run", "--standalone"],
                                data, batch, rounds)


def dlrover_recovery(tmp: Path, data: Path, batch: int, rounds: int, hang_window_s: float) -> PeerResult:
    """``dlrover-run --standalone`` (DLRover 0.6.1) with the same script and kills as torchrun.

    dlrover-run --standalone starts its local master through torch's SubprocessHandler with six
    arguments, and torch 2.13's takes seven (``numa_options``, without a default): "TypeError:
    SubprocessHandler.__init__() missing 1 required positional argument: 'numa_options'" ends it
    before any worker starts. So the benchmark starts that master itself, the same command with the same
    arguments, and points dlrover-run at it (DLROVER_MASTER_ADDR), which is then the same agent and
    rendezvous as --standalone's (dlrover-run logs "Use distributed mode instead of standalone mode")."""
    run = Path(sys.executable).with_name("dlrover-run")
    if importlib.util.find_spec("dlrover") is None or not run.exists():
        return "not installed"
    port = free_port()
    events = tmp / "dlrover-events"  # DLRover's agent writes its event logs to /tmp/dlrover otherwise
    env = {"DLROVER_EVENT_FILE_DIR": str(events), "DLROVER_MASTER_ADDR": f"127.0.0.1:{port}"}
    master = spawn([sys.executable, "-u", "-m", "dlrover.python.master.main", "--port", str(port), "--node_num", "1",
                    "--job_name", "edl-bench", "--platform", "local"], tmp / "dlrover-master.log", env)
    try:
        if not wait_port(port, 120):
            return f"cannot run here: DLRover's master did not listen on {port} in 120 s (see {tmp / 'dlrover-master.log'})"
        out = restart_all_recovery(tmp, "dlrover", [str(run), "--standalone"], data, batch, rounds, env, hang_window_s)
    finally:
        kill_session(master)
    out["launch"] = "dlrover-run --standalone, its local master started by the benchmark (see dlrover_recovery)"
    return out


def wait_port(port: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
        time.sleep(0.2)
    return False


FtStep = tuple[float, int, bool, int]  # (time.monotonic(), step, committed, participants): a line of _torchft_peer.py


class FtJob:
    """torchft's lighthouse and replica groups of one _torchft_peer.py process each, every one in a session of
    its own. The lighthouse runs with the flags of torchft's README (min 1 replica, quorum tick 100 ms, join
    timeout 10 s) and its default heartbeat timeout (5 s): a replica that stops heartbeating is dropped
    from the quorum after that."""

    def __init__(self, tmp: Path, data: Path, batch: int, shards: int) -> None:
        self.work, self.data, self.batch, self.shards = tmp, data, batch, shards
        port = free_port()
        self.lighthouse_addr = f"http://localhost:{port}"
        self.lighthouse = spawn([str(Path(sys.executable).with_name("torchft_lighthouse")), "--bind", f"[::]:{port}",
                                 "--min_replicas", "1", "--quorum_tick_ms", "100", "--join_timeout_ms", "10000"],
                                tmp / "lighthouse.log")
        self.replicas: dict[int, subprocess.Popen] = {}

    def start(self, r: int) -> float:
        """Start replica group ``r`` (again); the time it was started."""
        t = time.monotonic()
        self.replicas[r] = spawn([sys.executable, str(ROOT / "bench" / "_torchft_peer.py"), "--data", str(self.data),
                                  "--workdir", str(self.work), "--replica", str(r), "--shards", str(self.shards),
                                  "--lighthouse", self.lighthouse_addr, "--batch-size", str(self.batch)],
                                 self.work / f"replica-{r}.log")
        return t

    def steps(self, r: int) -> list[FtStep]:
        path = self.work / f"steps-r{r}.log"
        out: list[FtStep] = []
        for line in path.read_text().splitlines() if path.exists() else []:
            parts = line.split()
            if len(parts) == 4:  # the last line may be half written
                out.append((float(parts[1]), int(parts[0]), parts[2] == "1", int(parts[3])))
        return out

    def commits(self, r: int, after: float = 0, until: float = float("inf")) -> list[FtStep]:
        return [s for s in self.steps(r) if s[2] and after < s[0] <= until]

    def first_step(self, r: int, started: float) -> dict:
        """Replica ``r`` (re)started at ``started``: the time to its first commit, and the part of it after
        its manager came up (the quorum, the heal by checkpoint transfer, the step)."""
        first = self.commits(r, started)[0][0]
        ready = float((self.work / f"ready-r{r}").read_text())
        return {"start_to_first_step_s": round(first - started, 3), "manager_to_first_step_s": round(first - ready, 3)}

    def settled(self, members: list[int], after: float = 0, steps: int = 5) -> bool:
        """Every member's last ``steps`` commits (after ``after``) had all the members in the quorum."""
        for r in members:
            last = self.commits(r, after)[-steps:]
            if len(last) < steps or any(s[3] != len(members) for s in last):
                return False
        return True

    def wait(self, what: str, pred: Callable[[], bool], alive: list[int], timeout: float = 180) -> None:
        """Until ``pred()``; the replicas ``alive`` must not end meanwhile (a crash is no slow recovery)."""
        deadline = time.monotonic() + timeout
        while not pred():
            if self.lighthouse.poll() is not None:
                raise RuntimeError(f"torchft's lighthouse exited with {self.lighthouse.returncode}")
            for r in alive:
                if self.replicas[r].poll() is not None:
                    raise RuntimeError(f"torchft: {what}: replica {r} exited with {self.replicas[r].returncode} "
                                       f"(its log: {self.work / f'replica-{r}.log'})")
            if time.monotonic() > deadline:
                raise TimeoutError(f"torchft: {what}: not within {timeout} s (logs in {self.work})")
            time.sleep(0.05)

    def close(self) -> None:
        for proc in [*self.replicas.values(), self.lighthouse]:
            kill_session(proc)


def ft_longest_gap(job: FtJob, members: list[int], after: float, until: float) -> float:
    """The longest time between two commits of one member, over the gaps that end in (``after``, ``until``]."""
    gaps = [0.0]
    for r in members:
        times = [s[0] for s in job.commits(r)]
        gaps += [b - a for a, b in zip(times, times[1:]) if after < b <= until]
    return round(max(gaps), 3)


def ft_survivors(job: FtJob, survivors: list[int], t_fault: float, until: float) -> dict:
    """What the survivors saw of a fault: from it to their next commit (all of them), their longest gap
    between commits, the steps they did but could not commit, and the committed steps they gave up."""
    before = [job.commits(r, until=t_fault) for r in survivors]
    after = [job.commits(r, t_fault, until) for r in survivors]
    failed = [sum(1 for s in job.steps(r) if t_fault < s[0] <= until and not s[2]) for r in survivors]
    return {
        "fault_to_next_step_s": round(max(a[0][0] for a in after) - t_fault, 3),
        "longest_gap_s": ft_longest_gap(job, survivors, t_fault, until),
        "uncommitted_steps": max(failed),
        "rolled_back_steps": max(max(0, b[-1][1] - a[0][1] + 1) if b else 0 for b, a in zip(before, after)),
    }


def ft_kill(job: FtJob, members: list[int], victim: int) -> dict:
    """SIGKILL replica ``victim``; once the survivors committed a step without it, restart it (torchft
    leaves that to the launcher: torchrun or torchx in its examples) and time its rejoining (a heal)."""
    survivors = [r for r in members if r != victim]
    t_kill = time.monotonic()
    job.replicas[victim].send_signal(signal.SIGKILL)
    job.replicas[victim].wait(10)
    job.wait("the survivors' next step", lambda: all(job.commits(r, t_kill) for r in survivors), survivors)
    t_restart = job.start(victim)
    job.wait("the restarted replica's first step", lambda: bool(job.commits(victim, t_restart)), members)
    job.wait("all members in the quorum again", lambda: job.settled(members, t_restart), members)
    t_end = time.monotonic()
    return {"fault": "sigkill", "group_size": len(members), "replica": victim,
            **ft_survivors(job, survivors, t_kill, t_restart),
            **job.first_step(victim, t_restart),
            "rejoin_longest_gap_s": ft_longest_gap(job, survivors, t_restart, t_end)}


def ft_hang(job: FtJob, members: list[int], victim: int) -> dict:
    """SIGSTOP replica ``victim`` (its heartbeats stop too), let the survivors commit 5 steps without it,
    then SIGCONT: does it rejoin (a heal) or end?"""
    survivors = [r for r in members if r != victim]
    proc = job.replicas[victim]
    t_stop = time.monotonic()
    proc.send_signal(signal.SIGSTOP)
    try:
        job.wait("the survivors' next step", lambda: all(job.commits(r, t_stop) for r in survivors), survivors)
        job.wait("5 steps of the survivors", lambda: all(len(job.commits(r, t_stop)) >= 5 for r in survivors),
                 survivors)
    finally:
        t_cont = time.monotonic()
        proc.send_signal(signal.SIGCONT)
    case = {"fault": "sigstop", "group_size": len(members), "replica": victim,
            **ft_survivors(job, survivors, t_stop, t_cont)}
    job.wait("the woken replica's next step or its end",
             lambda: bool(job.commits(victim, t_cont)) or proc.poll() is not None, survivors)
    if proc.poll() is None:
        case["woken"] = "rejoined"
        case["woken_to_first_step_s"] = round(job.commits(victim, t_cont)[0][0] - t_cont, 3)
    else:
        case["woken"] = f"exited with {proc.returncode}"
        job.start(victim)
    job.wait("all members in the quorum again", lambda: job.settled(members, t_cont), members)
    case["rejoin_longest_gap_s"] = ft_longest_gap(job, survivors, t_cont, time.monotonic())
    return case


def ft_scale_up(job: FtJob, members: list[int], new: int) -> dict:
    """Start replica ``new`` beside ``members``: the members' longest gap until it is in the quorum."""
    t_start = job.start(new)
    job.wait("the new replica's first step", lambda: bool(job.commits(new, t_start)), [*members, new])
    job.wait("all in the quorum", lambda: job.settled([*members, new], t_start), [*members, new])
    return {"fault": "scale-up", "group_size": len(members) + 1, "replica": new, **job.first_step(new, t_start),
            "longest_gap_s": ft_longest_gap(job, members, t_start, time.monotonic())}


def torchft_recovery(tmp: Path, data: Path, batch: int, sizes: list[int], console: Console) -> PeerResult:
    """Per group count n: n replica groups train; SIGKILL the first and the last in turn (each restarted),
    SIGSTOP the last, then a replica group n + 1 joins."""
    if importlib.util.find_spec("torchft") is None:
        return "not installed"
    cases: list[dict] = []
    for n in sizes:
        work = tmp / f"torchft-{n}"
        work.mkdir()
        job = FtJob(work, data, batch, shards=n + 1)
        members = list(range(n))
        try:
            for r in members:
                job.start(r)
            job.wait("all replicas in one quorum", lambda: job.settled(members, steps=10), members, timeout=300)
            times = [s[0] for s in job.commits(0)[-11:]]
            step_s = statistics.median(b - a for a, b in zip(times, times[1:]))
            plan: list[Callable[[], dict]] = [lambda: ft_kill(job, members, 0), lambda: ft_kill(job, members, n - 1),
                                              lambda: ft_hang(job, members, n - 1), lambda: ft_scale_up(job, members, n)]
            for run in plan:
                case = run()
                case["step_s"] = round(step_s, 4)
                console.print(f"  torchft {case['fault']} replica {case['replica']} of {n}: {case}")
                cases.append(case)
        except Exception:
            console.print(f"torchft with {n} replica groups failed; its logs: {work}")
            raise
        finally:
            job.close()
    return {"cases": cases, "lighthouse": "--min_replicas 1 --quorum_tick_ms 100 --join_timeout_ms 10000 "
                                          "(heartbeat timeout 5 s, its default)",
            "replica": "ProcessGroupGloo(timeout 5 s), Manager(timeout 30 s, min_replica_size 1), HTTP checkpoint transport"}


def peer(name: str, run: Callable[[], PeerResult], console: Console) -> PeerResult:
    """``run()``'s figures, or why it could not run here (the exception's line), the other peers going on."""
    console.print(f"{name}: ...")
    try:
        return run()
    except Exception as e:  # noqa: BLE001 - one peer's failure is a row of the table, not the end of the run
        console.print(f"{name} failed: {type(e).__name__}: {e}")
        return f"cannot run here: {type(e).__name__}: {e}"


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description="edl failure recovery per case vs torchrun, torchft and DLRover")
    p.add_argument("--framework", choices=("paddle", "torch"), default="paddle",
                   help="the trainers' framework: edl.zoo.mlp or edl.zoo.torch.mlp (default paddle)")
    p.add_argument("--model", choices=("mlp", "transformer"), default="mlp",
                   help="the zoo's mlp, or its 23 M-parameter transformer on generated tokens (batch 16; no "
                        "peer comparison: their scripts train the mlp); default mlp")
    p.add_argument("--sizes", type=int, nargs="+", default=[2, 3, 4],
                   help="group sizes, torchft's replica group counts too (default 2 3 4)")
    p.add_argument("--batch-size", type=int, default=64, help="records per trainer per step (default 64)")
    p.add_argument("--rounds", type=int, default=3,
                   help="graceful changes and torchrun / DLRover kills (default 3)")
    p.add_argument("--graceful-largest", type=int, default=4,
                   help="graceful changes scale 1 -> ... -> this and back (default 4)")
    p.add_argument("--skip-faults", action="store_true", help="only the graceful changes (and the peers)")
    p.add_argument("--peers", nargs="*", choices=PEERS, default=list(PEERS),
                   help="the peers to run (default all; torchft and DLRover with --framework torch only)")
    p.add_argument("--only-peers", action="store_true", help="no edl jobs: only the peers")
    p.add_argument("--peer-hang-window", type=float, default=60,
                   help="seconds DLRover's job is watched with a worker stopped (SIGSTOP); 0: no such case")
    p.add_argument("--keep", action="store_true", help="keep the jobs' directories (logs) for a look afterwards")
    return p.parse_args()


PEERS = ("torchrun", "torchft", "dlrover")


def run_peers(a: argparse.Namespace, tmp: Path, data: Path, console: Console) -> dict[str, PeerResult]:
    """The peers' figures on the same MLP, batch and data (their scripts train the mlp only)."""
    out: dict[str, PeerResult] = {}
    if a.model != "mlp" or importlib.util.find_spec("torch") is None:
        return {name: "not installed" if a.model == "mlp" else "not run: the peers train the mlp" for name in a.peers}
    if "torchrun" in a.peers:
        out["torchrun"] = peer("torchrun: SIGKILL of one worker", lambda: torchrun_recovery(tmp, data, a.batch_size, a.rounds), console)
    if a.framework != "torch":
        return out
    if "torchft" in a.peers:
        out["torchft"] = peer("torchft: SIGKILL, SIGSTOP of one replica group, a group joining",
                              lambda: torchft_recovery(tmp, data, a.batch_size, a.sizes, console), console)
    if "dlrover" in a.peers:
        out["dlrover"] = peer("DLRover: SIGKILL of one worker, then SIGSTOP",
                              lambda: dlrover_recovery(tmp, data, a.batch_size, a.rounds, a.peer_hang_window), console)
    return out


def edl_summary(a: argparse.Namespace, cases: list[dict], graceful: dict, graceful_stop: dict) -> dict:
    kills = [c for c in cases if c["fault"] == "sigkill"]
    stops = [c for c in cases if c["fault"] == "sigstop"]
    return {
        "cases": cases, "graceful": graceful, "graceful_stop": graceful_stop,
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
    }


def print_edl(a: argparse.Namespace, result: dict, torch_cell: str, console: Console) -> None:
    cases, graceful = result["cases"], result["graceful"]
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
    console.print(f"worst: {result['worst']}; graceful, median of {a.rounds}: {result['median']}")


def _s(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def print_peers(peers: dict[str, PeerResult], console: Console) -> None:
    """One row per peer case; a peer without figures says why in one row."""
    t = Table(title="peers, one row per case (seconds): fault → the survivors' (restart-all: the restarted "
                    "workers') next step; longest gap between a survivor's steps; (re)started or woken → its first step")
    for col in ("peer", "case", "n", "fault → next step", "longest gap", "rejoin: longest gap",
                "(re)start/wake → first step", "of it: manager up → first step", "uncommitted", "rolled back", "step"):
        t.add_column(col, justify="right")
    for name, res in peers.items():
        if isinstance(res, str):
            t.add_row(name, res, *["-"] * 9)
        elif name == "torchft":
            for c in res["cases"]:
                t.add_row(name, f"{c['fault']} replica {c['replica']}" + (f" ({c['woken']})" if "woken" in c else ""),
                          str(c["group_size"]), _s(c.get("fault_to_next_step_s")), _s(c["longest_gap_s"]),
                          _s(c.get("rejoin_longest_gap_s")), _s(c.get("woken_to_first_step_s", c.get("start_to_first_step_s"))),
                          _s(c.get("manager_to_first_step_s")), str(c.get("uncommitted_steps", "-")),
                          str(c.get("rolled_back_steps", "-")), f"{c['step_s']:.3f}")
        else:
            for kill_s, redone in zip(res["kill_to_next_step_s"], res["redone_steps"]):
                t.add_row(name, "sigkill worker 1 (restart-all)", "2", _s(kill_s), *["-"] * 5, str(redone), "-")
            if "sigstop" in res:
                h = res["sigstop"]
                t.add_row(name, f"sigstop worker 1: {h['steps_completed_in_window']} steps in {h['window_s']:.0f} s",
                          "2", _s(h["next_step_after_s"]), *["-"] * 7)
    console.print(t)


def main() -> int:
    a = parse()
    console = Console(width=150)
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
        edl: dict | None = None
        if not a.only_peers:
            cases: list[dict] = []
            if not a.skip_faults:
                console.print("edl: SIGKILL of every rank, SIGSTOP of the first and the last ...")
                cases = edl_cases(tmp, data, a.batch_size, a.sizes, console)
            console.print(f"edl: graceful scale-up 1 -> {a.graceful_largest} and drain back to 1, prepared ...")
            graceful = graceful_pauses(tmp, data, a.batch_size, a.rounds, a.graceful_largest)
            console.print("edl: the same, stopping at a step boundary (EDL_PREPARED_CHANGES=0) ...")
            graceful_stop = graceful_pauses(tmp, data, a.batch_size, a.rounds, a.graceful_largest, prepared=False)
            edl = edl_summary(a, cases, graceful, graceful_stop)
        peers = run_peers(a, tmp, data, console)
    tr = peers.get("torchrun")
    torch_s = statistics.median_high(tr["kill_to_next_step_s"]) if isinstance(tr, dict) else None
    result = {
        "framework": a.framework, "model": MODEL, "batch_per_trainer": a.batch_size, "sizes": a.sizes,
        "command": "python bench/recovery.py " + " ".join(sys.argv[1:]),
        **(edl or {}),
        "torchrun": tr if tr is not None else "not run",
        "torchrun_kill_to_next_step_s": torch_s,
        "peers": peers,
    }
    name = "recovery_peers" if a.only_peers else "recovery_graceful" if a.skip_faults else "recovery"  # keeps the faults' figures
    name += ("" if a.framework == "paddle" else "_torch") + ("" if a.model == "mlp" else "_transformer")
    path = write_result(name, result)
    if edl is not None:
        print_edl(a, result, tr if isinstance(tr, str) else _s(torch_s) if tr else "not run", console)
    print_peers(peers, console)
    console.print(f"written to {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
