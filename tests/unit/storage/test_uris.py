"""A bad store URI is one line saying what is wrong with it; an endpoint that cannot be reached is
another, saying that. (``s3://ck/x`` was once reported as "cannot reach S3 endpoint ...: ValueError":
minio refused the two-letter bucket name inside the first request.)"""

from __future__ import annotations

import pytest

from edl.errors import StorageError, UserError
from edl.storage.store import open_store


@pytest.fixture
def s3_env(monkeypatch):
    """An endpoint nothing listens on (port 9, discard): any request that gets out is refused."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "k")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s")
    monkeypatch.setenv("EDL_STORAGE_RETRY_S", "0.5")


@pytest.mark.parametrize("uri, says", [
    ("s3://ck/x", "bucket name 'ck' is not allowed by S3: it has 2 characters, S3 allows 3 to 63"),
    ("s3://" + "b" * 64 + "/x", "it has 64 characters, S3 allows 3 to 63"),
    ("s3://My_Bucket/x", "bucket name 'My_Bucket' is not allowed by S3: S3 allows lowercase letters, digits"),
    ("s3://10.0.0.1/x", "bucket name '10.0.0.1' is not allowed by S3: must not be formatted as an IP address"),
    ("s3://a..b/x", "contains invalid successive characters"),
    ("s3:///x", "names no bucket"),
    ("s3://bucket/x?versionId=1", "without '?', '#' or ';'"),
    ("gs://bucket/x", "has unknown URI scheme 'gs'"),
    ("file://host/x", "file URIs take an absolute path"),
])
def test_a_bad_uri_says_what_is_wrong_with_it(uri, says, s3_env):
    with pytest.raises(UserError) as e:
        open_store(uri, "--checkpoint-uri").check()
    assert str(e.value).startswith(f"--checkpoint-uri {uri!r}") and says in str(e.value), e.value
    assert "cannot reach" not in str(e.value)


def test_a_bad_bucket_name_is_refused_without_an_endpoint_set(monkeypatch):
    """The URI is wrong whatever the environment: that is said first."""
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    with pytest.raises(UserError, match="bucket name 'ck' is not allowed"):
        open_store("s3://ck/x", "--data")


def test_an_unreachable_endpoint_says_so_with_the_reason(s3_env):
    with pytest.raises(StorageError) as e:
        open_store("s3://bucket/x", "--checkpoint-uri").check()
    assert str(e.value) == "cannot reach S3 endpoint http://127.0.0.1:9 for bucket bucket: Connection refused"
