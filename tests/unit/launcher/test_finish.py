"""``Launcher.finish``: the one ending of the local and the Kubernetes launchers."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from rich.console import Console

from edl.api.cluster import PodPhase, TrainerPod
from edl.api.spec import JobSpec
from edl.errors import PermanentError, UserError
from edl.launcher.core import Launcher
from tests.clock import FakeClock

SPEC = JobSpec(job="j", model_def="m", data="d", epochs=1, batch_size=1, min_trainers=1, max_trainers=4,
               trainers=1, checkpoint_uri="c")
SUCCEEDED = {"job": "j", "status": "succeeded", "error": None, "epochs_completed": 1, "steps": 12,
             "throughput_samples_per_s": 50.0, "final_model_uri": "file:///c/model", "metrics": {"accuracy": 0.9},
             "lost_samples": None, "duplicate_samples": None}




class Cluster:
    def __init__(self, clock: FakeClock, exits_at: float) -> None:
        self.clock, self.exits_at = clock, exits_at

    def trainers(self) -> list[TrainerPod]:
        phase = PodPhase.SUCCEEDED if self.clock.t >= self.exits_at else PodPhase.RUNNING
        return [TrainerPod("j-t1", phase, 0.0)]


class Master:
    def __init__(self, summary: dict | None) -> None:
        self._summary = summary

    def summary(self) -> dict | None:
        return None if self._summary is None else dict(self._summary)

    def launcher_beat(self, budgets=None) -> None:
        pass


def launcher(summary: dict | None, exits_at: float = 0.0) -> tuple[Launcher, FakeClock]:
    clock = FakeClock()
    la = Launcher(SPEC, Cluster(clock, exits_at), console=Console(quiet=True), clock=clock, sleep=clock.sleep)
    la.master = Master(summary)
    la.relaunches, la.unschedulable = 2, 3
    la.trainer_budget = replace(la.trainer_budget, total=1)  # failures over the job's life
    la.master_budget = replace(la.master_budget, total=4)
    return la, clock


def test_a_succeeded_job_s_summary_gets_the_launcher_s_counters_and_is_written(tmp_path):
    la, clock = launcher(SUCCEEDED, exits_at=5.0)
    out = tmp_path / "summary.json"
    result = la.finish(out, extend=lambda s: s.update(lost_samples=0, duplicate_samples=0))
    assert clock.t >= 5.0  # waited for the trainer to exit first
    written = json.loads(out.read_text())
    assert written == result.summary
    assert written["trainer_failures"] == 1 and written["trainer_relaunches"] == 2
    assert written["unschedulable_trainers"] == 3 and written["master_restarts"] == 4
    assert (result.epochs_completed, result.steps, result.final_model_uri) == (1, 12, "file:///c/model")
    assert result.metrics == {"accuracy": 0.9} and result.throughput_samples_per_s == 50.0
    assert (result.lost_samples, result.duplicate_samples) == (0, 0)


def test_a_failed_job_is_written_then_raised(tmp_path):
    la, _ = launcher({**SUCCEEDED, "status": "failed", "error": "loss is nan at step 3"})
    out = tmp_path / "summary.json"
    with pytest.raises(PermanentError, match="job j failed: loss is nan at step 3"):
        la.finish(out)
    assert json.loads(out.read_text())["status"] == "failed"


def test_a_job_failed_by_the_user_s_input_raises_its_one_line_as_a_user_error(tmp_path):
    error = "--model-def m.py: loss() raised KeyError: 'y' (trainers j-t1 and j-t2, at step 3; ...)"
    la, _ = launcher({**SUCCEEDED, "status": "failed", "error": error, "user_error": True})
    with pytest.raises(UserError) as e:
        la.finish(tmp_path / "summary.json")
    assert str(e.value) == error and e.value.exit_code == 2
    assert json.loads((tmp_path / "summary.json").read_text())["user_error"] is True


def test_a_lost_master_ends_as_a_failed_job():
    la, _ = launcher(None)
    with pytest.raises(PermanentError, match="job j failed: master lost"):
        la.finish()
    la.master = None  # never started
    with pytest.raises(PermanentError, match="master lost"):
        la.finish()


def test_trainers_that_do_not_exit_are_waited_for_a_bounded_time():
    la, clock = launcher(SUCCEEDED, exits_at=1e9)
    la.finish()
    assert 120.0 <= clock.t < 121.0
