"""The owner record and the run lock of a checkpoint prefix: the pure decisions, and both over a file store."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import replace

import pytest

from edl.api.spec import JobSpec
from edl.errors import UserError
from edl.storage.claim import (FENCE_S, LOCK_KEY, OWNER_KEY, RENEW_EVERY_S, Holder, LockRecord, PrefixClaim,
                               Verdict, fence_s, fingerprint, holder_dead, lock_verdict, owner_problem,
                               owner_record, pid_namespace, resume_fields)
from edl.storage.store import open_store
from tests.clock import FakeClock


def spec(job: str = "a", **kw) -> JobSpec:
    base = dict(job=job, model_def="edl.zoo.digits", data="/d", epochs=1, batch_size=16, min_trainers=1,
                max_trainers=2, trainers=1, checkpoint_uri="/c")
    return JobSpec(**{**base, **kw})


def test_fingerprint_covers_what_a_resume_depends_on_and_nothing_else():
    same = fingerprint(resume_fields(spec()))
    assert fingerprint(resume_fields(spec(max_trainers=4, trainers=2, checkpoint_interval_s=5.0,
                                          init_model="/m", eval_data="/e"))) == same
    for changed in (dict(epochs=3), dict(batch_size=32), dict(seed=1), dict(model_def="edl.zoo.mlp"),
                    dict(data="/other"), dict(learning_rate=0.1), dict(rows_per_task=7)):
        assert fingerprint(resume_fields(spec(**changed))) != same, changed


def test_owner_decision():
    record = owner_record(spec("a"))
    assert owner_problem(None, spec("b"), "U") is None
    assert owner_problem(record, spec("a", trainers=2), "U") is None
    other = owner_problem(record, spec("b"), "U")
    assert other is not None and "job 'a'" in other and "'b'" in other
    changed = owner_problem(record, spec("a", epochs=3), "U")
    assert changed is not None and "epochs 1 -> 3" in changed


def lock(holder_id: str) -> LockRecord:
    return LockRecord(Holder(holder_id, 1, "ns", "h"), "a", ttl_s=20.0)




def test_lock_decision():
    def verdict(current, me, dead=False, changed=False, unchanged_s=0.0):
        return lock_verdict(current, me, holder_dead=dead, changed=changed, unchanged_s=unchanged_s)

    assert verdict(None, "me") is Verdict.TAKE
    assert verdict(lock("me"), "me") is Verdict.TAKE  # a restarted master of this run
    assert verdict(lock("other"), "me") is Verdict.WATCH  # not yet known: read again
    assert verdict(lock("other"), "me", changed=True) is Verdict.REFUSE  # seen renewed: live
    assert verdict(lock("other"), None, changed=True) is Verdict.REFUSE  # a launcher asking
    assert verdict(lock("other"), "me", unchanged_s=19.9) is Verdict.WATCH
    assert verdict(lock("other"), "me", unchanged_s=20.0) is Verdict.TAKE  # seen unchanged for its TTL
    assert verdict(lock("other"), "me", dead=True) is Verdict.TAKE  # its process is gone


def test_staleness_is_judged_on_the_readers_clock_not_the_holders(tmp_path):
    """An old record format with an expiry in the holder's wall clock far in the future (a skewed
    clock) is still stale once seen unchanged for the TTL."""
    store = open_store(str(tmp_path / "ckpt"))
    skewed = b'{"holder": {"id": "x", "pid": 1, "pidns": "elsewhere", "host": "h"}, "job": "a", "expires_at": 1e12}'
    store.put_if(LOCK_KEY, skewed, None)
    clock = FakeClock(1000.0)
    PrefixClaim(store, spec(), clock=clock, sleep=clock.sleep).acquire(Holder.of_this_process("t"))
    assert 20.0 <= clock.slept <= 22.0


def test_a_second_job_on_a_prefix_is_refused_and_nothing_is_written(tmp_path):
    store = open_store(str(tmp_path / "ckpt"))
    first = PrefixClaim(store, spec("a"))
    first.check_owner()
    first.acquire(Holder.of_this_process("token-a"))
    first.release()
    before = sorted(store.list(""))
    assert before == [OWNER_KEY]
    with pytest.raises(UserError, match="belongs to job 'a'"):
        PrefixClaim(store, spec("b")).check_owner()
    with pytest.raises(UserError, match="epochs 1 -> 3"):
        PrefixClaim(store, spec("a", epochs=3)).check_owner()
    assert sorted(store.list("")) == before
    PrefixClaim(store, spec("a", trainers=2)).check_owner()  # the same job resumes


def test_one_live_run_and_its_restarts(tmp_path):
    store = open_store(str(tmp_path / "ckpt"))
    running = PrefixClaim(store, spec())
    assert running.acquire(Holder.of_this_process("token-1")) is False  # a first start, not a restart
    clock = FakeClock(1000.0, on_sleep=lambda: running.renew() if clock.t % 5 < 1 else None)  # renews every 5 s
    with pytest.raises(UserError, match=r"job 'a' is already running .*run [0-9a-f]{16} \(pid"):
        PrefixClaim(store, spec(), clock=clock, sleep=clock.sleep).acquire(Holder.of_this_process("token-2"))
    assert clock.slept <= 6.0  # refused as soon as it was seen renewed
    with pytest.raises(UserError, match="already running"):
        PrefixClaim(store, spec(), clock=clock, sleep=clock.sleep).check_not_running()
    assert b"token-1" not in store.get(LOCK_KEY)  # a hash of the token, never the token
    restarted = PrefixClaim(store, spec())
    assert restarted.acquire(Holder.of_this_process("token-1")) is True  # the same run: takes it at once
    assert not running.renew()  # the old master's version is gone
    assert restarted.renew()
    restarted.release()
    assert not store.exists(LOCK_KEY)
    PrefixClaim(store, spec()).check_not_running()


def test_a_stale_lock_is_taken_over(tmp_path):
    store = open_store(str(tmp_path / "ckpt"))
    abandoned = LockRecord(Holder("deadbeef", 1, "elsewhere", "h"), "a")
    store.put_if(LOCK_KEY, abandoned.to_bytes(), None)
    clock = FakeClock(1000.0)
    asking = PrefixClaim(store, spec(), clock=clock, sleep=clock.sleep)
    asking.check_not_running()  # not seen renewed: the launcher leaves it to the master
    assert clock.slept < 20.0
    claim = PrefixClaim(store, spec(), clock=clock, sleep=clock.sleep)
    claim.acquire(Holder.of_this_process("t"))
    assert LockRecord.from_bytes(store.get(LOCK_KEY)).holder.pid == os.getpid()


def test_a_lock_of_a_dead_process_on_this_machine_is_taken_over_before_it_expires(tmp_path):
    store = open_store(str(tmp_path / "ckpt"))
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = LockRecord(Holder("deadbeef", int(gone.stdout), pid_namespace(), "h"), "a")
    store.put_if(LOCK_KEY, dead.to_bytes(), None)
    clock = FakeClock(1000.0)
    PrefixClaim(store, spec(), clock=clock, sleep=clock.sleep).check_not_running()
    PrefixClaim(store, spec(), clock=clock, sleep=clock.sleep).acquire(Holder.of_this_process("t"))
    assert clock.slept == 0.0  # no waiting for the TTL


def test_file_conditional_writes(tmp_path):
    store = open_store(str(tmp_path))
    v1 = store.put_if("k", b"1", None)
    assert v1 and store.put_if("k", b"2", None) is None
    v2 = store.put_if("k", b"3", v1)
    assert v2 and store.put_if("k", b"4", v1) is None
    assert store.get_versioned("k") == (b"3", v2) and store.get_versioned("none") is None


def test_a_killed_but_unreaped_holder_counts_as_dead():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        holder = Holder("x", child.pid, pid_namespace(), "h")
        assert not holder_dead(holder)
        child.send_signal(signal.SIGKILL)
        deadline = time.monotonic() + 5
        while not holder_dead(holder) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert holder_dead(holder)  # a zombie until waited for
    finally:
        child.kill()
        child.wait()


def test_fence_decision():
    me = Holder("run", 10, "ns-b", "node-b", pod="pod-2")

    def held(holder: Holder, released: bool = False) -> LockRecord:
        return LockRecord(holder, "a", released=released)

    assert fence_s(None, me, holder_dead=False) == 0.0  # nobody held it
    assert fence_s(held(Holder("other", 1, "ns-a", "node-a")), me, holder_dead=False) == 0.0  # another run's, stale
    assert fence_s(held(Holder("run", 1, "ns-a", "node-a", pod="pod-1")), me, holder_dead=False) == FENCE_S  # may live
    assert fence_s(held(Holder("run", 1, "ns-a", "node-a", pod="pod-1")), me, holder_dead=True) == 0.0  # pid gone
    assert fence_s(held(Holder("run", 1, "ns-a", "node-a", pod="pod-1"), released=True), me,
                   holder_dead=False) == 0.0  # it handed the lock over as it stopped
    assert fence_s(held(Holder("run", 1, "ns-a", "node-b", pod="pod-2")), me, holder_dead=False) == 0.0  # in place
    assert fence_s(held(me), me, holder_dead=False) == 0.0  # this process again
    assert fence_s(held(Holder("run", 1, "ns-a", "node-a")), Holder("run", 10, "ns-b", "node-b"),
                   holder_dead=False) == FENCE_S


def test_a_stopped_master_hands_the_lock_to_its_successor_which_serves_without_a_fence(tmp_path):
    store = open_store(str(tmp_path / "ckpt"))
    stopping = PrefixClaim(store, spec())
    stopping.acquire(Holder("run", 1, "another-machine", "node-a", pod="pod-1"))
    clock = FakeClock(1000.0, on_sleep=lambda: stopping.release(handover=True) if clock.t >= 1000.5 else None)
    successor = PrefixClaim(store, spec(), clock=clock, sleep=clock.sleep)
    me = Holder("run", 2, "ns-b", "node-b", pod="pod-2")
    successor.await_handover(me, limit_s=FENCE_S)
    assert 0.5 <= clock.slept < 1.0  # until the predecessor's release, not the fence
    assert LockRecord.from_bytes(store.get(LOCK_KEY)).released
    assert successor.acquire(me) is True  # a restart within the run: its checkpoint, no data checks
    assert successor.predecessor is None
    successor.wait_fenced()
    assert clock.slept < 1.0
    successor.release()  # the job is over: nothing is left behind
    assert not store.exists(LOCK_KEY)


def test_a_released_lock_of_another_run_is_free(tmp_path):
    store = open_store(str(tmp_path / "ckpt"))
    store.put_if(LOCK_KEY, LockRecord(Holder("earlier", 1, "elsewhere", "h"), "a", released=True).to_bytes(), None)
    clock = FakeClock(1000.0)
    claim = PrefixClaim(store, spec(), clock=clock, sleep=clock.sleep)
    claim.check_not_running()
    assert claim.acquire(Holder.of_this_process("t")) is False  # not a restart of the earlier run
    assert clock.slept == 0.0


def test_a_successor_whose_predecessor_does_not_hand_over_takes_the_lock_and_fences_it(tmp_path):
    store = open_store(str(tmp_path / "ckpt"))
    PrefixClaim(store, spec()).acquire(Holder("run", 1, "another-machine", "node-a", pod="pod-1"))
    clock = FakeClock(1000.0)
    successor = PrefixClaim(store, spec(), clock=clock, sleep=clock.sleep)
    me = Holder("run", 2, "ns-b", "node-b", pod="pod-2")
    successor.await_handover(me, limit_s=2.0)
    assert 2.0 <= clock.slept < 2.5
    successor.acquire(me)
    assert successor.predecessor is not None and successor.serve_after == pytest.approx(clock.t + FENCE_S)


def test_a_restarted_master_waits_until_its_live_predecessors_renewal_has_failed(tmp_path):
    store = open_store(str(tmp_path / "ckpt"))
    predecessor = PrefixClaim(store, spec())
    predecessor.acquire(Holder("run", 1, "another-machine", "node-a", pod="pod-1"))  # on a lost node, alive
    renewed: list[bool] = []
    clock = FakeClock(1000.0, on_sleep=lambda: renewed.append(predecessor.renew()))  # it renews meanwhile
    successor = PrefixClaim(store, spec(), clock=clock, sleep=clock.sleep)
    assert successor.acquire(replace(Holder.of_this_process("run-token"), id="run")) is True
    assert clock.slept == 0.0  # the lock is taken at once...
    successor.wait_fenced()
    assert clock.slept >= RENEW_EVERY_S  # ...but it serves only once the predecessor has tried to renew
    assert renewed and not any(renewed)  # and failed: it stops


def test_a_master_restarted_in_its_own_pod_serves_at_once(tmp_path, monkeypatch):
    store = open_store(str(tmp_path / "ckpt"))
    PrefixClaim(store, spec()).acquire(Holder("run", 1, "an-earlier-container", "pod", pod="pod-1"))
    monkeypatch.setenv("EDL_POD_UID", "pod-1")
    clock = FakeClock(1000.0)
    restarted = PrefixClaim(store, spec(), clock=clock, sleep=clock.sleep)
    restarted.acquire(replace(Holder.of_this_process("run-token"), id="run"))
    restarted.wait_fenced()
    assert clock.slept == 0.0
