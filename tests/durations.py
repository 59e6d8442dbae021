"""How long the suite's tests take, measured by the suite itself, so that ``./dev test``'s workers share
the slow ones out from the start.

pytest-xdist's ``worksteal`` hands each of its ``n`` workers a contiguous ``1/n`` of the collection at
the start, and an idle worker steals the back half of another's queue. In the collection's order the
slow tests sit in a few modules, so one worker's share held most of them; stealing evens the counts,
not the seconds, and the last test to end could be a long one. ``worksteal_order`` lays the collection
out so that each share holds about the same seconds of slow tests (``SLOW_S`` or more), longest first,
and the short tests after them in the collection's order (what is stolen and what runs last).

The seconds are measured, not kept by hand: every run of the suite records each test's setup + call +
teardown seconds (``Recorder``, registered by ``tests/conftest.py`` where every report arrives: xdist's
controller, or the one process of a run without workers) and merges them into ``test-durations.json``
in the cache outside the clone (``$EDL_CACHE_DIR``, else ``~/.cache/edl``: beside the plane's builds),
atomically; the next run orders by them. A test that was never timed on this machine (a fresh machine,
a new or a renamed test) takes its seconds from ``SEED`` if it is there, else counts as short: a rename
costs at most one run's balance, never a failure.
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

from tests.plane.build import cache_root

FILE_NAME = "test-durations.json"
SLOW_S = 15.0  # shorter tests keep the collection's order (their modules' fixtures stay shared)

# Only for a machine whose cache has not timed these yet (its first run): the slowest tests of a whole
# run on two workers of a loaded 2-core machine (2026-12), in seconds. Not kept up to date: a test missing
# here, renamed or removed, only costs that first run some balance.
SEED: dict[str, float] = {
    "tests/integration/pipeline/test_argo.py::test_the_retraining_cronworkflow_runs_twice_each_run_trains_and_the_second_warm_starts_from_the_first": 413,
    "tests/integration/pipeline/test_pipeline_local.py::test_retraining_warm_starts_from_the_published_model_and_publishes_only_if_better": 217,
    "tests/integration/launcher/test_trainer_faults.py::test_trainer_faults_at_any_rank_cost_at_most_the_failed_step[paddle]": 216,
    "tests/integration/launcher/test_trainer_faults.py::test_trainer_faults_at_any_rank_cost_at_most_the_failed_step[torch]": 216,
    "tests/integration/launcher/test_elastic_jobs.py::test_everything_killed_then_the_same_command_resumes": 212,
    "tests/integration/storage/test_s3.py::test_storage_outage_is_retried_while_training_continues": 202,
    "tests/integration/pipeline/test_pipeline_local.py::test_edl_demo_runs_the_pipeline_and_writes_summary_and_timeline": 172,
    "tests/integration/pipeline/test_pipeline_local.py::test_edl_demo_runs_the_same_pipeline_with_pytorch": 170,
    "tests/integration/launcher/test_trainer_faults.py::test_a_joiner_that_stops_responding_in_a_graceful_change_costs_no_rollback[torch]": 160,
    "tests/integration/launcher/test_launch_kube.py::test_a_retried_launcher_adopts_the_job_and_a_lost_master_is_recreated": 145,
    "tests/integration/launcher/test_launch_kube.py::test_a_lost_node_loses_a_trainer_and_the_master_both_replaced_elsewhere_and_the_job_succeeds": 140,
    "tests/integration/launcher/test_elastic_jobs.py::test_sigkill_of_a_trainer_keeps_exactly_once[paddle]": 135,
    "tests/integration/launcher/test_elastic_jobs.py::test_sigkill_of_a_trainer_keeps_exactly_once[torch]": 135,
    "tests/integration/launcher/test_rank0_kills.py::test_three_kills_of_rank_0_of_3_cost_no_survivor_and_no_record": 130,
    "tests/integration/launcher/test_launch_kube.py::test_the_apiserver_away_for_20_s_mid_run_holds_the_plan_and_the_job_finishes": 124,
    "tests/integration/storage/test_s3.py::test_training_with_s3_data_and_checkpoints": 115,
    "tests/integration/launcher/test_elastic_jobs.py::test_scale_up_then_drain_keeps_exactly_once[paddle]": 113,
    "tests/integration/launcher/test_elastic_jobs.py::test_scale_up_then_drain_keeps_exactly_once[torch]": 113,
    "tests/integration/launcher/test_elastic_jobs.py::test_master_killed_and_restarted_resumes[paddle]": 104,
    "tests/integration/launcher/test_elastic_jobs.py::test_master_killed_and_restarted_resumes[torch]": 104,
    "tests/integration/launcher/test_launch_kube.py::test_a_data_set_several_times_the_scratch_size_trains_without_eviction": 102,
    "tests/integration/launcher/test_dead_man_switch.py::test_a_launcher_gone_silent_mid_run_leaves_no_process_of_its_job[silent]": 96,
    "tests/integration/launcher/test_trainer_faults.py::test_a_joiner_that_stops_responding_in_a_graceful_change_costs_no_rollback[paddle]": 95,
    "tests/integration/launcher/test_job_identity.py::test_a_second_run_of_a_running_job_is_refused_and_the_first_finishes": 93,
    "tests/integration/launcher/test_launch_kube.py::test_a_launcher_killed_without_its_cleanup_leaves_no_pod_running_and_no_process": 81,
    "tests/integration/launcher/test_launch_kube.py::test_two_jobs_at_once_in_one_namespace_keep_to_their_own_objects_and_checkpoints": 80,
    "tests/integration/launcher/test_user_code_errors.py::test_a_one_off_exception_is_relaunched_and_the_job_ends_exactly_once": 78,
    "tests/integration/launcher/test_launch_kube.py::test_a_retried_step_keeps_its_job_when_the_first_pod_is_cleaned_up": 73,
    "tests/integration/launcher/test_job_identity.py::test_another_job_on_a_prefix_is_refused_naming_its_owner": 73,
    "tests/integration/launcher/test_launch_kube.py::test_an_evicted_trainer_is_replaced": 70,
    "tests/integration/launcher/test_elastic_jobs.py::test_master_killed_goes_on_from_the_trainers_step[no-checkpoint]": 69,
    "tests/integration/launcher/test_launch_kube.py::test_launch_as_a_step_runs_the_job_grows_it_and_leaves_nothing_behind": 68,
}


def cache_path() -> Path:
    """The measured seconds: in the cache outside the clone that the plane's builds use."""
    return cache_root() / FILE_NAME


