"""Rank 0's checkpoints: the master's half of the cut is taken before the caller's next step."""

from __future__ import annotations

import json
import threading

import numpy as np

from edl.api.data import Cursor
from edl.errors import StaleError, TemporaryError
from edl.storage.checkpoint import CheckpointStore
from edl.storage.store import open_store
from edl.trainer.checkpoints import Checkpointer


class CutLink:
    """The master as the cut sees it: records on which thread, and when, each cut was asked for."""

    def __init__(self, error: Exception | None = None) -> None:
        self.error = error
        self.cuts: list[tuple[str, int]] = []
        self.committed: list[int] = []

    def checkpoint_cut(self, generation, step, cursors):
        self.cuts.append((threading.current_thread().name, step))
        if self.error is not None:
            raise self.error
        return {"step": step, "queue": {"cursors": {k: None if v is None else v.offset for k, v in cursors.items()}}}

    def checkpoint_committed(self, generation, step, uri, write_s):
        self.committed.append(step)
        return True


def snapshot():
    return {"w": np.ones(3, dtype=np.float32)}, {}, {}


def test_the_cut_is_taken_on_the_callers_thread_before_save_returns(tmp_path):
    # The other ranks commit their cursors as they train on: a cut the writer thread took later could
    # find a task one of them finished after the step already done, and a job that went back to that
    # checkpoint would lose its rows. Taken before the caller's next step, no rank can be past it.
    store = CheckpointStore(open_store(str(tmp_path)))
    cut_link, writer_link = CutLink(), CutLink()
    ck = Checkpointer(store, lambda: writer_link, "t0", "mlp")
    assert ck.save(1, 7, {"t0": Cursor(3, 5)}, snapshot, cut_link)
    assert cut_link.cuts == [(threading.current_thread().name, 7)]  # already cut, on this thread
    ck.flush(10)
    assert writer_link.committed == [7] and writer_link.cuts == []
    _, files = store.read("ckpt-000000000007")
    assert json.loads(files["master.json"])["step"] == 7


def test_a_cut_the_master_does_not_take_means_no_checkpoint_this_time(tmp_path):
    store = CheckpointStore(open_store(str(tmp_path)))
    for error in (StaleError("generation 1 is not current"), TemporaryError("master away")):
        taken = []
        ck = Checkpointer(store, lambda: CutLink(), "t0", "mlp")
        assert not ck.save(1, 7, {"t0": None}, lambda: taken.append(1) or snapshot(), CutLink(error))
        ck.flush(10)
        assert taken == [] and store.latest() is None  # nothing copied, nothing written


class FencedLink(CutLink):
    """A master that no longer holds the cuts: a rank 0 that lived on beside its master's successor."""

    def checkpoint_committed(self, generation, step, uri, write_s):
        self.committed.append(step)
        return False


def test_older_checkpoints_are_pruned_only_once_the_master_took_the_commit(tmp_path):
    # A lost node's rank 0 trains on with its master until the run lock fences that master; its
    # checkpoints must not prune away the one the successor restored from (new trainers failed to
    # load it: its manifest was gone).
    store = CheckpointStore(open_store(str(tmp_path)), keep=2)
    taken = Checkpointer(store, lambda: CutLink(), "t0", "mlp")
    for step in (1, 2):
        assert taken.save(1, step, {"t0": None}, snapshot, CutLink(), wait=True)
    assert store.committed() == ["ckpt-000000000001", "ckpt-000000000002"]
    fenced_link = FencedLink()
    fenced = Checkpointer(store, lambda: fenced_link, "t0", "mlp")
    for step in (3, 4, 5):
        assert fenced.save(1, step, {"t0": None}, snapshot, CutLink(), wait=True)
    assert fenced_link.committed == [3, 4, 5]  # written and reported, never taken
    assert store.committed()[:2] == ["ckpt-000000000001", "ckpt-000000000002"]  # nothing pruned
    assert taken.save(2, 6, {"t0": None}, snapshot, CutLink(), wait=True)
    assert store.committed() == ["ckpt-000000000005", "ckpt-000000000006"]  # a taken commit prunes as before
