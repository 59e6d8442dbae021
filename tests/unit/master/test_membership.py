from __future__ import annotations

from edl.api.master import NO_STATE, Phase, Reason, Source, SyncReport, TrainerState
from edl.master.membership import Membership, MembershipConfig
from edl.api.data import Cursor


def started(n: int = 2, **cfg) -> Membership:
    """``n`` trainers in generation 1. Graceful changes stop at a boundary unless ``prepare=True``."""
    cfg.setdefault("prepare", False)
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


# ------------------------------------------------------------------ a failure aborts; hangs are found
def test_a_failure_aborts_the_generation_for_every_member_until_it_reports():
    m = started(3)
    assert not any(m.aborting(t) for t in m.members())
    m.register("t9", 9, "h", 9, now=1.0)  # a graceful change: members stop at a step boundary, no abort
    assert m.change_pending_for("t1") and not m.aborting("t1")
    m.fail("t0", 1.5)  # ... until a member dies during it
    assert m.aborting("t1") and m.aborting("t2") and not m.aborting("t9")
    m.report(SyncReport("t1", 1, 40, {}, 7001, True), 1.6)
    assert not m.aborting("t1") and m.aborting("t2")


def beat_all(m: Membership, now: float, waiting: dict[str, float | None], step: int = 10) -> None:
    for t, in_collective in waiting.items():
        m.heartbeat(t, step, now, m.current.id, in_collective)


def test_a_silent_member_the_others_wait_on_is_dropped_well_before_its_lease():
    m = started(3, lease_s=10.0, hang_s=5.0, silent_s=4.0)
    beat_all(m, 1.0, {"t0": None, "t1": None, "t2": None})  # t0 stops (SIGSTOP) right after this
    for now in (2.0, 3.0, 4.0, 5.0, 6.0):  # the others wait in the collective since t=1.0
        beat_all(m, now, {"t1": now - 1.0, "t2": now - 1.0})
        m.expire(now)
        assert m.trainers["t0"].state is TrainerState.ACTIVE
    beat_all(m, 6.2, {"t1": 5.2, "t2": 5.2})
    m.expire(6.2)
    assert m.trainers["t0"].state is TrainerState.FAILED  # 5.2 s after its last beat, lease 10 s
    assert m.excluded[0][0] == "t0" and "silent" in m.excluded[0][1]
    assert m.aborting("t1") and m.aborting("t2")
    assert m.trainers["t1"].state is TrainerState.ACTIVE and m.trainers["t2"].state is TrainerState.ACTIVE


def test_nobody_is_dropped_while_nobody_waits_or_everyone_waits_and_beats():
    m = started(2, hang_s=5.0, silent_s=4.0, stall_s=15.0)
    beat_all(m, 1.0, {"t0": None, "t1": None})
    m.expire(8.0)  # both silent 7 s but nobody waits on anybody: the lease decides (10 s)
    assert all(t.state is TrainerState.ACTIVE for t in m.trainers.values())
    for now in range(9, 30):  # both in the collective, both beating: a slow collective, not a hang
        beat_all(m, float(now), {"t0": now - 8.0, "t1": now - 8.0})
        m.expire(float(now))
    assert all(t.state is TrainerState.ACTIVE for t in m.trainers.values()) and not m.excluded


def test_a_member_beating_but_not_stepping_while_the_others_wait_is_dropped_after_the_stall_limit():
    m = started(2, hang_s=5.0, silent_s=4.0, stall_s=15.0)
    beat_all(m, 1.0, {"t0": None, "t1": None}, step=10)
    for now in range(2, 17):  # t1 waits at step 11; t0's loop is stuck in a read, its heartbeat goes on
        beat_all(m, float(now), {"t0": None, "t1": now - 1.0}, step=10)
        m.expire(float(now))
    assert m.trainers["t0"].state is TrainerState.ACTIVE  # waited 15 s: not over the limit yet
    beat_all(m, 17.5, {"t0": None, "t1": 16.5}, step=10)
    m.expire(17.5)
    assert m.trainers["t0"].state is TrainerState.FAILED and "no step" in m.excluded[0][1]
    assert m.trainers["t1"].state is TrainerState.ACTIVE


