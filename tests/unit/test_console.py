"""Untrusted text (trainer messages, exception text, names, paths) comes out of every console path
verbatim and on one line: never read as rich markup or emoji codes, whatever console it goes to.

A Gloo error, ``[/paddle/third_party/gloo/gloo/transport/tcp/pair.cc:576] Read error ...``, once
raised rich's ``MarkupError`` inside ``edl train`` when a trainer died with it as its last line.
The consoles here are rich's default ones (markup and emoji on) on purpose: a caller's console
must not matter.
"""

from __future__ import annotations

import io
from dataclasses import replace
from pathlib import Path

import pytest
from rich.console import Console

from edl.api.cluster import MasterEndpoint, PodPhase, SizeCause, SizeReason, TrainerExit, TrainerPod
from edl.api.master import (BudgetView, GenerationSummary, JobStatus, JobView, Phase, Reason, Source, TrainerState,
                            TrainerView)
from edl.api.spec import JobSpec
from edl.cli import main
from edl.cli.local import show_status
from edl.cli.simulate import show_simulation
from edl.console import plain_console, say
from edl.errors import KubeUnavailableError, UserError
from edl.launcher.core import Launcher, ProgressView
from edl.pipeline import demo
from tests.clock import FakeClock

GLOO = ("[/paddle/third_party/gloo/gloo/transport/tcp/pair.cc:576] Read error [127.0.0.1]:41235: "
        "Connection reset by peer")
# Each would be markup (or an emoji code) to rich: a style, a bare close tag, a link, an escape.
UNTRUSTED = [GLOO, "[bold]not bold[/bold]", "a stray close [/] tag", "[link=x]a link[/link]", "[/]",
             "an emoji :smile: code", r"an escaped \[bold] tag", "[red"]


def console(width: int = 60) -> tuple[Console, io.StringIO]:
    """Rich's default console into a string, narrower than the messages (they must not be wrapped)."""
    out = io.StringIO()
    return Console(file=out, width=width), out


def assert_lines(out: str, *texts: str) -> None:
    for t in texts:
        assert any(t in line for line in out.splitlines()), f"{t!r} not on one line of:\n{out}"


@pytest.mark.parametrize("message", UNTRUSTED)
def test_say_prints_untrusted_text_verbatim_on_one_line(message):
    c, out = console(width=20)
    say(c, ("job", "bold"), f" {message} ", message * 3)
    assert out.getvalue() == f"job {message} {message * 3}\n"


def test_plain_console_reads_no_markup_from_strings_either():
    out = io.StringIO()
    plain_console(file=out, width=200).print(GLOO + " :smile:")
    assert out.getvalue() == GLOO + " :smile:\n"


SPEC = JobSpec(job="j", model_def="m", data="d", epochs=1, batch_size=1, min_trainers=1, max_trainers=4,
               trainers=2, checkpoint_uri="c")


def job_view(trainers: tuple[TrainerView, ...] = (), generations: tuple[GenerationSummary, ...] = (),
             job: str = "j", status: JobStatus = JobStatus.RUNNING) -> JobView:
    return JobView(job=job, status=status, error=None, master_uid="1", phase=Phase.RUNNING, generation=1,
                   world_size=2, desired_trainers=2, unschedulable_at=None, min_trainers=1, max_trainers=4,
                   epoch=0, epochs=1, epochs_completed=0, rows_per_epoch=10, done_rows=(5,), step=3, loss=None,
                   trainers=trainers, generations=generations, checkpoints=(), elapsed_s=1.0)


