"""The audit log through an outage of its store: records wait in a local spool, in order, and reach the
store once it is back (by the writer's own thread, or by ``upload_spool`` for a writer killed first)."""

from __future__ import annotations

import time

import pytest

from edl.errors import StorageError
from edl.storage.audit import AuditWriter, audit, read_audit_lines, upload_spool
from edl.storage.store import FileStore, open_store
from edl.trainer.audit import AuditLog


class FlakyStore(FileStore):
    """A directory store that can be taken down: every write then fails as an unreachable S3 does."""

    def __init__(self, root) -> None:
        super().__init__(root.as_uri(), root)
        self.down = False
        self.attempts = 0

    def put_once(self, key: str, data: bytes) -> None:
        self.attempts += 1
        if self.down:
            raise StorageError("cannot reach S3 endpoint http://127.0.0.1:1 for it: connection refused")
        super().put(key, data)

    def put(self, key: str, data: bytes) -> None:
        self.put_once(key, data)


def wait_until(predicate, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "not reached in time"
        time.sleep(0.02)


def test_records_the_store_refuses_wait_in_the_spool_and_reach_it_in_order_when_it_is_back(tmp_path):
    store, spool = FlakyStore(tmp_path / "ckpt"), open_store(str(tmp_path / "spool"))
    w = AuditWriter(store, "t1", spool, every_s=0.05)
    w.write("line 0")
    store.down = True
    for i in range(1, 5):
        w.write(f"line {i}")  # returns at once: nothing waits for the store
    assert w.behind and len(spool.list("audit/")) == 4 and len(store.list("audit/")) == 1
    tried = store.attempts
    w.write("line 5")
    assert store.attempts - tried <= 1  # behind: the writer itself does not knock again (its thread does)
    store.down = False
    wait_until(lambda: not w.behind)
    assert spool.list("audit/") == []
    assert list(read_audit_lines(store)) == [f"line {i}" for i in range(6)]
    w.write("line 6")  # and straight to the store again
    assert spool.list("audit/") == [] and list(read_audit_lines(store))[-1] == "line 6"


def test_what_a_killed_writer_left_in_the_spool_is_moved_by_upload_spool(tmp_path):
    store, spool = FlakyStore(tmp_path / "ckpt"), open_store(str(tmp_path / "spool"))
    a, b = AuditLog(store, "a", spool=spool), AuditLog(store, "b", spool=spool)
    for log in (a, b):
        log.generation((1, 1), 0)
    a.step((1, 1), 1, {0: [0, 1]})
    store.down = True
    b.step((1, 1), 1, {0: [2, 3]})  # b "dies" right after: only the spool has its step
    with pytest.raises(StorageError):
        upload_spool(store, spool)  # still away: nothing is lost from the spool
    assert audit(store, list(range(4)), epochs=1).lost == 2 and len(spool.list("audit/")) >= 1
    store.down = False
    upload_spool(store, spool)
    assert spool.list("audit/") == []
    r = audit(store, list(range(4)), epochs=1)
    assert r.lost == 0 and r.duplicates == 0


def test_a_record_in_both_places_counts_once(tmp_path):
    """A move cut short between the write to the store and the removal from the spool."""
    store, spool = FlakyStore(tmp_path / "ckpt"), open_store(str(tmp_path / "spool"))
    key = "audit/t1/1abc-000000000.jsonl"
    for s in (store, spool):
        s.put(key, b'{"gen": [1, 1], "base": 0}\n')
    spool.put("audit/t1/1abc-000000001.jsonl", b'{"gen": [1, 1], "step": 1, "records": {"0": [0]}}\n')
    assert upload_spool(store, spool) == 2
    r = audit(store, [0], epochs=1)
    assert r.lost == 0 and r.duplicates == 0


def test_without_a_spool_a_write_waits_for_the_store(tmp_path):
    store = FlakyStore(tmp_path / "ckpt")
    store.down = True
    with pytest.raises(StorageError):
        AuditWriter(store, "t1").write("line")  # (the real store retries first; a pod's disk goes with it)