def test_state_goes_only_to_members_that_do_not_hold_the_base_step():
    m = started(3)
    assert m.current.state_to == (1, 2)  # a fresh start: rank 0's initial state to everyone
    m.drain("t2", 5.0)
    report_all(m, 20, 5.1)
    assert m.form(5.1, 0, Source.INIT).generation.state_to == ()  # survivors stopped at one step
    m.register("t3", 3, "h", 3, now=6.0)
    report_all(m, 30, 6.1)
    g = m.form(6.1, 0, Source.INIT).generation
    assert g.members == ("t0", "t1", "t3") and g.state_to == (2,)  # only the joiner
    m.fail("t0", 7.0)
    m.report(SyncReport("t1", g.id, 40, {}, 7001, True), 7.1)  # behind the other survivor
    m.report(SyncReport("t3", g.id, 41, {}, 7003, True), 7.1)
    g = m.form(7.1, 0, Source.INIT).generation
    assert g.members == ("t3", "t1") and g.state_to == (1,)


def test_a_rollback_sends_the_checkpoint_to_all_but_rank0_unless_they_hold_the_step():
    m = started(2)
    for t in ("t0", "t1"):
        m.fail(t, 3.0)
    m.register("t2", 2, "h", 2, now=4.0)
    m.register("t3", 3, "h", 3, now=4.0)
    g = m.form(4.0, 100, Source.CHECKPOINT).generation
    assert g.source is Source.CHECKPOINT and g.state_to == (1,)
    m2 = Membership(MembershipConfig(1, 4, desired=2))
    for t in ("a", "b", "c"):
        m2.register(t, 1, "h", 1, now=0.0)
    g2 = m2.form(0.0, 42, Source.PEER, lead="b", holders={"a", "b"}).generation
    assert g2.members[0] == "b" and g2.state_to == (2,)  # a restarted master's joiner "c" only


# ---------------------------------------------------------------- prepared changes
def switch_all(m: Membership, step: int, now: float, to: int) -> None:
    cursors = {t: Cursor(1, step) for t in m.members()}
    for t in m.members():
        if m.trainers[t].state in (TrainerState.ACTIVE, TrainerState.DRAINING):
            m.report(SyncReport(t, m.current.id, step, cursors, 7000, False, to), now)


def test_a_registration_prepares_the_next_generation_while_the_current_trains_on():
    m = started(2, prepare=True)
    m.heartbeat("t0", 5, 9.0, store_port=9010)  # where rank 0's next store would listen
    m.register("t2", 3, "h2", 9002, now=10.0)
    assert m.phase is Phase.RUNNING and not m.change_pending_for("t0")  # nobody stops
    p = m.prepare(10.0)
    assert p is not None and p.id == 2 and p.members == ("t0", "t1", "t2") and p.state_to == (2,)
    assert p.rendezvous == ("127.0.0.1", 9010)  # rank 0 stays rank 0, on the port it advertised
    assert m.prepared_for("t0") is p and m.prepared_for("t2") is p and m.prepared_for("t9") is None
    for t in ("t0", "t1"):
        m.ready_for(t, p.id, 10.1)
    assert not m.go
    m.ready_for("t2", p.id, 10.2)
    assert m.go
    switch_all(m, 50, 10.4, to=p.id)  # every member switched after step 50
    assert m.ready_to_form(10.4)
    f = m.form(10.4, 0, Source.INIT)
    g = f.generation
    assert g.id == p.id and g.members == p.members and g.rendezvous == p.rendezvous and g.base_step == 50
    assert g.reason is Reason.SCALE_UP and g.source is Source.PEER and g.state_to == (2,) and not f.rollback
    assert m.trainers["t2"].state is TrainerState.ACTIVE and m.prepared is None
    assert abs(g.prepared_s - 0.4) < 1e-9  # in the background, while the old generation trained
    m.first_step(g.id, 10.6)
    assert abs(g.pause_s - 0.2) < 1e-9 and g.stopped_at == 10.4  # from the switch (its first report) to the first step


def test_a_drained_member_leaves_at_the_switch_and_nobody_needs_state():
    m = started(3, prepare=True)
    m.heartbeat("t0", 5, 4.0, store_port=9010)
    m.drain("t1", 5.0)
    assert m.trainers["t1"].state is TrainerState.DRAINING and m.phase is Phase.RUNNING
    p = m.prepare(5.0)
    assert p.members == ("t0", "t2") and p.state_to == () and m.prepared_for("t1") is p  # told, to leave there
    for t in p.members:
        m.ready_for(t, p.id, 5.1)
    switch_all(m, 20, 5.3, to=p.id)
    f = m.form(5.3, 0, Source.INIT)
    assert f.generation.id == p.id and f.departed == {"t1": False}
    assert m.trainers["t1"].state is TrainerState.LEFT and f.generation.cursors["t1"] == Cursor(1, 20)