def _seconds(data: object) -> dict[str, float]:
    """The well-formed entries of ``data``: test ids to finite seconds >= 0."""
    if not isinstance(data, dict):
        return {}
    return {k: float(v) for k, v in data.items() if isinstance(k, str) and isinstance(v, (int, float))
            and not isinstance(v, bool) and math.isfinite(v) and v >= 0}


def load(path: Path) -> dict[str, float]:
    """The seconds cached at ``path``; nothing when there is no cache or it cannot be read."""
    try:
        return _seconds(json.loads(path.read_text()))
    except (OSError, ValueError):
        return {}


def merge(cached: Mapping[str, float], measured: Mapping[str, float]) -> dict[str, float]:
    """The cache after a run: each test it timed at its new seconds, every other test as it was (a run of a
    part of the suite keeps the rest)."""
    return {**cached, **{k: round(v, 2) for k, v in _seconds(dict(measured)).items()}}


def save(path: Path, seconds: Mapping[str, float]) -> None:
    """Write ``seconds`` to ``path`` whole or not at all: a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(dict(seconds), f, indent=0, sort_keys=True)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def update(path: Path, measured: Mapping[str, float]) -> dict[str, float]:
    """Merge a run's ``measured`` seconds into the cache at ``path``; answers the cache as written. Runs
    that end at the same time on one machine take turns (a lock beside the file), so none loses another's."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        seconds = merge(load(path), measured)
        save(path, seconds)
    return seconds


def known(cached: Mapping[str, float], seed: Mapping[str, float] = SEED) -> dict[str, float]:
    """The seconds to order by: what this machine measured, and ``seed``'s for what it never timed."""
    return {**seed, **cached}


def worksteal_order(nodeids: list[str], workers: int, seconds: Mapping[str, float],
                    slow_s: float = SLOW_S) -> list[int]:
    """The collection's indices in the order to run them on ``workers`` worksteal workers.

    xdist's first hand-out gives worker ``i`` the next ``remaining // (workers - i)`` tests; each share
    gets the slow tests (``slow_s`` or more in ``seconds``) longest first, each to the share with the
    fewest seconds so far that has room (the longest-processing-time rule), then the others in collection
    order. Deterministic: every worker must collect the same order. Ids in ``seconds`` that were not
    collected (a test renamed or removed) are ignored.
    """
    sizes, remaining = [], len(nodeids)
    for i in range(workers):
        sizes.append(remaining // (workers - i))
        remaining -= sizes[-1]
    shares: list[list[int]] = [[] for _ in sizes]
    loads = [0.0] * len(sizes)
    slow = sorted((i for i, n in enumerate(nodeids) if n in seconds and seconds[n] >= slow_s),
                  key=lambda i: -seconds[nodeids[i]])
    for i in slow:
        share = min((s for s in range(len(sizes)) if len(shares[s]) < sizes[s]), key=lambda s: loads[s])
        shares[share].append(i)
        loads[share] += seconds[nodeids[i]]
    taken = set(slow)
    rest = iter(i for i in range(len(nodeids)) if i not in taken)
    for share, size in zip(shares, sizes):
        share.extend(next(rest) for _ in range(size - len(share)))
    return [i for share in shares for i in share]


class Recorder:
    """A pytest plugin: adds up each test's setup + call + teardown seconds from the reports it hears and
    merges them into the cache at ``path`` when the session ends. Only tests that ran and passed count: a
    skipped or failed test's seconds say little about its next run's (a slow test skipped would pass for
    a short one). When the cache cannot be written nothing is: timing never fails a run."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.seconds: dict[str, float] = {}
        self.passed: set[str] = set()  # its call passed
        self.failed: set[str] = set()  # a phase failed (a teardown, say)

    def pytest_runtest_logreport(self, report) -> None:
        if report.when not in ("setup", "call", "teardown"):
            return
        self.seconds[report.nodeid] = self.seconds.get(report.nodeid, 0.0) + float(report.duration)
        if report.failed:
            self.failed.add(report.nodeid)
        elif report.when == "call" and report.passed:
            self.passed.add(report.nodeid)

    def measured(self) -> dict[str, float]:
        return {k: v for k, v in self.seconds.items() if k in self.passed and k not in self.failed}

    def pytest_sessionfinish(self, session) -> None:
        measured = self.measured()
        if not measured:
            return
        try:
            update(self.path, measured)
        except OSError as e:
            print(f"\ntests/durations.py: test durations not cached ({e})", file=sys.stderr)
