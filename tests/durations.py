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
# here, renamed or removed, only costs that first run some balance. (The 30 s or longer of a run at 910b623.)
SEED: dict[str, float] = {
    "tests/integration/launcher/test_chaos.py::test_a_job_under_an_action_every_3_to_6_s_succeeds_exactly_once[23]": 209,
    "tests/integration/launcher/test_launch_kube.py::test_a_lost_node_loses_a_trainer_and_the_master_both_replaced_elsewhere_and_the_job_succeeds": 198,
    "tests/integration/pipeline/test_argo.py::test_the_retraining_cronworkflow_runs_twice_each_run_trains_and_the_second_warm_starts_from_the_first": 196,
    "tests/integration/launcher/test_soak.py::test_a_short_soak_succeeds_exactly_once_and_accounts_for_its_time": 137,
    "tests/integration/launcher/test_chaos.py::test_a_job_under_an_action_every_3_to_6_s_succeeds_exactly_once[11]": 128,
    "tests/integration/launcher/test_launch_kube.py::test_the_apiserver_away_for_20_s_mid_run_holds_the_plan_and_the_job_finishes": 104,
    "tests/integration/pipeline/test_kserve_controller.py::test_kserves_controller_reconciles_the_deploy_steps_service_into_edls_runtime_with_its_s3_credentials": 95,
    "tests/integration/pipeline/test_pipeline_local.py::test_edl_demo_runs_the_pipeline_and_writes_summary_and_timeline": 91,
    "tests/integration/launcher/test_trainer_faults.py::test_trainer_faults_at_any_rank_cost_at_most_the_failed_step[torch]": 82,
    "tests/integration/launcher/test_launch_kube.py::test_a_retried_launcher_adopts_the_job_and_a_lost_master_is_recreated": 79,
    "tests/integration/launcher/test_rank0_kills.py::test_three_kills_of_rank_0_of_3_cost_no_survivor_and_no_record": 77,
    "tests/integration/test_docs_site.py::test_the_first_job_of_getting_started_runs_as_written": 75,
    "tests/integration/launcher/test_trainer_faults.py::test_trainer_faults_at_any_rank_cost_at_most_the_failed_step[paddle]": 70,
    "tests/integration/launcher/test_trainer_faults.py::test_a_joiner_that_stops_responding_in_a_graceful_change_costs_no_rollback[paddle]": 61,
    "tests/integration/plane/test_dev_cluster.py::test_cluster_up_prints_exports_runs_our_pods_and_down_leaves_no_process": 55,
    "tests/integration/launcher/test_launch_kube.py::test_a_launcher_killed_without_its_cleanup_leaves_no_pod_running_and_no_process": 52,
    "tests/integration/launcher/test_launch_kube.py::test_a_retried_step_keeps_its_job_when_the_first_pod_is_cleaned_up": 51,
    "tests/integration/launcher/test_trainer_faults.py::test_a_joiner_that_stops_responding_in_a_graceful_change_costs_no_rollback[torch]": 50,
    "tests/integration/launcher/test_dead_man_switch.py::test_a_launcher_gone_silent_mid_run_leaves_no_process_of_its_job[killed]": 47,
    "tests/integration/autoscale/test_control_scale.py::test_three_jobs_sidecars_cache_the_cluster_once": 47,
    "tests/integration/launcher/test_dead_man_switch.py::test_a_launcher_gone_silent_mid_run_leaves_no_process_of_its_job[silent]": 47,
    "tests/integration/launcher/test_elastic_jobs.py::test_master_and_a_trainer_killed_together_fall_back_to_the_checkpoint": 46,
    "tests/integration/launcher/test_launch_kube.py::test_a_higher_priority_service_takes_the_capacity_back": 43,
    "tests/integration/plane/test_plane.py::test_waiting_reasons_crash_loop_image_pull_and_missing_secret": 41,
    "tests/integration/launcher/test_launch_kube.py::test_trainer_pods_deleted_gracefully_leave_as_drained_trainers_and_their_peers_never_wait": 41,
    "tests/integration/launcher/test_elastic_jobs.py::test_master_killed_and_restarted_resumes[torch]": 39,
    "tests/integration/launcher/test_launch_kube.py::test_an_evicted_trainer_is_replaced": 38,
    "tests/integration/launcher/test_launch_kube.py::test_a_pytorch_job_trains_in_edls_pytorch_image_audited_and_exports_onnx": 38,
    "tests/integration/trainer/test_onnx_export.py::test_every_zoo_model_is_exported_as_onnx_that_agrees_with_its_framework[edl.zoo.transformer]": 38,
    "tests/integration/storage/test_audit_outage.py::test_an_audited_job_trains_through_an_s3_outage_and_a_trainer_killed_in_it": 36,
    "tests/integration/launcher/test_launch_kube.py::test_trainers_that_fit_no_node_are_reported_unschedulable": 36,
    "tests/integration/pipeline/test_kserve_controller.py::test_the_deploy_step_run_as_a_pod_under_the_runs_account_serves_its_model": 35,
    "tests/integration/cluster/test_kube_cluster.py::test_a_master_that_takes_its_grace_period_is_gone_before_its_successor_is_created": 34,
    "tests/integration/launcher/test_launch_kube.py::test_two_jobs_at_once_in_one_namespace_keep_to_their_own_objects_and_checkpoints": 34,
    "tests/integration/pipeline/test_pipeline_local.py::test_edl_demo_runs_the_same_pipeline_with_pytorch": 34,
    "tests/integration/launcher/test_job_identity.py::test_a_second_run_of_a_running_job_is_refused_and_the_first_finishes": 33,
    "tests/integration/launcher/test_elastic_jobs.py::test_scale_up_then_drain_keeps_exactly_once[paddle]": 31,
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
