"""Where a KFP artifact's files are for edl: the one helper the step (step.py), its small steps
(tasks.py) and the components' bodies share."""

from __future__ import annotations

from edl.errors import UserError


def artifact_uri(uri: str, path: str) -> str:
    """Where a KFP artifact's files are for edl: its object-store URI on a cluster (KFP's
    ``minio://bucket/key`` is S3), else its local path (``kfp.local``)."""
    if uri.startswith("minio://"):
        return "s3://" + uri.removeprefix("minio://")
    if uri.startswith("s3://"):
        return uri
    if "://" in uri and not uri.startswith("file://"):
        raise UserError(f"artifact {uri!r}: only MinIO/S3 (s3://, minio://) and local artifacts are supported")
    return path
