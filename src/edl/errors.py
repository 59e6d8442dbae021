"""The one error hierarchy of edl.

Three kinds, because callers act differently on each:

- ``UserError``: the input is wrong (a flag, a URI, a model definition, a data
  set). Print one line naming the culprit and exit 2; retrying cannot help.
- ``TemporaryError``: the world is briefly unavailable (storage outage, a peer
  that died mid-collective, a master that restarts). Retry, or re-form.
- ``PermanentError``: the job cannot go on (a task that keeps failing, NaN
  loss). Fail the job with the message; exit 1.
"""

from __future__ import annotations


class EdlError(Exception):
    """Base of every error edl raises on purpose."""

    exit_code = 1


class UserError(EdlError):
    """Bad input from the user; the message names the culprit."""

    exit_code = 2


class TemporaryError(EdlError):
    """A transient condition; retrying or re-forming may succeed."""


class PermanentError(EdlError):
    """The job cannot continue."""


class StaleError(TemporaryError):
    """A request was fenced: it names a generation or master that is no longer current."""


class CollectiveError(TemporaryError):
    """A collective operation failed, usually because a peer died."""


class Abandoned(CollectiveError):
    """The loop left a collective that can no longer complete (the master aborted its generation)."""


class StorageError(TemporaryError):
    """An object store could not be reached or refused a request."""


class UserCodeError(EdlError):
    """An exception raised inside the user's model definition (``model()``, ``optimizer()``,
    ``collate()``, the model's forward, ``loss()``, the backward pass, ``metrics()``).

    Not a ``UserError`` by itself: one occurrence may be a fluke. The trainer reports it and the
    master decides (``edl.master.usercode``): the same failure twice at one step is the user's
    (the job fails, exit 2); anything else is relaunched like any crash.
    """

    def __init__(self, model_def: str, part: str, cause: Exception) -> None:
        self.model_def = model_def
        self.part = part  # which of the user's calls raised, in words ("loss()", "the model's forward")
        self.cause = cause
        self.step = 0  # the training step it was computing; 0: before the first (building, warming up)
        self.rows: tuple[tuple[str, int, int], ...] = ()  # that step's batch: (shard, first row, end row)
        super().__init__(f"--model-def {model_def}: {part} raised {self.fingerprint}")

    @property
    def fingerprint(self) -> str:
        """The exception's type and the first line of its message: what repeats when the code is wrong."""
        lines = [ln.strip() for ln in str(self.cause).splitlines() if ln.strip()]
        first = lines[0] if lines else ""
        if len(first) > FIRST_LINE_CHARS:
            first = first[: FIRST_LINE_CHARS - 1].rstrip() + "…"
        return f"{type(self.cause).__name__}: {first}" if first else type(self.cause).__name__


FIRST_LINE_CHARS = 400  # of an exception's first line in a user-code failure (a repr can be huge)


class TaskFailedError(PermanentError):
    """A data task failed more often than the retry limit allows."""


# ------------------------------------------------- the Kubernetes API edge (cluster/kube_api.py)
class KubeRefusedError(PermanentError):
    """The Kubernetes API answered no (a bad object, RBAC, ...); one line naming verb, resource and object."""


class KubeForbiddenError(KubeRefusedError):
    """401/403: the account may not; also what an apiserver answers for a moment after a restart,
    before its RBAC caches are filled."""


class KubeConflictError(KubeRefusedError):
    """409: the object exists already, or a write carried a stale ``resourceVersion``: re-read, then retry."""


class KubeNotFoundError(KubeRefusedError):
    """404: no such object (any more)."""


class KubeExpiredError(KubeRefusedError):
    """410 Gone: the ``resourceVersion`` to list or watch from was compacted away: list again."""


class KubeUnavailableError(TemporaryError):
    """The Kubernetes API could not answer now: unreachable, timed out, throttled (429) or failing (5xx)."""
