"""Object stores behind one small interface: ``file://`` (and plain paths) and ``s3://``.

S3 goes through the ``minio`` client, configured the way MinIO's and KFP's own
tooling are: ``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``
(and optionally ``AWS_REGION``) from the environment, never from arguments.
Transient failures are retried with backoff by ``tenacity``; what is left over
surfaces as ``StorageError``.
"""

from __future__ import annotations

import builtins
import fcntl
import hashlib
import io
import os
import tempfile
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, BinaryIO, Callable
from urllib.parse import urlparse

import logging

from tenacity import before_sleep_log, retry, retry_if_exception_type, stop_after_attempt, stop_after_delay, wait_exponential

from edl.errors import StorageError, UserError

log = logging.getLogger("edl.storage")


class ObjectStore(ABC):
    """Keys are '/'-separated paths relative to the store's root URI."""

    def __init__(self, uri: str) -> None:
        self.uri = uri.rstrip("/")

    def child(self, key: str) -> str:
        return f"{self.uri}/{key.lstrip('/')}"

    @abstractmethod
    def put(self, key: str, data: bytes) -> None: ...

    def put_once(self, key: str, data: bytes) -> None:
        """``put`` in one attempt: ``StorageError`` at once when the store cannot take it now (no
        retrying through an outage), for a caller with somewhere else to put the object meanwhile."""
        self.put(key, data)

    @abstractmethod
    def get(self, key: str) -> bytes: ...

    @abstractmethod
    def list(self, prefix: str = "") -> list[str]:
        """Every key that starts with ``prefix`` (a string prefix, as S3 has it: ``a/`` lists the
        folder ``a``, ``ckpt-`` every key whose name starts so), recursively, sorted."""

    @abstractmethod
    def delete(self, keys: builtins.list[str]) -> None: ...

    @abstractmethod
    def exists(self, key: str) -> bool: ...

    @abstractmethod
    def check(self) -> None:
        """Raise ``StorageError`` (or ``UserError``) if the store cannot be used."""

    @abstractmethod
    def get_versioned(self, key: str) -> tuple[bytes, str] | None:
        """The object and its version (an ETag), or ``None`` if there is none."""

    @abstractmethod
    def put_if(self, key: str, data: bytes, version: str | None) -> str | None:
        """Write only if the object is absent (``version`` ``None``) or still at ``version``: the new
        version, or ``None`` when the condition failed (another writer got there first)."""

    @abstractmethod
    def open_ranged(self, key: str, size: int | None = None) -> BinaryIO:
        """``key`` as a read-only, seekable file that reads only the bytes asked for (a local file, or
        ranged GETs of the object): a Parquet reader takes the footer and the row groups it needs.
        ``size``: the object's, known from an earlier open (saves asking the store again)."""


class FileStore(ObjectStore):
    """A directory. ``prune``: remove the folders a delete leaves empty (not where several processes
    write and delete in the same folders at once: one's removal would pull a folder from under another's
    write)."""

    def __init__(self, uri: str, root: Path, prune: bool = True) -> None:
        super().__init__(uri)
        self.root = root
        self.prune = prune

    def _path(self, key: str) -> Path:
        return self.root / key

    def put(self, key: str, data: bytes) -> None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        # Write-then-rename so that a reader never sees half a file.
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def get(self, key: str) -> bytes:
        try:
            return self._path(key).read_bytes()
        except FileNotFoundError as e:
            raise StorageError(f"{self.child(key)} does not exist") from e

    def list(self, prefix: str = "") -> list[str]:
        folder, _, stem = prefix.rpartition("/")
        base = self._path(folder) if folder else self.root
        if not base.is_dir():
            return []
        found: list[Path] = []
        for entry in base.iterdir():  # only the entries the prefix names: never a walk of the whole store
            if entry.name.startswith(stem):
                found.extend(entry.rglob("*") if entry.is_dir() else (entry,))
        return sorted(str(p.relative_to(self.root)).replace(os.sep, "/") for p in found
                      if p.is_file() and not p.name.startswith(".tmp-"))

    def delete(self, keys: builtins.list[str]) -> None:
        for k in keys:
            self._path(k).unlink(missing_ok=True)
        if not self.prune:
            return
        # Remove directories left empty.
        for k in keys:
            parent = self._path(k).parent
            while parent != self.root and parent.exists() and not any(parent.iterdir()):
                parent.rmdir()
                parent = parent.parent

    def exists(self, key: str) -> bool:
        return self._path(key).exists()

    def open_ranged(self, key: str, size: int | None = None) -> BinaryIO:
        try:
            return self._path(key).open("rb")
        except FileNotFoundError as e:
            raise StorageError(f"{self.child(key)} does not exist") from e

    def check(self) -> None:
        if self.root.exists() and not self.root.is_dir():
            raise UserError(f"{self.uri} is a file, not a directory")
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise UserError(f"cannot create {self.uri}: {e.strerror}") from e
        if not os.access(self.root, os.W_OK):
            raise UserError(f"{self.uri} is not writable")

    def get_versioned(self, key: str) -> tuple[bytes, str] | None:
        try:
            data = self._path(key).read_bytes()
        except FileNotFoundError:
            return None
        return data, hashlib.sha256(data).hexdigest()

    def put_if(self, key: str, data: bytes, version: str | None) -> str | None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        # Compare-and-swap under an exclusive flock on the directory: every conditional writer of
        # this directory takes it, and the write itself is write-then-rename.
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            found = self.get_versioned(key)
            if (found[1] if found else None) != version:
                return None
            self.put(key, data)
            return hashlib.sha256(data).hexdigest()
        finally:
            os.close(fd)  # releases the flock