class DyingCluster:
    """Trainers that end with the untrusted messages (failed, preempted, user error), and an API
    that is away once with one of them as its error."""

    def __init__(self, exits: list[tuple[TrainerExit, str]]) -> None:
        self.exits = exits
        self.pods: dict[str, TrainerPod] = {}
        self.api_error: str | None = None

    def ensure_job(self) -> MasterEndpoint:
        return MasterEndpoint("m:1", "tok", False)

    def master_alive(self) -> bool:
        return True

    def trainers(self) -> list[TrainerPod]:
        if self.api_error is not None:
            error, self.api_error = self.api_error, None
            raise KubeUnavailableError(error)
        return list(self.pods.values())

    def create_trainer(self, name: str, node: str | None = None) -> None:
        exit, message = self.exits.pop(0) if self.exits else (None, "")
        phase = PodPhase.RUNNING if exit is None else PodPhase.FAILED
        self.pods[name] = TrainerPod(name, phase, 0.0, "node", exit, message)

    def delete_trainer(self, name: str) -> None:
        self.pods.pop(name, None)

    def delete_job(self) -> None:
        self.pods.clear()

    def record(self, reason: str, message: str, warning: bool = False) -> None:
        pass


class Master:
    def __init__(self) -> None:
        self.failed: list[str] = []

    def launcher_beat(self, budgets=None) -> None:
        pass

    def healthy(self) -> bool:
        return True

    def status(self) -> JobView:
        return job_view()

    def report_exit(self, name: str, code: int, preempted: bool = False) -> None:
        pass

    def fail_job(self, message: str, user: bool = False) -> None:
        self.failed.append(message)


def test_launcher_events_print_trainer_messages_and_api_errors_verbatim():
    exits = [(TrainerExit.FAILED, m) for m in UNTRUSTED] + [(TrainerExit.PREEMPTED, m) for m in UNTRUSTED]
    cluster = DyingCluster(exits + [(TrainerExit.USER_ERROR, GLOO)])
    master = Master()
    c, out = console()
    clock = FakeClock(0.0)
    la = Launcher(SPEC, cluster, console=c, clock=clock, sleep=clock.sleep, max_trainer_failures=100,
                  master_factory=lambda endpoint: master, trainer_prefix="j-t")
    la.start()
    cluster.api_error = "[bold]list pods[/]: connection refused"
    with pytest.raises(UserError) as e:
        la.run(poll_s=1.0)  # until the trainer that ends with a user error fails the job
    assert str(e.value) == GLOO and master.failed == [GLOO]
    printed = out.getvalue()
    assert_lines(printed, *(f"failed: {m}" for m in UNTRUSTED), *(f"preempted ({m}); replacing it" for m in UNTRUSTED),
                 "cluster API away ([bold]list pods[/]: connection refused); holding the plan")


def test_progress_lines_and_generation_lines_are_verbatim():
    gen = GenerationSummary(id=1, master_generation=1, world_size=2, members=("a", "b"), reason=Reason.START,
                            source=Source.INIT, base_step=0, pause_s=0.5, triggered_at=0.0, first_step_at=0.5,
                            rolled_back_steps=0)
    c, out = console()
    with ProgressView(c) as view:
        view.show(job_view(generations=(gen,)))
    assert_lines(out.getvalue(), "generation 1: 0 → 2 trainers (start), pause 0.50 s", "epoch 1/1:  50.0 %")


def test_status_table_shows_trainer_ids_and_the_job_name_verbatim():
    trainers = tuple(TrainerView(m, i, 100 + i, TrainerState.ACTIVE, 7) for i, m in enumerate(UNTRUSTED))
    c, out = console(width=250)
    show_status(c, job_view(trainers, job="[bold]job"))
    assert_lines(out.getvalue(), "[bold]job running · phase running", *UNTRUSTED)


def test_status_ends_with_the_reason_for_the_job_s_size():
    c, out = console(width=250)
    show_status(c, job_view())
    assert out.getvalue().splitlines()[-1].startswith("reason: none given yet (no autoscaler runs for this job")
    c, out = console(width=250)
    show_status(c, replace(job_view(), reason=SizeReason(SizeCause.HANDED_BACK, UNTRUSTED[1])))
    assert out.getvalue().splitlines()[-1] == f"reason: {UNTRUSTED[1]}"


