"""The PyTorch contract: ``edl.zoo.torch.mlp`` on 40000 synthetic rows, rank 0 of 3 SIGKILLed three times.

Rank 0 hosts its generation's store and sends the state to joiners, so its loss is the hardest
single fault. The job must succeed with every record trained on exactly once; each kill keeps
the two survivors, who go on from their own state with at most the failed step redone, and the
launcher's replacement joins through a prepared change. The pauses are the summary's (the
``bench/recovery.py`` figures hold them to a second; a test does not time the machine).
"""

from __future__ import annotations

import json
import signal

import pytest

from tests.integration.launcher.test_trainer_faults import fault, settled

pytestmark = pytest.mark.timeout(420)

ROWS, EPOCHS = 40000, 3


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    from edl.data.prepare import prepare_synthetic

    out = tmp_path_factory.mktemp("synthetic")
    prepare_synthetic(str(out), ROWS, 256, 10)
    return out


def test_three_kills_of_rank_0_of_3_cost_no_survivor_and_no_record(synthetic, tmp_path, job_runner):
    job = job_runner("rank0", [
        "--model-def", "edl.zoo.torch.mlp", "--data", str(synthetic / "train"), "--epochs", str(EPOCHS),
        "--batch-size", "64", "--trainers", "3", "--min-trainers", "1", "--max-trainers", "3",
        "--checkpoint-uri", str(tmp_path / "ckpt"), "--checkpoint-interval", "5", "--audit",
        "--summary-out", str(tmp_path / "summary.json"), "--max-trainer-failures", "5",
    ]).start()
    st = job.wait_for(settled(3, 10), what="three trainers training", timeout=120)
    for kill in range(3):
        _, g, st = fault(job, st, 0, signal.SIGKILL)  # survivors kept, from their own state, <= 1 step redone
        assert g["world_size"] == 2, g
        st = job.wait_for(settled(3, st["step"] + 5), what=f"the replacement after kill {kill + 1}", timeout=120)
    assert job.wait(300) == 0, job.output()[-3000:]
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["status"] == "succeeded", s["error"]
    assert s["epochs_completed"] == EPOCHS
    assert s["lost_samples"] == 0 and s["duplicate_samples"] == 0
    train_rows = sum(s["samples_per_epoch"]) // EPOCHS
    assert s["audited_samples_per_epoch"] == [train_rows] * EPOCHS == s["samples_per_epoch"]
    failures = [g for g in s["generations"] if g["reason"] == "failure"]
    assert len(failures) == 3 and s["trainer_failures"] == 3, s["generations"]
    assert all(g["rolled_back_steps"] <= 1 and g["pause_s"] is not None for g in failures), failures
    print("failure pauses (s):", [round(g["pause_s"], 3) for g in failures])