def _transient(fn):
    """Retry transient storage failures with exponential backoff (bounded). The wait is capped at 1 s:
    a trainer's step waits on some of these calls (its audit record, its task's rows), and a store that is
    back should be seen within a second, not after a back-off of several."""
    return retry(
        retry=retry_if_exception_type(StorageError),
        wait=wait_exponential(multiplier=0.2, max=1),
        stop=stop_after_delay(float(os.environ.get("EDL_STORAGE_RETRY_S", "60"))) | stop_after_attempt(100),
        before_sleep=before_sleep_log(log, logging.WARNING),
        reraise=True,
    )(fn)


class RangedObject(io.RawIOBase):
    """One object as a read-only, seekable file: each read is one ranged GET of just the bytes asked
    for (``read_range(offset, length)``), so nothing is copied to disk and nothing read but what the
    reader asks for. Safe for one reader at a time; pyarrow serialises the reads of a Python file."""

    def __init__(self, name: str, size: int, read_range: Callable[[int, int], bytes]) -> None:
        super().__init__()
        self.name = name
        self._size = size
        self._read_range = read_range
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def size(self) -> int:
        return self._size

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        if base + offset < 0:
            raise ValueError(f"negative seek position {base + offset}")
        self._pos = base + offset
        return self._pos

    def readinto(self, buffer) -> int:
        n = min(len(buffer), self._size - self._pos)
        if n <= 0:
            return 0
        data = self._read_range(self._pos, n)
        if len(data) != n:
            raise StorageError(f"{self.name}: asked for {n} bytes at {self._pos}, got {len(data)}")
        memoryview(buffer)[:n] = data
        self._pos += n
        return n


