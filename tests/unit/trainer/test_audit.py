from __future__ import annotations

from edl.storage.audit import audit, clear_audit
from edl.storage.store import open_store
from edl.trainer.audit import AuditLog


def test_lineage_drops_steps_lost_with_a_replica_or_rolled_back(tmp_path):
    store = open_store(str(tmp_path / "ckpt"))
    a = AuditLog(store, "a")
    b = AuditLog(store, "b")
    g1, g2, g3 = (1, 1), (1, 2), (2, 1)
    for log in (a, b):
        log.generation(g1, 0)
    a.step(g1, 1, {0: [0, 1]})
    b.step(g1, 1, {0: [2, 3]})
    a.step(g1, 2, {0: [4, 5]})  # b died during step 2; nobody completed it
    a.generation(g2, 1)
    a.step(g2, 2, {0: [4, 5, 6]})
    a.step(g2, 3, {0: [7]})  # later rolled back by a restart from the step-2 checkpoint
    a.generation(g3, 2)
    a.step(g3, 3, {0: [7, 8, 9]})
    a.close()
    b.close()
    r = audit(store, list(range(10)), epochs=1)
    assert r.lost == 0 and r.duplicates == 0
    assert r.samples_per_epoch == [10]


def test_counts_lost_and_duplicates(tmp_path):
    store = open_store(str(tmp_path / "ckpt"))
    a = AuditLog(store, "a")
    a.generation((1, 1), 0)
    a.step((1, 1), 1, {0: [0, 1, 1]})
    a.close()
    r = audit(store, [0, 1, 2], epochs=1)
    assert r.lost == 1 and r.duplicates == 1


def test_the_log_lives_under_the_checkpoints_and_a_writer_name_used_twice_keeps_both(tmp_path):
    """Each record is an object of its own under CHECKPOINTS/audit/: a second process with the same
    trainer name adds records beside the first one's instead of overwriting them."""
    store = open_store(str(tmp_path / "ckpt"))
    for _ in range(2):
        log = AuditLog(store, "t1")
        log.generation((1, 1), 0)
        log.step((1, 1), 1, {0: [0, 1]})
    keys = store.list("audit/")
    assert len(keys) == 4 and all(k.startswith("audit/t1/") for k in keys)
    assert audit(store, [0, 1], epochs=1).duplicates == 2  # both writers' step 1 counted
    clear_audit(store)
    assert store.list("audit/") == [] and audit(store, [0, 1], epochs=1).lost == 2
