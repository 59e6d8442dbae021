"""The training loop's decisions, as pure functions: how a generation starts, what a step ends in.

Every rank decides the end of a step from the same summed slots (``StepSums``), so
all ranks agree, without another message, on whether the generation goes on, stops
at this step or finishes the job. Only rank 0's duties (the first-step report,
checkpoints, the job's end) differ between ranks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum

from edl.api.master import Source
from edl.trainer.slots import StepSums


# ------------------------------------------------------------------ a generation's start
@dataclass(frozen=True)
class StartPlan:
    """How a trainer takes its place in a new generation, before rank 0's state is broadcast."""

    keep_data: bool  # adopt the master's view of the tasks held (else drop them and ask afresh)
    rebuild: bool  # rolled back: drop what this replica learned since (optimizer included)
    load_checkpoint: bool  # rank 0 loads the committed checkpoint (its step comes from there)
    step: int | None  # the step to start from (None: keep the replica's own, or the checkpoint's)


def plan_start(source: Source, rank: int, base_step: int, trained: bool) -> StartPlan:
    """``trained``: this replica stepped since it was built or loaded."""
    peer = source is Source.PEER
    load = source is Source.CHECKPOINT and rank == 0
    return StartPlan(keep_data=peer, rebuild=not peer and trained, load_checkpoint=load,
                     step=None if peer or load else base_step)


# ------------------------------------------------------------------ a step's end
class Then(Enum):
    """What the generation does after a step (the same on every rank)."""

    CONTINUE = "continue"  # take the next batch
    STOP = "stop"  # end the generation here: report the step to the master and wait for the next one
    SWITCH = "switch"  # every rank is ready for the prepared generation: report the step and go on in it
    FINISH = "finish"  # every rank is out of data: training is done
    ABORT = "abort"  # the loss is not finite: the job fails


class CheckpointWhy(Enum):
    INTERVAL = "interval"  # the checkpoint interval has passed
    REQUESTED = "requested"  # the master asked for one (the launcher's last checkpoint, a CLI request)


@dataclass(frozen=True)
class StepContext:
    """What a rank knows about a completed step besides its sums."""

    rank: int
    step: int  # the last step before this one
    first_step_pending: bool  # the generation's first training step has not been reported yet
    since_checkpoint_s: float  # since rank 0 last took a checkpoint
    checkpoint_interval_s: float
    checkpoint_requested: bool  # the master's heartbeat asked for a checkpoint


@dataclass(frozen=True)
class StepDecision:
    then: Then
    update: bool  # someone had data: apply the summed gradients, count the step
    mean_loss: float | None  # with ``update``: the step's mean training loss
    report_first_step: bool  # rank 0: tell the master the generation's pause is over
    checkpoint: CheckpointWhy | None  # rank 0: snapshot the model at this step
    idle: bool  # nobody had data: pause a little before the next round
    lead: bool  # this rank tells the master how the job ends (rank 0, with FINISH or ABORT)
    error: str | None = None  # with ABORT: why


def decide_step(sums: StepSums, ctx: StepContext) -> StepDecision:
    rank0 = ctx.rank == 0
    update = sums.samples > 0
    if update and not math.isfinite(sums.loss_sum):
        return StepDecision(Then.ABORT, update=False, mean_loss=None, report_first_step=False, checkpoint=None,
                            idle=False, lead=rank0,
                            error=f"loss is {sums.loss_sum} at step {ctx.step + 1}; stopping the job")
    checkpoint = None
    if rank0 and ctx.since_checkpoint_s >= ctx.checkpoint_interval_s:
        checkpoint = CheckpointWhy.INTERVAL
    elif rank0 and ctx.checkpoint_requested:
        checkpoint = CheckpointWhy.REQUESTED
    # A stop (the master restarted, a change it could not prepare, the job's end) wins over a switch.
    then = (Then.FINISH if sums.finished else Then.STOP if sums.stop else Then.SWITCH if sums.switch_to
            else Then.CONTINUE)
    return StepDecision(
        then,
        update=update,
        mean_loss=sums.loss_sum / sums.samples if update else None,
        report_first_step=rank0 and ctx.first_step_pending and (update or sums.finished),
        checkpoint=checkpoint,
        idle=not update,
        lead=rank0 and then is Then.FINISH,
    )