class S3Store(ObjectStore):
    def __init__(self, uri: str, bucket: str, prefix: str) -> None:
        super().__init__(uri)
        import urllib3
        from minio import Minio

        endpoint = os.environ.get("AWS_ENDPOINT_URL") or os.environ.get("AWS_ENDPOINT_URL_S3")
        if not endpoint:
            raise UserError(f"{uri}: set AWS_ENDPOINT_URL to the S3/MinIO endpoint (e.g. http://minio:9000)")
        parsed = urlparse(endpoint)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise UserError(f"AWS_ENDPOINT_URL {endpoint!r} must look like http://host:port")
        access = os.environ.get("AWS_ACCESS_KEY_ID")
        secret = os.environ.get("AWS_SECRET_ACCESS_KEY")
        if not access or not secret:
            raise UserError(f"{uri}: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY")
        self.endpoint = endpoint
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        # No retries inside urllib3: tenacity owns retrying, so the policy lives in one place.
        http = urllib3.PoolManager(
            timeout=urllib3.Timeout(connect=3.0, read=30.0), retries=False, maxsize=8
        )
        self.client = Minio(
            parsed.netloc,
            access_key=access,
            secret_key=secret,
            secure=parsed.scheme == "https",
            region=os.environ.get("AWS_REGION", "us-east-1"),
            http_client=http,
        )

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def _call(self, what: str, fn):
        from minio.error import S3Error

        try:
            return fn()
        except S3Error as e:
            if e.code in ("NoSuchKey", "NoSuchBucket"):
                raise FileNotFoundError(what) from e
            if e.code in ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch"):
                raise UserError(f"S3 refused {what}: {e.code} (check AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY)") from e
            raise StorageError(f"S3 error on {what}: {e.code}") from e
        except (UserError, FileNotFoundError):
            raise
        except Exception as e:  # noqa: BLE001 - urllib3's connection errors and friends, mapped below
            reason = _connection_failure(e)
            if reason is None:  # not the network: the request itself (the URI was checked by open_store)
                raise StorageError(f"S3 request for {what} failed: {type(e).__name__}: {e}") from e
            raise StorageError(f"cannot reach S3 endpoint {self.endpoint} for {what}: {reason}") from e

    def put_once(self, key: str, data: bytes) -> None:
        self._call(
            self.child(key),
            lambda: self.client.put_object(self.bucket, self._key(key), io.BytesIO(data), len(data)),
        )

    @_transient
    def put(self, key: str, data: bytes) -> None:
        self.put_once(key, data)

    def _read(self, key: str, offset: int = 0, length: int = 0) -> bytes:
        """The object's bytes (``offset``/``length``: a ranged GET), the connection released either way."""
        resp = self.client.get_object(self.bucket, self._key(key), offset=offset, length=length)
        try:
            return resp.read()
        finally:
            resp.close()
            resp.release_conn()

    @_transient
    def _get(self, key: str) -> bytes:
        return self._call(self.child(key), lambda: self._read(key))

    def get(self, key: str) -> bytes:
        try:
            return self._get(key)
        except FileNotFoundError as e:
            raise StorageError(f"{self.child(key)} does not exist") from e

    @_transient
    def _size(self, key: str) -> int:
        return self._call(self.child(key), lambda: self.client.stat_object(self.bucket, self._key(key)).size)

    @_transient
    def _get_range(self, key: str, offset: int, length: int) -> bytes:
        return self._call(self.child(key), lambda: self._read(key, offset=offset, length=length))

    def open_ranged(self, key: str, size: int | None = None) -> BinaryIO:
        if size is None:
            try:
                size = self._size(key)
            except FileNotFoundError as e:
                raise StorageError(f"{self.child(key)} does not exist") from e

        def read_range(offset: int, length: int) -> bytes:
            try:
                return self._get_range(key, offset, length)
            except FileNotFoundError as e:  # replaced or deleted since
                raise StorageError(f"{self.child(key)} does not exist") from e

        return RangedObject(self.child(key), size, read_range)  # type: ignore[return-value]

    @_transient
    def list(self, prefix: str = "") -> list[str]:
        full = self._key(prefix)
        cut = len(self.prefix) + 1 if self.prefix else 0

        def run() -> list[str]:
            try:
                objs = self.client.list_objects(self.bucket, prefix=full, recursive=True)
                return sorted(o.object_name[cut:] for o in objs)
            except Exception as e:  # noqa: BLE001 - mapped below
                if getattr(e, "code", None) == "NoSuchBucket":
                    return []
                raise

        return self._call(f"listing {self.child(prefix)}", run)

    @_transient
    def delete(self, keys: builtins.list[str]) -> None:
        for k in keys:
            self._call(self.child(k), lambda k=k: self.client.remove_object(self.bucket, self._key(k)))

    @_transient
    def exists(self, key: str) -> bool:
        try:
            self._call(self.child(key), lambda: self.client.stat_object(self.bucket, self._key(key)))
            return True
        except FileNotFoundError:
            return False

    @_transient
    def get_versioned(self, key: str) -> tuple[bytes, str] | None:
        def fetch() -> tuple[bytes, str]:
            resp = self.client.get_object(self.bucket, self._key(key))
            try:
                return resp.read(), resp.headers.get("etag", "").strip('"')
            finally:
                resp.close()
                resp.release_conn()

        try:
            return self._call(self.child(key), fetch)
        except FileNotFoundError:
            return None

    @_transient
    def put_if(self, key: str, data: bytes, version: str | None) -> str | None:
        from minio.error import S3Error

        # S3 conditional writes (If-None-Match: * to create, If-Match to replace), which S3 and MinIO
        # honour. minio-py's put_object turns extra headers into x-amz-meta-*, so this goes through
        # its PutObject call underneath, which sends headers as they are.
        condition: dict[str, Any] = {"If-None-Match": "*"} if version is None else {"If-Match": f'"{version}"'}

        def write() -> str | None:
            try:
                return self.client._put_object(self.bucket, self._key(key), data, headers=condition).etag
            except S3Error as e:
                if e.code in ("PreconditionFailed", "ConditionalRequestConflict", "NoSuchKey"):
                    return None  # another writer got there first
                raise

        return self._call(self.child(key), write)

    def check(self) -> None:
        """Reach the endpoint once (a few quick retries), create the bucket if missing."""

        @retry(
            retry=retry_if_exception_type(StorageError),
            wait=wait_exponential(multiplier=0.2, max=1),
            stop=stop_after_attempt(3),
            reraise=True,
        )
        def probe() -> None:
            if not self._call(f"bucket {self.bucket}", lambda: self.client.bucket_exists(self.bucket)):
                self._call(f"bucket {self.bucket}", lambda: self.client.make_bucket(self.bucket))

        probe()


