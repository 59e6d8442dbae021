"""``edl train``, ``edl status`` and ``edl scale``: a job of local processes, and looking at it."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

from edl.errors import TemporaryError, UserError
from edl.jobargs import FLAG_NAMES, add_job_arguments

if TYPE_CHECKING:
    from edl.api.master import JobView
    from edl.console import Console


# The flags that only ``edl train`` has, by the field they set.
TRAIN_FLAGS = FLAG_NAMES.with_names(autoscale_slots="--autoscale-slots", capacity_schedule="--capacity-schedule")


def cmd_train(a: argparse.Namespace) -> int:
    from edl.api.spec import launcher_problems, local_autoscale_problems
    from edl.jobargs import spec_from_args
    from edl.launcher.local import LocalLauncher

    spec = spec_from_args(a)
    TRAIN_FLAGS.check(local_autoscale_problems(a.autoscale_slots, a.capacity_schedule, a.sidecar_period,
                                               spec.min_trainers), launcher_problems(a.max_trainer_failures))
    autoscale = None
    if a.autoscale_slots is not None:
        from edl.autoscale.local_view import CapacitySchedule
        from edl.launcher.local import LocalAutoscale

        autoscale = LocalAutoscale(a.autoscale_slots, CapacitySchedule.parse(a.capacity_schedule), a.sidecar_period)
    return LocalLauncher(spec, Path(a.summary_out) if a.summary_out else None, a.max_trainer_failures,
                         autoscale=autoscale).run()


def _not_running(job: str) -> UserError:
    return UserError(f"job {job!r} is not running (its master does not answer)")


def cmd_status(a: argparse.Namespace) -> int:
    from edl.launcher.local import local_job_master

    st = local_job_master(a.job).status()
    if st is None:
        raise _not_running(a.job)
    if a.json:
        print(json.dumps(st.to_json(), indent=2))
        return 0
    from edl.console import plain_console

    show_status(plain_console(), st)
    return 0


def show_status(console: Console, st: JobView) -> None:
    """``edl status``: one line about the job, a table of its trainers, then its last change (what began it,
    and where its time went), its failure budgets and why it is at its size."""
    from edl.console import add_row, say, table

    say(console, (st.job, "bold"), f" {st.status.value} · phase {st.phase.value} · generation {st.generation} · "
        f"{st.world_size} trainers (desired {st.desired_trainers}, {st.min_trainers}..{st.max_trainers}) · "
        f"epoch {st.epoch + 1}/{st.epochs} · step {st.step}")
    t = table("trainer", "rank", "pid", "state", "step")
    for tr in st.trainers:
        add_row(t, tr.id, str(tr.rank), str(tr.pid), tr.state.value, str(tr.step))
    console.print(t)
    if st.generations:
        say(console, "last change: ", st.generations[-1].describe())
    for kind, budget in st.budgets.items():
        say(console, f"{kind.replace('_', ' ')}: ", budget.describe())
    say(console, "reason: ", st.reason.text if st.reason is not None else
        "none given yet (no autoscaler runs for this job, or it has not decided)")


def cmd_scale(a: argparse.Namespace) -> int:
    from edl.launcher.local import local_job_master

    try:
        desired = local_job_master(a.job).scale(a.trainers)
    except TemporaryError as e:
        raise _not_running(a.job) from e
    print(f"job {a.job}: desired trainers set to {desired}")
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """The ``train``, ``status`` and ``scale`` commands."""
    t = sub.add_parser("train", help="run an elastic training job on this machine",
                       description="Run master and trainers as local processes until the job is done. "
                                   "Running the same command again resumes from the newest checkpoint.")
    add_job_arguments(t)
    t.add_argument("--summary-out", default=None, help="write the run summary (JSON) to this file")
    t.add_argument("--max-trainer-failures", type=int, default=5,
                   help="fail the job when trainers crash more than this many times with no training step "
                        "between the crashes: a step committed since the last crash, or 10 minutes since it, "
                        "forgives the earlier ones; 0: at the first crash (default 5)")
    t.add_argument("--autoscale-slots", type=int, default=None,
                   help="run the autoscale sidecar locally: this machine holds this many trainers (default: off)")
    t.add_argument("--capacity-schedule", default="",
                   help="other tenants taking slots over time, TIME:SLOTS pairs, e.g. 0:0,30:2,60:1 "
                        "(with --autoscale-slots)")
    t.add_argument("--sidecar-period", type=float, default=2.0,
                   help="seconds between the local sidecar's decisions, positive (default 2)")
    t.set_defaults(fn=cmd_train)

    s = sub.add_parser("status", help="show a running job", description="Show a running local job's state.")
    s.add_argument("job", help="job name")
    s.add_argument("--json", action="store_true", help="print the full status as JSON")
    s.set_defaults(fn=cmd_status)

    sc = sub.add_parser("scale", help="change a running job's desired trainer count",
                        description="Set the desired trainer count; refused outside the job's min..max.")
    sc.add_argument("job", help="job name")
    sc.add_argument("--trainers", type=int, required=True, help="the new desired trainer count")
    sc.set_defaults(fn=cmd_scale)
