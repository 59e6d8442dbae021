"""The audit log through an outage of its store: records wait in a local spool, in order, and reach the
store once it is back (by the writer's own thread, or by ``upload_spool`` for a writer killed first)."""

from __future__ import annotations

import threading
import time

import pytest

from edl.errors import StorageError
from edl.storage.audit import AuditWriter, audit, audit_spool, read_audit_lines, upload_spool
from edl.storage.store import FileStore
from edl.trainer.audit import AuditLog


class FlakyStore(FileStore):
    """A directory store that can be taken down: every write then fails as an unreachable S3 does."""

    def __init__(self, root) -> None:
        super().__init__(root.as_uri(), root)
        self.down = False
        self.attempts = 0  # by the writing thread itself (not the spool's mover)

    def put_once(self, key: str, data: bytes) -> None:
        if threading.current_thread().name != "edl-audit-spool":
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


@pytest.fixture
def spool(tmp_path):
    return audit_spool(tmp_path / "spool")


def test_records_the_store_refuses_wait_in_the_spool_and_reach_it_in_order_when_it_is_back(tmp_path, spool):
    store = FlakyStore(tmp_path / "ckpt")
    w = AuditWriter(store, "t1", spool, every_s=0.05)
    w.write("line 0")
    store.down = True
    for i in range(1, 5):
        w.write(f"line {i}")  # returns at once: nothing waits for the store
    assert w.behind and len(spool.list("audit/")) == 4 and len(store.list("audit/")) == 1
    assert store.attempts == 2  # line 1 knocked; behind, the writer goes straight to the spool (its thread knocks)
    w.write("line 5")
    store.down = False
    wait_until(lambda: not w.behind)
    assert spool.list("audit/") == []
    assert list(read_audit_lines(store)) == [f"line {i}" for i in range(6)]
    w.write("line 6")  # and straight to the store again
    assert spool.list("audit/") == [] and list(read_audit_lines(store))[-1] == "line 6"
    w.close()


def test_what_a_killed_writer_left_in_the_spool_is_moved_by_upload_spool(tmp_path, spool):
    store = FlakyStore(tmp_path / "ckpt")
    a, b = AuditLog(store, "a", spool=spool), AuditLog(store, "b", spool=spool)
    for log in (a, b):
        log.generation((1, 1), 0)
    a.step((1, 1), 1, {0: [0, 1]})
    a.close()
    store.down = True
    b.step((1, 1), 1, {0: [2, 3]})
    b.close()  # b dies: nothing moves its records but upload_spool
    with pytest.raises(StorageError):
        upload_spool(store, spool)  # still away: nothing is lost from the spool
    assert audit(store, list(range(4)), epochs=1).lost == 2 and len(spool.list("audit/")) >= 1
    store.down = False
    upload_spool(store, spool)
    assert spool.list("audit/") == []
    r = audit(store, list(range(4)), epochs=1)
    assert r.lost == 0 and r.duplicates == 0


def test_a_record_in_both_places_counts_once(tmp_path, spool):
    """A move cut short between the write to the store and the removal from the spool."""
    store = FlakyStore(tmp_path / "ckpt")
    key = "audit/t1/1abc-000000000.jsonl"
    for s in (store, spool):
        s.put(key, b'{"gen": [1, 1], "base": 0}\n')
    spool.put("audit/t1/1abc-000000001.jsonl", b'{"gen": [1, 1], "step": 1, "records": {"0": [0]}}\n')
    assert upload_spool(store, spool) == 2
    r = audit(store, [0], epochs=1)
    assert r.lost == 0 and r.duplicates == 0


def test_without_a_spool_a_write_is_the_stores_to_take_or_fail(tmp_path):
    """A trainer pod has no disk that outlives it: its write goes through the store's own retries."""
    store = FlakyStore(tmp_path / "ckpt")
    store.down = True
    with pytest.raises(StorageError):
        AuditWriter(store, "t1").write("line")
    assert store.list("audit/") == []
