from __future__ import annotations

from edl.trainer.audit import AuditLog, audit


def test_lineage_drops_steps_lost_with_a_replica_or_rolled_back(tmp_path):
    a = AuditLog(tmp_path / "a.jsonl")
    b = AuditLog(tmp_path / "b.jsonl")
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
    r = audit(tmp_path, list(range(10)), epochs=1)
    assert r.lost == 0 and r.duplicates == 0
    assert r.samples_per_epoch == [10]


def test_counts_lost_and_duplicates(tmp_path):
    a = AuditLog(tmp_path / "a.jsonl")
    a.generation((1, 1), 0)
    a.step((1, 1), 1, {0: [0, 1, 1]})
    a.close()
    r = audit(tmp_path, [0, 1, 2], epochs=1)
    assert r.lost == 1 and r.duplicates == 1
