"""Where a data URI's training and held-out rows are (``resolve_splits``), and reading them by row groups."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from edl.api.data import Shard
from edl.data.dataset import Dataset, group_span, resolve_splits
from edl.errors import UserError


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


# ------------------------------------------------------------------ reading rows by row groups
def shard_of_groups(path, rows: int, group_rows: int) -> pa.Table:
    path.parent.mkdir(parents=True, exist_ok=True)
    t = pa.table({"id": pa.array(range(rows), pa.int64()), "x": pa.array([float(i) / 7 for i in range(rows)])})
    pq.write_table(t, path, row_group_size=group_rows)
    return t


def test_group_span_names_the_row_groups_of_a_range_and_the_rows_within():
    starts = [0, 100, 200, 250]  # groups of 100, 100 and 50 rows
    assert list(group_span(starts, 0, 100)) == [(0, 0, 100)]
    assert list(group_span(starts, 90, 210)) == [(0, 90, 100), (1, 0, 100), (2, 0, 10)]
    assert list(group_span(starts, 100, 101)) == [(1, 0, 1)]
    assert list(group_span(starts, 240, 300)) == [(2, 40, 50)]  # past the end: what there is
    assert list(group_span(starts, 120, 120)) == []
    assert list(group_span([0, 0, 5], 0, 5)) == [(1, 0, 5)]  # an empty row group holds nothing


@pytest.mark.parametrize("start, end", [(0, 1000), (0, 64), (63, 65), (500, 999), (999, 1000), (130, 700)])
def test_rows_of_a_range_equal_the_shards_rows_across_row_groups(tmp_path, start, end):
    t = shard_of_groups(tmp_path / "set" / "part-0.parquet", 1000, 64)
    ds = Dataset(str(tmp_path / "set"), cache_bytes=2000)  # a few groups at most: evictions happen
    assert ds.rows("part-0.parquet", start, end).equals(t.slice(start, end - start))
    assert ds.rows("part-0.parquet", start, end).equals(t.slice(start, end - start))  # cached or read again


def test_readers_on_threads_get_the_same_rows(tmp_path):
    t = shard_of_groups(tmp_path / "set" / "part-0.parquet", 3000, 100)
    ds = Dataset(str(tmp_path / "set"), cache_bytes=10_000)
    ranges = [(i * 37 % 2900, i * 37 % 2900 + 90) for i in range(60)]
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda r: ds.rows("part-0.parquet", *r), ranges))
    assert all(g.equals(t.slice(a, b - a)) for g, (a, b) in zip(got, ranges))


def test_shards_come_from_the_footers_and_bad_shards_are_named(tmp_path):
    shard_of_groups(tmp_path / "set" / "a.parquet", 300, 64)
    shard_of_groups(tmp_path / "set" / "b.parquet", 0, 64)
    assert Dataset(str(tmp_path / "set")).shards() == [Shard("a.parquet", 300)]  # the empty one left out
    (tmp_path / "set" / "c.parquet").write_bytes(b"PAR1 not really")
    with pytest.raises(UserError, match="corrupt Parquet shard .*c.parquet"):
        Dataset(str(tmp_path / "set")).shards()
    (tmp_path / "other").mkdir()
    pq.write_table(pa.table({"key": [1]}), tmp_path / "other" / "d.parquet")
    with pytest.raises(UserError, match="has no 'id' column"):
        Dataset(str(tmp_path / "other")).shards()


def test_all_ids_and_read_all_cover_every_shard(tmp_path):
    a = shard_of_groups(tmp_path / "set" / "a.parquet", 300, 64)
    b = shard_of_groups(tmp_path / "set" / "b.parquet", 70, 64)
    ds = Dataset(str(tmp_path / "set"))
    assert ds.all_ids() == list(range(300)) + list(range(70))
    assert ds.read_all().equals(pa.concat_tables([a, b]))


def test_prepared_shards_have_row_groups_of_a_few_mb(tmp_path):
    from edl.data.prepare import ROW_GROUP_BYTES, prepare_synthetic

    prepare_synthetic(str(tmp_path / "wide"), rows=20000, features=256, classes=4, shards=1)
    meta = pq.ParquetFile(tmp_path / "wide" / "train" / "part-00000.parquet").metadata
    assert meta.num_row_groups >= 4  # 18,000 rows of 1 KB: not one group of the whole shard
    assert all(meta.row_group(i).total_byte_size <= ROW_GROUP_BYTES * 1.1 for i in range(meta.num_row_groups))


def test_prepared_tokens_are_integer_sequences_labelled_by_their_teacher(tmp_path):
    from edl.data.prepare import prepare_tokens
    from edl.zoo.collate import collate_tokens

    info = prepare_tokens(str(tmp_path / "t"), rows=500, length=16, vocab=100, classes=3, shards=2)
    assert info == {"train_rows": 450, "test_rows": 50, "features": 16, "classes": 3}
    table = pq.read_table(tmp_path / "t" / "train" / "part-00000.parquet")
    assert table.column_names == ["id", "tokens", "label"]
    x, y = collate_tokens(table)
    assert x.dtype == np.int64 and x.shape == (225, 16) and 0 <= x.min() and x.max() < 100
    assert set(np.unique(y)) <= {0, 1, 2} and len(np.unique(y)) > 1
    again = tmp_path / "again"
    prepare_tokens(str(again), rows=500, length=16, vocab=100, classes=3, shards=2)
    assert pq.read_table(again / "train" / "part-00000.parquet").equals(table)  # the seed decides it


@pytest.mark.parametrize("kw, needle", [({"rows": 5}, "--rows"), ({"length": 0}, "--length"),
                                        ({"vocab": 1}, "--vocab"), ({"classes": 1}, "--classes")])
def test_prepare_tokens_refuses_bad_sizes_naming_the_flag(tmp_path, kw, needle):
    from edl.data.prepare import prepare_tokens

    args = {"rows": 100, "length": 8, "vocab": 50, "classes": 2, **kw}
    with pytest.raises(UserError, match=needle):
        prepare_tokens(str(tmp_path / "t"), **args)
    assert not (tmp_path / "t").exists()
