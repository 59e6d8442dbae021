"""A restarted master whose predecessor may live on chooses its checkpoint only once that one has stopped."""

from __future__ import annotations

import pytest

from edl.api.spec import JobSpec
from edl.master import main


class Claim:
    """The run lock as ``run_master`` sees it; ``predecessor``: a master of this run that may live on."""

    def __init__(self, calls: list[str], predecessor: object | None) -> None:
        self.calls = calls
        self.predecessor = predecessor

    def held_by(self, holder_id: str) -> bool:
        return True  # a restart within the run

    def acquire(self, holder) -> bool:
        self.calls.append("lock")
        return True

    def keep_renewing(self, on_lost) -> None:
        self.calls.append("renewing")  # from the lock on: the fence's wait must not let it lapse

    def wait_fenced(self) -> None:
        self.calls.append("fenced")

    def release(self, handover: bool = False) -> None:
        self.calls.append("released")


class Checkpoints:
    """The prefix's committed checkpoints, as listed after the fence."""

    def __init__(self, names: list[str]) -> None:
        self.names = names

    def committed(self) -> list[str]:
        return self.names


@pytest.mark.parametrize("predecessor, newest, chosen", [
    (None, ["ckpt-1"], "s3://b/ckpt-1"),
    ("a lost node's master", ["ckpt-1"], "s3://b/ckpt-1"),  # nothing committed meanwhile: no second read
    ("a lost node's master", ["ckpt-2", "ckpt-3"], "s3://b/ckpt-3"),  # ckpt-1 pruned by its rank 0
])
def test_the_checkpoint_is_chosen_after_a_live_predecessor_is_fenced(monkeypatch, predecessor, newest, chosen):
    # Its rank 0 commits checkpoints and prunes older ones until the predecessor stops: a checkpoint
    # chosen before then was pruned away while the new trainers loaded it.
    calls: list[str] = []
    found = iter([({"queue": "read before the lock"}, "s3://b/ckpt-1"), ({"queue": "read after"}, "s3://b/ckpt-3")])
    served = {}
    claim = Claim(calls, predecessor)
    monkeypatch.setattr(main, "resolve_data", lambda spec: spec)
    monkeypatch.setattr(main, "open_checkpoints", lambda spec: (Checkpoints(newest), claim))
    monkeypatch.setattr(main, "restore", lambda ckpts: calls.append("restore") or next(found))
    monkeypatch.setattr(main, "check_data", lambda spec: pytest.fail("a restart needs no data check"))
    monkeypatch.setattr(main, "_serve_job", lambda *a: served.setdefault("restored", a[-1]) and 0)
    spec = JobSpec(job="j", model_def="edl.zoo.mlp", data="/nowhere", epochs=1, batch_size=8, min_trainers=1,
                   max_trainers=1, trainers=1, checkpoint_uri="s3://b")
    assert main.run_master(spec, "127.0.0.1", 0, "token") == 0
    expected = ["restore", "lock", "renewing"]  # read before the lock: a restart is back sooner
    if predecessor is not None:
        expected.append("fenced")
        if chosen != "s3://b/ckpt-1":
            expected.append("restore")
    assert calls == [*expected, "released"]
    assert served["restored"][1] == chosen
