"""Real multi-process jobs on this machine: scale-up, drain, SIGKILL, master restart, total restart.

Each job runs the real master, real PaddlePaddle or PyTorch trainers with Gloo all-reduce,
and checkpoints to a local directory, with ``--audit`` counting every record id
that enters the final model.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import httpx
import pytest

from tests.conftest import run_edl
from tests.waits import wait_for

pytestmark = pytest.mark.timeout(240)


def job_args(digits, tmp_path, *, epochs=40, trainers=2, min_t=1, max_t=4, interval=1.0, extra=(),
             model="edl.zoo.digits"):
    return [
        "--model-def", model, "--data", str(digits), "--epochs", str(epochs), "--batch-size", "16",
        "--learning-rate", "0.003", "--min-trainers", str(min_t), "--max-trainers", str(max_t),
        "--trainers", str(trainers), "--checkpoint-uri", str(tmp_path / "ckpt"),
        "--checkpoint-interval", str(interval), "--audit", "--summary-out", str(tmp_path / "summary.json"), *extra,
    ]


def slow_model_def(tmp_path, module: str, step_floor_s: float) -> str:
    """A model definition file: the zoo's ``module`` whose every batch takes at least ``step_floor_s`` to
    collate, a floor under a job's length whatever the machine's speed (jobs that must outlast a trainer's
    or a spare master's start), until ``full_speed`` lifts it once what the test watches has happened."""
    path = tmp_path / f"slow_{module.replace('.', '_')}.py"
    _floor(str(path)).touch()
    path.write_text(f"""import os
import time

from {module} import loss, model, optimizer
from {module} import collate as _collate


def collate(table):
    if os.path.exists({str(_floor(str(path)))!r}):
        time.sleep({step_floor_s})
    return _collate(table)
""")
    return str(path)


def _floor(model_def: str) -> Path:
    return Path(model_def).with_suffix(".floor")


def full_speed(model_def: str) -> None:
    """The job of ``slow_model_def``'s file trains on at its own speed (the rest is its end, still audited)."""
    _floor(model_def).unlink()


def summary(tmp_path) -> dict:
    return json.loads((tmp_path / "summary.json").read_text())


def assert_exactly_once(s: dict, epochs: int) -> None:
    assert s["status"] == "succeeded", s["error"]
    assert s["epochs_completed"] == epochs
    assert s["lost_samples"] == 0
    assert s["duplicate_samples"] == 0
    assert s["audited_samples_per_epoch"] == [1438] * epochs
    assert s["samples_per_epoch"] == [1438] * epochs


def test_scale_up_then_drain_keeps_exactly_once(digits, tmp_path, job_runner, framework_digits):
    # 30 epochs of 90 steps at one trainer, each step at least 20 ms: at least 54 s before the joiners must
    # have joined, whatever the machine's speed (without the floor, PyTorch's joiners under the whole suite
    # joined at epoch 33 of 40, with too few steps left to see the job at three trainers).
    epochs = 30
    model = slow_model_def(tmp_path, framework_digits, 0.02)
    job = job_runner("grow", job_args(digits, tmp_path, epochs=epochs, trainers=1, model=model)).start()
    job.wait_for(lambda s: s["step"] > 100 and s["world_size"] == 1, what="training with one trainer")
    info = job.info()
    headers = {"Authorization": f"Bearer {info['token']}"}
    # A request without (or with a wrong) token is refused and changes nothing.
    r = httpx.post(f"http://{info['address']}/v1/scale", json={"trainers": 3})
    assert r.status_code == 401
    r = httpx.post(f"http://{info['address']}/v1/scale", json={"trainers": 3},
                   headers={"Authorization": "Bearer wrong"})
    assert r.status_code == 401
    assert job.status()["desired_trainers"] == 1
    # Outside min..max is refused with a clear message.
    r = httpx.post(f"http://{info['address']}/v1/scale", json={"trainers": 9}, headers=headers)
    assert r.status_code == 400 and "outside" in r.json()["detail"]
    r = httpx.post(f"http://{info['address']}/v1/scale", json={"trainers": 3}, headers=headers)
    assert r.status_code == 200
    grown = job.wait_for(lambda s: s["world_size"] == 3 and s["phase"] == "running", what="world size 3")
    survivors = {t["id"] for t in grown["trainers"]}
    before = grown["step"]
    job.wait_for(lambda s: s["step"] > before + 50, what="progress at 3 trainers")
    httpx.post(f"http://{info['address']}/v1/scale", json={"trainers": 1}, headers=headers)
    shrunk = job.wait_for(lambda s: s["world_size"] == 1 and s["phase"] == "running", what="world size 1")
    assert {t["id"] for t in shrunk["trainers"] if t["state"] == "active"} <= survivors
    full_speed(model)
    assert job.wait() == 0, job.output()
    s = summary(tmp_path)
    assert_exactly_once(s, epochs)
    reasons = [g["reason"] for g in s["generations"]]
    assert "scale_up" in reasons and "scale_down" in reasons
    assert all(g["rolled_back_steps"] == 0 for g in s["generations"])
    # Every graceful change was prepared while the job trained and switched into, without a stop, and every
    # trainer ended cleanly (a drained one whose group for a dropped preparation was still forming aborted
    # at exit once).
    assert all(g["prepared_s"] is not None for g in s["generations"] if g["reason"] in ("scale_up", "scale_down"))
    assert s["trainer_failures"] == 0, s
    assert s["metrics"]["accuracy"] >= 0.9
    metrics = httpx.get(f"http://{info['address']}/metrics").text if job.status() else ""
    del metrics  # the master is gone once the job ended; /metrics is checked in the master API test


def test_sigkill_of_a_trainer_keeps_exactly_once(digits, tmp_path, job_runner, framework_digits):
    # 8 epochs of 30 steps at three trainers: the kill lands in the third; what follows it is a drop
    # and a regrouping, not epochs.
    epochs = 8
    job = job_runner("kill", job_args(digits, tmp_path, epochs=epochs, trainers=3, model=framework_digits)).start()
    st = job.wait_for(lambda s: s["world_size"] == 3 and s["step"] > 60, what="three trainers training")
    victim = next(t for t in st["trainers"] if t["rank"] == 1)
    os.kill(victim["pid"], signal.SIGKILL)
    job.wait_for(lambda s: victim["id"] not in {t["id"] for t in s["trainers"] if t["state"] == "active"},
                 what="the killed trainer to be dropped")
    assert job.wait() == 0, job.output()
    s = summary(tmp_path)
    assert_exactly_once(s, epochs)
    failures = [g for g in s["generations"] if g["reason"] == "failure"]
    assert failures, s["generations"]
    # Survivors kept their state: at most the failed step is redone, nothing is rolled back.
    assert all(g["rolled_back_steps"] <= 1 for g in failures)


def test_trainers_told_to_stop_leave_as_drained_ones_do(digits, tmp_path, job_runner, framework_digits):
    # SIGTERM, as Kubernetes sends a preempted or deleted pod's trainer, to rank 0 and rank 1 of three at
    # once: they ask the master to drain them and leave at the switch (exit 0), so the next generation is a
    # prepared scale-down, nothing rolled back, no failure counted; the launcher then fills their places.
    epochs = 8
    job = job_runner("term", job_args(digits, tmp_path, epochs=epochs, trainers=3, model=framework_digits)).start()
    st = job.wait_for(lambda s: s["world_size"] == 3 and s["step"] > 60, what="three trainers training")
    victims = [t for t in st["trainers"] if t["rank"] in (0, 1)]
    for v in victims:
        os.kill(v["pid"], signal.SIGTERM)
    gone = {v["id"] for v in victims}
    job.wait_for(lambda s: not gone & {t["id"] for t in s["trainers"] if t["state"] in ("active", "draining")},
                 what="the trainers told to stop to leave")
    assert job.wait() == 0, job.output()
    s = summary(tmp_path)
    assert_exactly_once(s, epochs)
    assert [g["reason"] for g in s["generations"]].count("failure") == 0, s["generations"]
    downs = [g for g in s["generations"] if g["reason"] == "scale_down"]  # one, or two if the signals straddled a go
    assert downs and downs[-1]["world_size"] == 1, s["generations"]
    assert all(g["prepared_s"] is not None and g["rolled_back_steps"] == 0 for g in downs), downs
    assert s["trainer_failures"] == 0, s


def test_the_only_trainer_told_to_stop_leaves_once_its_replacement_joined(digits, tmp_path, job_runner):
    # At the job's minimum (1), a trainer told to stop cannot be drained: nobody would hold the model. It
    # trains on while the launcher starts its replacement at once, which joins (a prepared scale-up); then
    # it is drained (a prepared scale-down) and exits 0. Before, the job stopped for the trainer's 15 s
    # limit and restarted from the checkpoint.
    epochs = 8  # a floor under each step: the job outlasts the replacement's start on a loaded machine
    model = slow_model_def(tmp_path, "edl.zoo.digits", 0.02)
    job = job_runner("only", job_args(digits, tmp_path, epochs=epochs, trainers=1, model=model)).start()
    st = job.wait_for(lambda s: s["world_size"] == 1 and s["step"] > 60, what="one trainer training")
    victim = st["trainers"][0]
    os.kill(victim["pid"], signal.SIGTERM)
    job.wait_for(lambda s: victim["id"] not in {t["id"] for t in s["trainers"] if t["state"] in ("active", "draining")},
                 timeout=60, what="the trainer told to stop to leave")
    full_speed(model)
    assert job.wait() == 0, job.output()
    s = summary(tmp_path)
    assert_exactly_once(s, epochs)
    reasons = [g["reason"] for g in s["generations"]]
    assert "failure" not in reasons and reasons[reasons.index("scale_up"):][:2] == ["scale_up", "scale_down"], reasons
    assert all(g["rolled_back_steps"] == 0 for g in s["generations"]), s["generations"]
    assert s["trainer_failures"] == 0, s


def test_master_killed_and_restarted_resumes(digits, tmp_path, job_runner, framework_digits):
    epochs = 20  # the restart lands within the first few; the rest only has to finish exactly once
    model = slow_model_def(tmp_path, framework_digits, 0.02)
    job = job_runner("mkill", job_args(digits, tmp_path, epochs=epochs, trainers=2, interval=0.5, model=model)).start()
    job.wait_for(lambda s: len(s["checkpoints"]) >= 2 and s["world_size"] == 2, what="two checkpoints")
    for n in (3, 2):  # prepared changes (generations 2 and 3) before the restart
        r = run_edl("scale", "mkill", "--trainers", str(n), env={"EDL_HOME": str(job.home)})
        assert r.returncode == 0, r.stderr
        st = job.wait_for(lambda s: s["world_size"] == n and s["generations"][-1]["pause_s"] is not None,
                          timeout=60, what=f"{n} trainers")
    old_uid = st["master_uid"]
    os.kill(job.info()["master_pid"], signal.SIGKILL)
    job.wait_for(lambda s: s["master_uid"] != old_uid and s["world_size"] >= 2, what="a new master with trainers")
    # A graceful change under the new master is prepared as under the first (its generations are numbered
    # from 1 again: the trainers once ignored them, and the change waited for the master to give up, 15 s).
    r = run_edl("scale", "mkill", "--trainers", "1", env={"EDL_HOME": str(job.home)})
    assert r.returncode == 0, r.stderr
    st = job.wait_for(lambda s: s["world_size"] == 1 and s["generations"][-1]["pause_s"] is not None,
                      what="the scale-down under the new master")
    assert st["generations"][-1]["reason"] == "scale_down" and st["generations"][-1]["prepared_s"] is not None, st
    full_speed(model)
    assert job.wait() == 0, job.output()
    s = summary(tmp_path)
    assert_exactly_once(s, epochs)
    assert s["master_restarts"] == 1
    assert any(g["reason"] == "resume" for g in s["generations"])
    assert s["resumed_from"] and "ckpt-" in s["resumed_from"]


@pytest.mark.parametrize(("checkpointed", "model"), [(True, "edl.zoo.digits"), (False, "edl.zoo.digits"),
                                                      (False, "edl.zoo.torch.digits")],
                         ids=["checkpoint-far-behind", "no-checkpoint", "no-checkpoint-torch"])
def test_master_killed_goes_on_from_the_trainers_step(digits, tmp_path, job_runner, checkpointed, model):
    """The trainers know every cursor since the checkpoint: the new master rebuilds the queue from the
    checkpoint (or the start) plus their reports, and the job goes on from their step, not the checkpoint's."""
    # The job outlasts the spare master's start (5 s after the master's, then its imports): 540 steps of
    # 30 ms or more, 16 s or more whatever the machine (Paddle's digits trained 900 steps in 3 s on one).
    epochs = 12
    model = slow_model_def(tmp_path, model, 0.03)
    job = job_runner("mgo", job_args(digits, tmp_path, epochs=epochs, trainers=2, interval=1e9, model=model)).start()
    st = job.wait_for(lambda s: s["world_size"] == 2 and s["step"] > 30, what="two trainers training")
    info = job.info()
    if checkpointed:
        httpx.post(f"http://{info['address']}/v1/checkpoints/request",
                   headers={"Authorization": f"Bearer {info['token']}"}).raise_for_status()
        st = job.wait_for(lambda s: len(s["checkpoints"]) == 1, what="the requested checkpoint")
    ckpt_step = st["checkpoints"][0]["step"] if checkpointed else 0
    st = job.wait_for(lambda s: s["step"] > ckpt_step + 150, what="training far past the checkpoint")
    master_log = job.home / "jobs" / "mgo" / "logs" / "master.log"
    # The spare master starts some seconds after the master: a fast machine gets this far sooner.
    wait_for(lambda: "standby master for job mgo: ready" in master_log.read_text(), 60, "the spare master ready")
    st = job.wait_for(lambda s: s["world_size"] == 2, what="the job's state before the kill")
    before = st["step"]
    os.kill(info["master_pid"], signal.SIGKILL)
    job.wait_for(lambda s: s["master_uid"] != st["master_uid"] and s["world_size"] == 2 and s["phase"] == "running",
                 what="a new master with both trainers")
    full_speed(model)
    assert job.wait() == 0, job.output()
    s = summary(tmp_path)
    assert_exactly_once(s, epochs)
    assert s["master_restarts"] == 1
    resumed = [g for g in s["generations"] if g["reason"] == "resume"]
    assert len(resumed) == 1, s["generations"]
    assert resumed[0]["rolled_back_steps"] == 0
    assert resumed[0]["base_step"] >= before - 1 > ckpt_step + 100  # no step rolled back to the checkpoint
    master_log = master_log.read_text()
    assert "restarted master: going on from the trainers' step" in master_log
    # The new master was the launcher's spare, woken (its imports done before the kill).
    assert "since the standby was woken" in master_log


def test_master_and_a_trainer_killed_together_fall_back_to_the_checkpoint(digits, tmp_path, job_runner):
    """Without every member's report the rows consumed since the checkpoint are not known: the new master
    goes back to the checkpoint (exactly-once still holds) and says how many steps that cost."""
    # 20 epochs (900 steps) of at least 20 ms each: the kill comes 100 steps past a checkpoint near the start,
    # long before the end, whatever the machine's speed (without the floor an idle machine made 300 steps a
    # second: the requested checkpoint came at step 638 and the job had ended by the kill).
    epochs = 20
    model = slow_model_def(tmp_path, "edl.zoo.digits", 0.02)
    job = job_runner("mboth", job_args(digits, tmp_path, epochs=epochs, trainers=2, interval=1e9, model=model)).start()
    job.wait_for(lambda s: s["world_size"] == 2 and s["step"] > 30, what="two trainers training")
    info = job.info()
    httpx.post(f"http://{info['address']}/v1/checkpoints/request",
               headers={"Authorization": f"Bearer {info['token']}"}).raise_for_status()
    st = job.wait_for(lambda s: len(s["checkpoints"]) == 1, what="the requested checkpoint")
    ckpt_step = st["checkpoints"][0]["step"]
    st = job.wait_for(lambda s: s["step"] > ckpt_step + 100, what="training far past the checkpoint")
    victim = next(t for t in st["trainers"] if t["rank"] == 1)
    os.kill(info["master_pid"], signal.SIGKILL)
    os.kill(victim["pid"], signal.SIGKILL)
    assert job.wait() == 0, job.output()
    s = summary(tmp_path)
    assert_exactly_once(s, epochs)
    resumed = [g for g in s["generations"] if g["reason"] == "resume"]
    assert len(resumed) == 1 and resumed[0]["base_step"] == ckpt_step, s["generations"]
    assert resumed[0]["rolled_back_steps"] >= 100
    master_log = (job.home / "jobs" / "mboth" / "logs" / "master.log").read_text()
    assert f"restarted master: back to the checkpoint at step {ckpt_step}" in master_log


def test_everything_killed_then_the_same_command_resumes(digits, tmp_path, job_runner):
    # 12 epochs: killed past the third, the second run has nine left (it trained 37 of 40 before,
    # which outlasted its 180 s on a loaded machine); what is checked is where it resumes from.
    epochs = 12
    args = job_args(digits, tmp_path, epochs=epochs, trainers=2, interval=0.5)
    first = job_runner("total", args).start()
    first.wait_for(lambda s: len(s["checkpoints"]) >= 2 and s["epochs_completed"] >= 3, what="some checkpoints")
    first.kill()
    second = job_runner("total", args).start()
    assert second.wait() == 0, second.output()
    s = summary(tmp_path)
    assert_exactly_once(s, epochs)
    assert s["resumed_from"] and "ckpt-" in s["resumed_from"]
    assert "resuming from checkpoint" in second.output()


def test_a_killed_launchers_job_is_adopted_by_the_same_command(digits, tmp_path, job_runner):
    """``edl train`` SIGKILLed alone (as a workflow engine's retried step finds it) leaves its master and
    trainers training; the same command run again adopts them: no master restart, no resume from a
    checkpoint. The adopted trainers' exits are still told apart: one drained leaves (exit 0, no failure),
    one SIGKILLed is a failure and is replaced; the job ends exactly once."""
    epochs = 30
    args = job_args(digits, tmp_path, epochs=epochs, trainers=2)
    first = job_runner("adopt", args).start()
    first.wait_for(lambda s: s["step"] > 50 and s["world_size"] == 2, what="two trainers training")
    before = first.info()
    os.kill(first.proc.pid, signal.SIGKILL)
    first.proc.wait()
    step = first.status()["step"]
    wait_for(lambda: (first.status() or {"step": 0})["step"] > step + 20, 60,
             "the job training on without its launcher")
    second = job_runner("adopt", args).start()
    wait_for(lambda: second.info()["launcher_pid"] == second.proc.pid, 60, "the new launcher to take the job")
    after = second.info()
    assert after["master_pid"] == before["master_pid"] and after["trainers"] == before["trainers"], (before, after)
    headers = {"Authorization": f"Bearer {after['token']}"}
    assert httpx.post(f"http://{after['address']}/v1/scale", json={"trainers": 1}, headers=headers).status_code == 200
    st = second.wait_for(lambda s: s["world_size"] == 1 and len(s["trainers"]) == 1, what="one adopted trainer drained")
    # (From the status: the job's file may still list the drained one for the moment its process takes to end.)
    (survivor,) = [t["pid"] for t in st["trainers"]]
    assert survivor in before["trainers"].values()
    os.kill(survivor, signal.SIGKILL)
    assert second.wait() == 0, second.output()
    s = summary(tmp_path)
    assert_exactly_once(s, epochs)
    assert "adopted its running master and 2 trainer(s)" in second.output()
    assert s["master_restarts"] == 0 and not s["resumed_from"], s
    assert not [g for g in s["generations"] if g["reason"] == "resume"], s["generations"]
    assert s["trainer_failures"] == 1, s  # the killed one; the drained one left
    assert "started adopt-t3" in second.output()  # in the killed one's place, numbered after the adopted ones