def test_a_change_before_the_go_plans_again_and_one_after_waits_for_the_switch():
    m = started(1, prepare=True)
    m.heartbeat("t0", 5, 0.5, store_port=9010)
    m.register("a", 1, "h", 11, now=1.0)
    p1 = m.prepare(1.0)
    m.register("b", 2, "h", 12, now=1.1)  # before the go: planned again with both
    assert m.prepared is None and p1.id in m.dropped
    m.heartbeat("t0", 5, 1.15, store_port=9100)  # rank 0 advertises its next port
    p2 = m.prepare(1.2)
    assert p2.id > p1.id and p2.members == ("t0", "a", "b") and p2.rendezvous[1] == 9100
    for t in p2.members:
        m.ready_for(t, p2.id, 1.3)
    m.register("c", 3, "h", 13, now=1.4)  # after the go: the switch stands, c comes next
    assert m.prepared is p2 and m.go
    switch_all(m, 9, 1.5, to=p2.id)
    assert m.form(1.5, 0, Source.INIT).generation.members == ("t0", "a", "b")
    assert m.trainers["c"].state is TrainerState.WAITING and m.wanted is Reason.SCALE_UP


def test_rank0s_port_is_never_given_out_twice():
    m = started(2, prepare=True)
    m.register("t2", 3, "h", 3, now=1.0)
    assert m.prepare(1.0) is None  # 9000 is generation 1's store: rank 0 has not advertised another yet
    m.heartbeat("t0", 5, 1.1, store_port=9000)
    assert m.prepare(1.1) is None
    m.heartbeat("t0", 5, 1.2, store_port=9010)
    assert m.prepare(1.2).rendezvous[1] == 9010


def test_a_failure_drops_the_preparation_and_whoever_switched_into_it_is_told_to_leave():
    m = started(2, prepare=True)
    m.register("t2", 3, "h", 3, now=1.0)
    m.heartbeat("t0", 5, 1.0, store_port=9010)
    p = m.prepare(1.0)
    for t in p.members:
        m.ready_for(t, p.id, 1.1)
    switch_all(m, 30, 1.2, to=p.id)  # both switched; then the joiner dies before it is formed
    m.heartbeat("t0", 30, 1.25, generation=p.id)
    m.fail("t2", 1.3)
    f = m.form(1.3, 0, Source.INIT)
    assert f.generation.id > p.id and f.generation.members == ("t0", "t1") and f.generation.base_step == 30
    assert m.in_dropped_prepared("t0")  # still in p's collective (its heartbeat said so): it must leave it
    m.heartbeat("t0", 30, 1.35, generation=f.generation.id)
    assert not m.in_dropped_prepared("t0")  # it did, and joined the one formed
    m2 = started(2, prepare=True)
    m2.register("t2", 3, "h", 3, now=1.0)
    m2.heartbeat("t0", 5, 1.0, store_port=9010)
    p2 = m2.prepare(1.0)
    for t in p2.members:
        m2.ready_for(t, p2.id, 1.1)
    m2.fail("t2", 1.15)  # before anyone reported: dropped, planned again without it
    assert m2.prepared is None and p2.id in m2.dropped
    m2.heartbeat("t1", 5, 1.2, generation=p2.id)  # t1 had switched already
    assert m2.in_dropped_prepared("t1")


def test_a_preparation_not_ready_in_time_stops_at_a_boundary():
    m = started(2, prepare=True, prepare_timeout_s=5.0)
    m.register("t2", 3, "h", 3, now=1.0)
    m.heartbeat("t0", 5, 1.0, store_port=9010)
    p = m.prepare(1.0)
    m.ready_for("t0", p.id, 2.0)
    m.expire(5.9)
    assert m.phase is Phase.RUNNING
    m.expire(6.1)
    assert m.phase is Phase.SYNCING and m.change_pending_for("t0") and m.prepared is None
    report_all(m, 40, 6.3)
    g = m.form(6.3, 0, Source.INIT).generation
    assert g.id > p.id and g.members == ("t0", "t1", "t2") and g.base_step == 40


def test_the_first_step_heard_before_the_last_report_still_ends_the_pause():
    m = started(3, prepare=True)
    m.drain("t2", 1.0)
    m.heartbeat("t0", 5, 1.0, store_port=9010)
    p = m.prepare(1.0)
    for t in p.members:
        m.ready_for(t, p.id, 1.1)
    cursors = {t: Cursor(1, 7) for t in m.members()}
    for t in ("t0", "t1"):
        m.report(SyncReport(t, 1, 7, cursors, 7000, False, p.id), 1.2)
    m.first_step(p.id, 1.3)  # the drained member's report is late
    m.report(SyncReport("t2", 1, 7, cursors, 7000, False, p.id), 1.4)
    g = m.form(1.4, 0, Source.INIT).generation
    assert g.id == p.id and abs(g.pause_s - 0.1) < 1e-9


