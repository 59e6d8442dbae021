"""When an exception in the user's model definition fails the job, decided as a pure function.

A trainer whose user code raised (``edl.errors.UserCodeError``: in ``model()``,
``collate()``, the forward, ``loss()``, ...) reports a ``UserCodeFailure`` and exits.
One report proves nothing (a flaky read in ``collate``, a bit flip): that trainer is
relaunched like any crash and counts towards ``--max-trainer-failures``. The *same*
failure (same part, exception type and first line) from a second trainer at the *same*
step or on the *same rows* (a peer of that step, or the replacement that redid it: a
rollback may batch the rows one step apart) is the code, not chance: the job fails as
a user error (exit 2) with one line naming ``--model-def``, the part that raised, the
exception's first line and where the full traceback is. So a model that does not fit
its data fails within one relaunch, alone or with peers.

Where nothing can be retried (the data is all consumed: rank 0's final export and
evaluation), the first report fails the job.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from edl.api.master import UserCodeFailure


def _at(step: int) -> str:
    return "before the first step" if step == 0 else f"at step {step}"


def _same_place(a: UserCodeFailure, b: UserCodeFailure) -> bool:
    """The same step, or batches sharing a row."""
    return a.step == b.step or any(sa == sb and a0 < b1 and b0 < a1 for sa, a0, a1 in a.rows for sb, b0, b1 in b.rows)


def _where(a: UserCodeFailure, b: UserCodeFailure) -> str:
    return _at(b.step) if a.step == b.step else f"at steps {a.step} and {b.step}, on the same rows"


@dataclass
class UserCodeFailures:
    """The user-code failures a job's master was told of (its lifetime; a restarted master starts
    afresh, which costs at most one more relaunch)."""

    model_def: str
    seen: list[UserCodeFailure] = field(default_factory=list)

    def judge(self, failure: UserCodeFailure, can_retry: bool = True) -> str | None:
        """Record ``failure``; answers the job's error when it shows the user's code is at fault
        (``None``: relaunch as any crash). A trainer's repeated report counts once."""
        twin = next((s for s in self.seen if s.trainer != failure.trainer and s.part == failure.part
                     and s.fingerprint == failure.fingerprint and _same_place(s, failure)), None)
        if failure not in self.seen:
            self.seen.append(failure)
        if twin is not None:
            return (f"--model-def {self.model_def}: {failure.part} raised {failure.fingerprint} "
                    f"(trainers {twin.trainer} and {failure.trainer}, {_where(twin, failure)}; "
                    f"full traceback in the trainer's log: {failure.log})")
        if not can_retry:
            return (f"--model-def {self.model_def}: {failure.part} raised {failure.fingerprint} "
                    f"(trainer {failure.trainer}, {_at(failure.step)}, after the last step; "
                    f"full traceback in the trainer's log: {failure.log})")
        return None