def _connection_failure(e: BaseException) -> str | None:
    """Why the endpoint could not be reached (``connection refused``, a timeout), or ``None`` when
    ``e`` is not a connection failure. urllib3 wraps the socket's error: the first ``OSError`` with
    a ``strerror`` in the chain says it in the system's words."""
    import urllib3.exceptions

    if not isinstance(e, (OSError, urllib3.exceptions.HTTPError)):
        return None
    seen: BaseException | None = e
    while seen is not None:
        if isinstance(seen, OSError) and seen.strerror:
            return seen.strerror
        seen = seen.__cause__ or seen.__context__ or getattr(seen, "reason", None)
    return type(e).__name__


def s3_uri_problem(uri: str) -> str | None:
    """What is wrong with the ``s3://BUCKET/prefix`` URI ``uri``, or ``None``. The bucket name is held
    to S3's rules by minio's own check (the strict one a new bucket must pass): a name S3 refuses
    would otherwise only fail later, inside a request, looking like an unreachable endpoint."""
    from minio.helpers import check_bucket_name

    parsed = urlparse(uri)
    bucket = parsed.netloc
    if not bucket:
        return "names no bucket (s3://BUCKET/prefix)"
    try:
        check_bucket_name(bucket, strict=True)
    except ValueError as e:
        if not 3 <= len(bucket) <= 63:
            why = f"it has {len(bucket)} characters, S3 allows 3 to 63"
        elif str(e).startswith("invalid bucket name"):  # minio's words for a character S3 does not allow
            why = "S3 allows lowercase letters, digits, '.' and '-', starting and ending with a letter or digit"
        else:  # its own reason: an IP address, '..', a reserved prefix or suffix
            why = str(e).replace(f"bucket name {bucket} ", "")
        return f"bucket name {bucket!r} is not allowed by S3: {why}"
    if parsed.query or parsed.fragment or parsed.params:
        return "an S3 URI here is s3://BUCKET/prefix, without '?', '#' or ';'"
    return None


def open_store(uri: str, what: str = "URI") -> ObjectStore:
    """Open the store for ``uri``; a bad URI is a ``UserError`` naming ``what``."""
    if not uri:
        raise UserError(f"{what} is empty")
    parsed = urlparse(uri)
    scheme = parsed.scheme
    if scheme == "" or (len(scheme) == 1 and os.name == "nt"):
        path = Path(uri).expanduser().resolve()
        return FileStore(path.as_uri(), path)
    if scheme == "file":
        if parsed.netloc not in ("", "localhost"):
            raise UserError(f"{what} {uri!r}: file URIs take an absolute path, e.g. file:///data/x")
        path = Path(parsed.path)
        return FileStore(f"file://{parsed.path.rstrip('/')}", path)
    if scheme == "s3":
        problem = s3_uri_problem(uri)
        if problem is not None:
            raise UserError(f"{what} {uri!r}: {problem}")
        return S3Store(uri, parsed.netloc, parsed.path)
    raise UserError(f"{what} {uri!r} has unknown URI scheme {scheme!r}; use one of: file://, s3://, or a path")

