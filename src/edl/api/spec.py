"""The training job's spec: everything that defines a job, the same on every (re)start.

It travels from ``edl train``/``edl launch``/the KFP step to the master (as JSON in its
argv) and on to every trainer (in the master's ``/v1/spec``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from edl.errors import UserError


@dataclass
class JobSpec:
    """Everything that defines a training job; the same on every (re)start."""

    job: str
    model_def: str
    data: str
    epochs: int
    batch_size: int
    min_trainers: int
    max_trainers: int
    trainers: int
    checkpoint_uri: str
    eval_data: str | None = None
    learning_rate: float = 0.01
    rows_per_task: int = 0  # 0: derived from the batch size
    checkpoint_interval_s: float = 30.0
    keep_checkpoints: int = 3
    max_task_failures: int = 3
    seed: int = 0
    audit: bool = False
    init_model: str | None = None  # warm start: a model directory with params.npz (a previous run's model)

    def validate(self) -> None:
        if not self.job or not all(c.isalnum() or c in "-_." for c in self.job):
            raise UserError(f"--job-name {self.job!r}: use letters, digits, '-', '_' and '.'")
        if self.epochs < 1:
            raise UserError(f"--epochs must be at least 1 (got {self.epochs})")
        if self.batch_size < 1:
            raise UserError(f"--batch-size must be at least 1 (got {self.batch_size})")
        if self.min_trainers < 1:
            raise UserError(f"--min-trainers must be at least 1 (got {self.min_trainers})")
        if self.min_trainers > self.max_trainers:
            raise UserError(
                f"--min-trainers {self.min_trainers} is greater than --max-trainers {self.max_trainers}"
            )
        if not self.min_trainers <= self.trainers <= self.max_trainers:
            raise UserError(
                f"--trainers {self.trainers} is outside --min-trainers..--max-trainers "
                f"({self.min_trainers}..{self.max_trainers})"
            )
        if self.learning_rate <= 0:
            raise UserError(f"--learning-rate must be positive (got {self.learning_rate})")
        if self.keep_checkpoints < 1:
            raise UserError(f"--keep-checkpoints must be at least 1 (got {self.keep_checkpoints})")

    @property
    def task_rows(self) -> int:
        return self.rows_per_task or self.batch_size * 4

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