def test_a_member_told_to_stop_while_the_switch_is_under_way_leaves_at_the_next_change():
    # A trainer SIGTERMed (its pod preempted) between the go and the switch: the switch stands with it,
    # and the change after plans its leaving; it is never left draining in a generation nobody changes.
    m = started(2, prepare=True)
    m.heartbeat("t0", 5, 0.5, store_port=9010)
    m.register("a", 1, "h", 11, now=1.0)
    p = m.prepare(1.0)
    for t in p.members:
        m.ready_for(t, p.id, 1.1)
    m.report(SyncReport("t0", m.current.id, 9, {t: Cursor(1, 9) for t in m.members()}, 7000, False, p.id), 1.2)
    assert m.phase is Phase.SYNCING
    m.drain("t1", 1.25)
    switch_all(m, 9, 1.3, to=p.id)
    assert m.form(1.3, 0, Source.INIT).generation.members == ("t0", "t1", "a")
    m.heartbeat("t0", 9, 1.35, store_port=9200)
    p2 = m.prepare(1.4)
    assert p2 is not None and p2.members == ("t0", "a") and p2.reason is Reason.SCALE_DOWN
    assert m.prepared_for("t1") is p2  # told, to leave there


def test_a_survivor_that_never_received_its_generations_state_restarts_from_the_checkpoint():
    # A restarted master's generation from its checkpoint: before the state reached anyone, a member died;
    # the survivor's replica is what it held under the old master (step 36649), no source: it says so
    # (NO_STATE), and the next generation loads the checkpoint again, with the survivor in it.
    m = started(2)
    m.fail("t1", 3.0)
    m.report(SyncReport("t0", m.current.id, NO_STATE, {}, 7001, True), 3.1)
    f = m.form(3.1, 36549, Source.CHECKPOINT)
    g = f.generation
    assert g.members == ("t0",) and g.source is Source.CHECKPOINT and g.base_step == 36549 and f.rollback
    # One survivor that holds it is the source, whatever the others say.
    m = started(3)
    m.fail("t2", 3.0)
    m.report(SyncReport("t0", m.current.id, NO_STATE, {}, 7001, True), 3.1)
    m.report(SyncReport("t1", m.current.id, 42, {"t1": Cursor(5, 1)}, 7002, True), 3.1)
    g = m.form(3.1, 0, Source.INIT).generation
    assert g.members[0] == "t1" and g.source is Source.PEER and g.base_step == 42


# ------------------------------------------------------------------ what began each change
def test_each_generation_records_what_began_its_change_and_where_its_time_went():
    m = started(3, lease_s=5.0)
    assert m.current.cause == "the job started"
    m.heartbeat("t0", 1, 4.0)
    m.heartbeat("t2", 1, 4.0)
    m.expire(6.0)  # t1 silent past its lease
    m.drain("t2", 6.05)  # a second change while the first is under way: the first began it
    report_all(m, 30, 6.2)
    g = m.form(6.5, 0, Source.INIT).generation
    m.first_step(g.id, 7.0)
    assert g.cause == "t1 silent for 5 s (its lease)" and g.reason is Reason.FAILURE
    assert (g.triggered_at, g.stopped_at, g.formed_at, g.first_step_at) == (6.0, 6.2, 6.5, 7.0)
    m.register("t3", 4, "h", 9004, now=8.0)
    report_all(m, 40, 8.1)
    assert m.form(8.1, 0, Source.INIT).generation.cause == "t3 joined"


def test_a_prepared_change_keeps_its_cause_through_the_switch_and_through_a_drop():
    m = started(2, prepare=True, prepare_timeout_s=5.0)
    m.heartbeat("t0", 5, 9.0, store_port=9010)
    m.register("t2", 3, "h2", 9002, now=10.0)
    p = m.prepare(10.0)
    assert p.cause == "t2 joined"
    for t in p.members:
        m.ready_for(t, p.id, 10.1)
    switch_all(m, 50, 10.4, to=p.id)
    assert m.form(10.4, 0, Source.INIT).generation.cause == "t2 joined"
    m.heartbeat("t0", 60, 11.0, store_port=9020)
    m.drain("t1", 12.0, "told to stop (SIGTERM)")
    assert m.prepare(12.0).cause == "t1 told to stop (SIGTERM)"
    m.expire(18.0)  # its collective never formed: a stop at a boundary instead, for the same cause
    report_all(m, 70, 18.1)
    assert m.form(18.1, 0, Source.INIT).generation.cause == "t1 told to stop (SIGTERM)"
