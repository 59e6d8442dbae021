"""When an exception in the user's model definition fails the job, decided as a pure function.

A trainer whose user code raised (``edl.errors.UserCodeError``: in ``model()``,
``collate()``, the forward, ``loss()``, ...) reports a ``UserCodeFailure`` and exits.
One report proves nothing (a flaky read in ``collate``, a bit flip): that trainer is
relaunched like any crash and counts towards ``--max-trainer-failures``. The *same*
failure (same exception type and first line) at the *same* step from a second trainer
(a peer of that step, or the replacement that redid it) is the code, not chance: the
job fails as a user error (exit 2) with one line naming ``--model-def``, the part that
raised, the exception's first line and where the full traceback is. So a model that
does not fit its data fails within one relaunch, alone or with peers.

Where nothing can be retried (the data is all consumed: rank 0's final export and
evaluation), the first report fails the job.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from edl.api.master import UserCodeFailure


def _at(step: int) -> str:
    return "before the first step" if step == 0 else f"at step {step}"


@dataclass
class UserCodeFailures:
    """The user-code failures a job's master was told of (its lifetime; a restarted master starts
    afresh, which costs at most one more relaunch)."""

    model_def: str
    seen: list[UserCodeFailure] = field(default_factory=list)

    def judge(self, failure: UserCodeFailure, can_retry: bool = True) -> str | None:
        """Record ``failure``; answers the job's error when it shows the user's code is at fault
        (``None``: relaunch as any crash). A trainer's repeated report counts once."""
        twin = next((s for s in self.seen if s.trainer != failure.trainer and s.step == failure.step
                     and s.part == failure.part and s.fingerprint == failure.fingerprint), None)
        if failure not in self.seen:
            self.seen.append(failure)
        if twin is not None:
            return (f"--model-def {self.model_def}: {failure.part} raised {failure.fingerprint} "
                    f"(trainers {twin.trainer} and {failure.trainer}, {_at(failure.step)}; "
                    f"full traceback in the trainer's log: {failure.log})")
        if not can_retry:
            return (f"--model-def {self.model_def}: {failure.part} raised {failure.fingerprint} "
                    f"(trainer {failure.trainer}, {_at(failure.step)}, after the last step; "
                    f"full traceback in the trainer's log: {failure.log})")
        return None
