from __future__ import annotations

import json

import numpy as np

from edl.storage.checkpoint import CheckpointStore, decode_arrays, encode_arrays
from edl.storage.store import open_store


def test_newest_valid_checkpoint_wins_and_corrupt_is_skipped(tmp_path):
    store = open_store(str(tmp_path))
    ck = CheckpointStore(store, keep=3)
    for step in (10, 20, 30):
        ck.write(step, {"model.npz": encode_arrays({"w": np.full(3, step, np.float32)})})
    (tmp_path / "ckpt-000000000030" / "model.npz").write_bytes(b"garbage")
    warnings: list[str] = []
    found = ck.latest(warn=warnings.append)
    assert found is not None and found[0].step == 20
    assert "ckpt-000000000030" in warnings[0] and "checksum" in warnings[0]
    assert decode_arrays(found[1]["model.npz"])["w"][0] == 20


def test_uncommitted_write_is_never_read_and_old_ones_are_pruned(tmp_path):
    store = open_store(str(tmp_path))
    ck = CheckpointStore(store, keep=2)
    for step in (1, 2, 3):
        ck.write(step, {"a.json": json.dumps({"s": step}).encode()})
    store.put("ckpt-000000000009/a.json", b"{}")  # a writer died before the manifest
    assert ck.committed() == ["ckpt-000000000002", "ckpt-000000000003"]
    assert ck.latest()[0].step == 3
    ck.write(4, {"a.json": b"{}"})
    assert ck.committed() == ["ckpt-000000000003", "ckpt-000000000004"]
    assert store.exists("ckpt-000000000009/a.json")  # newer than committed: maybe in progress
