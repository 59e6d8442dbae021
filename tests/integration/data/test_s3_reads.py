"""Data read straight from S3 (a real MinIO), by ranges: a shard's footer for its row counts, then only
the row groups a task needs. What crosses the wire is counted by a TCP proxy in front of MinIO, so the
client is edl's own, unchanged."""

from __future__ import annotations

import io

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from edl.data.dataset import Dataset
from tests.plane import build
from tests.plane.fixtures import built
from tests.plane.s3 import MinioServer
from tests.proxy import TcpProxy

pytestmark = pytest.mark.timeout(180)

ROWS, GROUP_ROWS = 200_000, 10_000


@pytest.fixture(scope="module")
def minio(tmp_path_factory):
    built(build.MINIO, "MinIO")
    server = MinioServer(tmp_path_factory.mktemp("minio")).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def proxied(minio, monkeypatch):
    """edl's S3 settings pointing at MinIO through the counting proxy."""
    proxy = TcpProxy(minio.port)
    for k, v in minio.env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{proxy.port}")
    yield proxy
    proxy.close()


def put_shard(minio, key: str, seed: int) -> tuple[pa.Table, pq.FileMetaData, int]:
    rng = np.random.default_rng(seed)
    t = pa.table({"id": pa.array(np.arange(ROWS) + seed * ROWS, pa.int64()),
                  "x": pa.array(rng.standard_normal(ROWS)), "label": pa.array(rng.integers(0, 10, ROWS))})
    buf = io.BytesIO()
    pq.write_table(t, buf, row_group_size=GROUP_ROWS)
    c = minio.client()
    if not c.bucket_exists("data"):
        c.make_bucket("data")
    c.put_object("data", key, io.BytesIO(buf.getvalue()), len(buf.getvalue()))
    return t, pq.ParquetFile(io.BytesIO(buf.getvalue())).metadata, len(buf.getvalue())


def group_bytes(meta: pq.FileMetaData, group: int) -> int:
    rg = meta.row_group(group)
    return sum(rg.column(i).total_compressed_size for i in range(rg.num_columns))


def test_a_task_is_read_by_ranges_of_its_row_groups_only(minio, proxied):
    t, meta, size = put_shard(minio, "ranged/part-0.parquet", 0)
    t1, _, size1 = put_shard(minio, "ranged/part-1.parquet", 1)
    ds = Dataset("s3://data/ranged")
    shards = ds.shards()  # what the master reads: footers only
    listed = proxied.take()
    assert [(s.name, s.rows) for s in shards] == [("part-0.parquet", ROWS), ("part-1.parquet", ROWS)]
    assert listed < 2 * (64 * 1024 + 8 * 1024), (listed, size + size1)  # a footer read and a HEAD per shard

    rows = ds.rows("part-0.parquet", 25_000, 33_000)  # a task within row groups 2 and 3
    got = proxied.take()
    assert rows.equals(t.slice(25_000, 8_000))
    needed = group_bytes(meta, 2) + group_bytes(meta, 3)
    assert needed <= got < needed + 16 * 1024, (got, needed, size)  # those two groups, and HTTP around them
    assert got < size / 5

    assert ds.rows("part-0.parquet", 30_000, 31_000).equals(t.slice(30_000, 1_000))  # a group read before
    assert proxied.take() == 0

    rows = ds.rows("part-1.parquet", 199_990, 200_000)  # the last rows: the last group only
    got = proxied.take()
    assert rows.equals(t1.slice(199_990, 10)) and group_bytes(meta, 19) <= got < group_bytes(meta, 19) + 16 * 1024


def test_a_missing_or_corrupt_shard_on_s3_is_named(minio, proxied):
    c = minio.client()
    if not c.bucket_exists("data"):
        c.make_bucket("data")
    c.put_object("data", "bad/part-0.parquet", io.BytesIO(b"not parquet at all"), 18)
    from edl.errors import UserError

    with pytest.raises(UserError, match=r"corrupt Parquet shard s3://data/bad/part-0.parquet"):
        Dataset("s3://data/bad").shards()
