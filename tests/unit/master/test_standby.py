"""When a spare master (``edl master --standby``) gives up waiting to be woken. Pure, over a real ``Job``'s view."""

from __future__ import annotations

from edl.api.data import Shard
from edl.api.spec import JobSpec
from edl.master.job import Job
from edl.master.main import standby_done

SPEC = JobSpec(job="spare", model_def="m", data="d", epochs=1, batch_size=4, min_trainers=1, max_trainers=2,
               trainers=1, checkpoint_uri="/tmp/x", launcher_timeout_s=30.0)


def job() -> Job:
    return Job(SPEC, [Shard("a.parquet", 40)], master_uid="1", now=0.0)


def test_a_spare_waits_while_its_job_runs_and_while_its_master_is_briefly_away():
    assert not standby_done(job().status_view(1.0), 0.0, SPEC.launcher_timeout_s)
    assert not standby_done(None, 59.0, SPEC.launcher_timeout_s)  # a master restarting, or starting slowly


def test_a_spare_gives_up_when_the_job_is_over_abandoned_or_its_launcher_is_gone():
    done = job()
    done.finish(10, None, {}, now=2.0)
    assert standby_done(done.status_view(2.0), 0.0, SPEC.launcher_timeout_s)
    failed = job()
    failed.fatal("boom", 2.0)
    assert standby_done(failed.status_view(2.0), 0.0, SPEC.launcher_timeout_s)
    silent = job()
    silent.launcher(31.0)  # no beat for the launcher's timeout: the master ends the job, nobody wakes the spare
    assert silent.abandoned and standby_done(silent.status_view(31.0), 0.0, SPEC.launcher_timeout_s)
    assert standby_done(None, 61.0, SPEC.launcher_timeout_s)  # no master, and no launcher to wake the spare
