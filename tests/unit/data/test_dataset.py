"""Where a data URI's training and held-out rows are (``resolve_splits``)."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

from edl.data.dataset import resolve_splits


def shard(path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"id": pa.array([1, 2], pa.int64())}), path)


def test_a_prepared_set_trains_on_train_and_holds_out_test(tmp_path):
    shard(tmp_path / "set" / "train" / "part-0.parquet")
    shard(tmp_path / "set" / "test" / "part-0.parquet")
    root = (tmp_path / "set").as_uri()
    assert resolve_splits(root) == (f"{root}/train", f"{root}/test")
    assert resolve_splits(f"{root}/train") == (f"{root}/train", f"{root}/test")  # named directly: test/ beside it


def test_files_at_the_top_are_the_training_rows_without_a_held_out_default(tmp_path):
    shard(tmp_path / "flat" / "part-0.parquet")
    shard(tmp_path / "flat" / "test" / "part-0.parquet")
    flat = (tmp_path / "flat").as_uri()
    assert resolve_splits(flat) == (flat, None)
    shard(tmp_path / "only" / "train" / "part-0.parquet")
    only = (tmp_path / "only").as_uri()
    assert resolve_splits(only) == (f"{only}/train", None)
    nothing = (tmp_path / "nothing").as_uri()
    assert resolve_splits(nothing) == (nothing, None)
