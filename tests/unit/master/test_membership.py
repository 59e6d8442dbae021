from __future__ import annotations

from edl.api.master import Phase, Reason, Source, SyncReport, TrainerState
from edl.master.membership import Membership, MembershipConfig
from edl.api.data import Cursor


def started(n: int = 2, **cfg) -> Membership:
    m = Membership(MembershipConfig(min_trainers=1, max_trainers=4, desired=n, **cfg))
    for i in range(n):
        m.register(f"t{i}", 100 + i, "127.0.0.1", 9000 + i, now=0.0)
    assert m.ready_to_form(0.0)
    m.form(0.0, 0, Source.INIT)
    return m


def report_all(m: Membership, step: int, now: float, failed: bool = False, skip=()) -> None:
    cursors = {t: Cursor(1, 2) for t in m.members()}
    for t in m.members():
        if t not in skip and m.trainers[t].state in (TrainerState.ACTIVE, TrainerState.DRAINING):
            m.report(SyncReport(t, m.current.id, step, cursors, 7000, failed), now)


def test_first_generation_waits_for_desired_or_grace():
    m = Membership(MembershipConfig(1, 4, desired=3, start_grace_s=5))
    m.register("a", 1, "h", 1, now=0.0)
    assert not m.ready_to_form(1.0)
    assert m.ready_to_form(5.0)
    g = m.form(5.0, 0, Source.INIT).generation
    assert g.members == ("a",) and g.reason is Reason.START and g.source is Source.INIT


def test_registration_triggers_scale_up_after_boundary_reports():
    m = started(2)
    m.register("t2", 3, "h", 3, now=10.0)
    assert m.phase is Phase.SYNCING and m.change_pending_for("t0")
    assert not m.ready_to_form(10.1)
    report_all(m, 50, 10.2)
    f = m.form(10.2, 0, Source.INIT)
    g = f.generation
    assert g.world_size == 3 and g.reason is Reason.SCALE_UP and g.base_step == 50
    assert g.source is Source.PEER and g.members[-1] == "t2"
    assert not f.rollback
    m.first_step(g.id, 10.7)
    assert abs(g.pause_s - 0.7) < 1e-9


def test_drain_leaves_at_the_boundary():
    m = started(3)
    m.drain("t2", 5.0)
    report_all(m, 20, 5.1)
    f = m.form(5.1, 0, Source.INIT)
    assert f.departed == {"t2": False}
    assert f.generation.members == ("t0", "t1") and f.generation.reason is Reason.SCALE_DOWN
    assert m.trainers["t2"].state is TrainerState.LEFT


def test_failure_uses_the_survivor_with_the_most_progress():
    m = started(3)
    m.fail("t0", 3.0)
    m.report(SyncReport("t1", 1, 41, {"t0": Cursor(5, 1)}, 7001, True), 3.1)
    m.report(SyncReport("t2", 1, 42, {"t0": Cursor(5, 9)}, 7002, True), 3.1)
    f = m.form(3.1, 0, Source.INIT)
    g = f.generation
    assert g.members[0] == "t2" and g.base_step == 42 and g.cursors["t0"] == Cursor(5, 9)
    assert f.departed == {"t0": True} and g.reason is Reason.FAILURE


def test_member_missing_the_sync_is_dropped():
    m = started(2, sync_timeout_s=2.0)
    m.register("t9", 9, "h", 9, now=1.0)
    report_all(m, 10, 1.1, skip=("t1",))
    m.heartbeat("t1", 10, 2.9)
    m.expire(2.0)
    assert not m.ready_to_form(2.0)
    m.expire(3.2)
    assert m.trainers["t1"].state is TrainerState.FAILED
    assert m.ready_to_form(3.2)


def test_no_survivor_rolls_back_to_the_checkpoint():
    m = started(1)
    m.fail("t0", 2.0)
    assert not m.ready_to_form(2.0)  # nobody to form with yet
    m.register("t5", 5, "h", 5, now=3.0)
    f = m.form(3.0, 30, Source.CHECKPOINT)
    assert f.rollback and f.generation.base_step == 30 and f.generation.source is Source.CHECKPOINT


def test_lease_expiry_fails_a_silent_trainer():
    m = started(2, lease_s=5.0)
    m.heartbeat("t0", 1, 4.0)
    m.expire(6.0)
    assert m.trainers["t1"].state is TrainerState.FAILED
    assert m.phase is Phase.SYNCING