def test_status_shows_the_launchers_failure_budgets_above_the_reason():
    c, out = console(width=250)
    show_status(c, replace(job_view(), budgets={"master_restarts": BudgetView(1, 10, 4, 3),
                                                "trainer_failures": BudgetView(0, 5, 2, 2)}))
    lines = out.getvalue().splitlines()
    assert lines[-3:-1] == ["master restarts: 1 of 10 without progress (4 in all, 3 forgiven)",
                            "trainer failures: 0 of 5 without progress (2 in all, 2 forgiven)"]
    assert lines[-1].startswith("reason: ")


def test_simulation_table_shows_the_scenario_name_verbatim():
    report = {"policy": "edl", "utilization": {"mean": 0.5, "bound_mean": 0.6, "offpeak_mean": None,
                                               "bound_offpeak_mean": None},
              "pending_s_mean": 1.0, "jct_s_mean": None, "fairness_jain": 1.0, "services": [], "rescale_events": 2}
    c, out = console(width=200)
    show_simulation(c, "[bold]peak[/] :smile:", 1, [report])
    assert_lines(out.getvalue(), "[bold]peak[/] :smile:: 1 run(s) per policy")


def test_demo_table_shows_job_reasons_and_paths_verbatim():
    summary = {"job": "[bold]demo", "status": "succeeded", "pipeline_wall_s": 30.0, "epochs_completed": 2,
               "generations": [{"id": 1, "world_size": 1, "reason": "start", "pause_s": None},
                               {"id": 2, "world_size": 2, "reason": "[/]", "pause_s": 0.25}],
               "evaluation": {"accuracy": 0.9}, "lost_samples": 0, "duplicate_samples": 0, "published": True}
    c, out = console(width=200)
    demo._table(c, summary, Path("/tmp/[link=x]out"))
    assert_lines(out.getvalue(), "edl demo: [bold]demo succeeded", "generation 2: 2 trainers ([/])",
                 "written: /tmp/[link=x]out/summary.json")
    assert "not grown back" not in out.getvalue()


def test_demo_table_says_why_the_job_did_not_grow_back():
    summary = {"job": "demo", "status": "succeeded", "pipeline_wall_s": 30.0, "epochs_completed": 2,
               "generations": [{"id": 1, "world_size": 2, "reason": "start", "pause_s": None},
                               {"id": 2, "world_size": 1, "reason": "scale_down", "pause_s": 0.2}],
               "size_reasons": [{"t": 12.0, "cause": "handed_back", "text": "handed 1 trainer(s) back"},
                                {"t": 25.0, "cause": "not_worth_pause", "text": "growth 1 -> 2 not worth its pause"}],
               "evaluation": {"accuracy": 0.9}, "lost_samples": 0, "duplicate_samples": 0, "published": True}
    c, out = console(width=200)
    demo._table(c, summary, Path("/tmp/out"))
    assert_lines(out.getvalue(), "why this size, from 12 s: handed back", "why this size, from 25 s: not worth pause",
                 "not grown back after the capacity returned")
    row = next(ln for ln in out.getvalue().splitlines() if "not grown back" in ln)
    assert "growth 1 -> 2 not worth its pause" in row


@pytest.mark.parametrize("job", ["[bold]x[/]", GLOO.replace(" ", "")])
def test_error_lines_name_untrusted_values_verbatim(job, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("EDL_HOME", str(tmp_path))
    assert main(["status", job]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"edl: error: no local job named {job!r}") and err.count("\n") == 1


def test_status_shows_what_began_the_last_change_and_where_its_time_went():
    gen = GenerationSummary(id=4, master_generation=4, world_size=1, members=("a",), reason=Reason.FAILURE,
                            source=Source.PEER, base_step=30, pause_s=1.2, triggered_at=10.0, first_step_at=11.2,
                            rolled_back_steps=0, stopped_at=10.1, formed_at=10.5, cause=f"{UNTRUSTED[0]} ended")
    c, out = console(width=250)
    show_status(c, job_view(generations=(gen,)))
    assert (f"last change: generation 4 (failure, 1 trainers): {UNTRUSTED[0]} ended; stopped +0.10 s, "
            "formed +0.50 s, first step +1.20 s") in out.getvalue().splitlines()
