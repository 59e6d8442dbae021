"""Failure budgets that forgive progress: a crash loop fails the job fast, a long life of ordinary
disruptions (preemptions, drains, spot reclaims, evictions) never does.

A budget counts the failures of one kind (the master's restarts, the trainers' failures) since the
job last made progress. Training steps committed since the previous failure (``refund_steps``),
or time since it (``forget_after_s``, as Kubernetes forgets a container's back-off after ten
minutes of running), refund what was spent. The job fails only when more than ``limit`` failures
come with no progress between them: the same crash at the same step, a master that dies at
start-up. Failures in a row without progress wait a doubling back-off before the next restart.

Pure: the caller passes the clock's time and the job's step; a charge returns a new budget.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from edl.api.master import BudgetView


@dataclass(frozen=True)
class BudgetPolicy:
    limit: int  # failures in a row without progress that the job survives; one more fails it
    refund_steps: int = 1  # steps committed since the previous failure that refund the budget
    forget_after_s: float = 600.0  # time since the previous failure that refunds it too
    backoff_start_s: float = 0.5  # the wait before the second restart in a row without progress
    backoff_max_s: float = 4.0  # and the longest: a master dying at start still fails within a minute


@dataclass(frozen=True)
class Budget:
    """What one kind of failure has spent: ``spent`` since the last progress, ``total`` over the job's
    life, ``refunded`` the failures that progress or time forgave."""

    policy: BudgetPolicy
    spent: int = 0
    total: int = 0
    refunded: int = 0
    last_step: int = 0  # the job's step at the last failure
    last_at: float | None = None  # the clock's time of the last failure

    def charge(self, now: float, step: int) -> Budget:
        """One more failure at time ``now``, the job at ``step`` (the highest step it has reached)."""
        settled = self.settled(now, step)
        return replace(settled, spent=settled.spent + 1, total=self.total + 1, last_step=step, last_at=now)

    def settled(self, now: float, step: int) -> Budget:
        """The budget with what progress (the job at ``step``) or time has forgiven by ``now`` refunded: what
        it shows, and what a launcher that adopts the job carries on."""
        if self.spent and self.last_at is not None and (step - self.last_step >= self.policy.refund_steps
                                                        or now - self.last_at >= self.policy.forget_after_s):
            return replace(self, spent=0, refunded=self.refunded + self.spent)
        return self

    @property
    def exhausted(self) -> bool:
        return self.spent > self.policy.limit

    def backoff_s(self) -> float:
        """How long to wait before acting on the latest failure: nothing after progress, then doubling."""
        if self.spent <= 1:
            return 0.0
        return min(self.policy.backoff_max_s, self.policy.backoff_start_s * 2 ** (self.spent - 2))

    def view(self) -> BudgetView:
        return BudgetView(self.spent, self.policy.limit, self.total, self.refunded)

    def carried_on(self, seen: BudgetView, step: int, now: float) -> Budget:
        """This budget as a launcher before this one left it (``seen``: its last beat, from the master's
        status), the job then at ``step``: what it spent without progress still counts."""
        return replace(self, spent=seen.spent, total=seen.total, refunded=seen.refunded, last_step=step,
                       last_at=now if seen.spent else None)

    def describe(self) -> str:
        """``3 of 10 without progress (12 in all, 9 forgiven)``."""
        return self.view().describe()

    def to_json(self) -> dict:
        return {"spent": self.spent, "limit": self.policy.limit, "total": self.total, "refunded": self.refunded,
                "refund_steps": self.policy.refund_steps, "forget_after_s": self.policy.forget_after_s}
