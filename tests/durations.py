"""How long the slow tests take, so that ``./dev test``'s workers share them out from the start.

pytest-xdist's ``worksteal`` hands each of its ``n`` workers a contiguous ``1/n`` of the collection at
the start, and an idle worker steals the back half of another's queue. In the collection's order the
slow tests sit in a few modules, so one worker's share held most of them; stealing evens the counts,
not the seconds, and the last test to end could be a long one. ``worksteal_order`` lays the collection
out so that each share holds about the same seconds of known-slow tests, longest first, and the short
tests after them (what is stolen and what runs last). Seconds are a run's setup + call + teardown
(``--durations=80`` of the whole suite on two workers, 2026-12-01, a loaded machine: only their
proportions matter); tests not listed (all under 15 s) count as 0. A test renamed or removed here
fails ``tests/unit/test_durations.py``.
"""

from __future__ import annotations

KNOWN_S: dict[str, int] = {
    "tests/integration/pipeline/test_argo.py::test_the_retraining_cronworkflow_runs_twice_each_run_trains_and_the_second_warm_starts_from_the_first": 413,
    "tests/integration/pipeline/test_pipeline_local.py::test_retraining_warm_starts_from_the_published_model_and_publishes_only_if_better": 217,
    "tests/integration/launcher/test_trainer_faults.py::test_trainer_faults_at_any_rank_cost_at_most_the_failed_step[paddle]": 216,
    "tests/integration/launcher/test_trainer_faults.py::test_trainer_faults_at_any_rank_cost_at_most_the_failed_step[torch]": 216,  # not measured alone: taken as long as the Paddle run
    "tests/integration/launcher/test_elastic_jobs.py::test_everything_killed_then_the_same_command_resumes": 212,
    "tests/integration/storage/test_s3.py::test_storage_outage_is_retried_while_training_continues": 202,
    "tests/integration/pipeline/test_pipeline_local.py::test_edl_demo_runs_the_pipeline_and_writes_summary_and_timeline": 172,
    "tests/integration/launcher/test_launch_kube.py::test_a_retried_launcher_adopts_the_job_and_a_lost_master_is_recreated": 145,
    "tests/integration/launcher/test_launch_kube.py::test_a_lost_node_loses_a_trainer_and_the_master_both_replaced_elsewhere_and_the_job_succeeds": 140,
    "tests/integration/launcher/test_elastic_jobs.py::test_sigkill_of_a_trainer_keeps_exactly_once[paddle]": 135,
    "tests/integration/launcher/test_elastic_jobs.py::test_sigkill_of_a_trainer_keeps_exactly_once[torch]": 135,  # not measured alone: taken as long as the Paddle run
    "tests/integration/launcher/test_launch_kube.py::test_the_apiserver_away_for_20_s_mid_run_holds_the_plan_and_the_job_finishes": 124,
    "tests/integration/storage/test_s3.py::test_training_with_s3_data_and_checkpoints": 115,
    "tests/integration/launcher/test_elastic_jobs.py::test_scale_up_then_drain_keeps_exactly_once[paddle]": 113,
    "tests/integration/launcher/test_elastic_jobs.py::test_scale_up_then_drain_keeps_exactly_once[torch]": 113,  # not measured alone: taken as long as the Paddle run
    "tests/integration/launcher/test_elastic_jobs.py::test_master_killed_and_restarted_resumes[paddle]": 104,
    "tests/integration/launcher/test_elastic_jobs.py::test_master_killed_and_restarted_resumes[torch]": 104,  # not measured alone: taken as long as the Paddle run
    "tests/integration/launcher/test_launch_kube.py::test_a_data_set_several_times_the_scratch_size_trains_without_eviction": 102,
    "tests/integration/launcher/test_dead_man_switch.py::test_a_launcher_gone_silent_mid_run_leaves_no_process_of_its_job[silent]": 96,
    # added 2026-12-02, measured alone (85-95 s; its lease and drop wait on the clock, not the CPU)
    "tests/integration/launcher/test_trainer_faults.py::test_a_joiner_that_stops_responding_in_a_graceful_change_costs_no_rollback[paddle]": 95,
    "tests/integration/launcher/test_trainer_faults.py::test_a_joiner_that_stops_responding_in_a_graceful_change_costs_no_rollback[torch]": 160,  # the PyTorch run, measured alone
    "tests/integration/launcher/test_job_identity.py::test_a_second_run_of_a_running_job_is_refused_and_the_first_finishes": 93,
    "tests/integration/launcher/test_launch_kube.py::test_a_launcher_killed_without_its_cleanup_leaves_no_pod_running_and_no_process": 81,
    # added 2026-12-03, measured alone
    "tests/integration/launcher/test_rank0_kills.py::test_three_kills_of_rank_0_of_3_cost_no_survivor_and_no_record": 130,
    "tests/integration/pipeline/test_pipeline_local.py::test_edl_demo_runs_the_same_pipeline_with_pytorch": 170,
    "tests/integration/launcher/test_chaos.py::test_a_job_under_an_action_every_3_to_6_s_succeeds_exactly_once[11]": 48,
    "tests/integration/launcher/test_chaos.py::test_a_job_under_an_action_every_3_to_6_s_succeeds_exactly_once[23]": 42,
    "tests/integration/launcher/test_launch_kube.py::test_two_jobs_at_once_in_one_namespace_keep_to_their_own_objects_and_checkpoints": 80,
    "tests/integration/launcher/test_user_code_errors.py::test_a_one_off_exception_is_relaunched_and_the_job_ends_exactly_once": 78,
    "tests/integration/launcher/test_launch_kube.py::test_a_retried_step_keeps_its_job_when_the_first_pod_is_cleaned_up": 73,
    "tests/integration/launcher/test_job_identity.py::test_another_job_on_a_prefix_is_refused_naming_its_owner": 73,
    "tests/integration/launcher/test_launch_kube.py::test_an_evicted_trainer_is_replaced": 70,
    "tests/integration/launcher/test_elastic_jobs.py::test_master_killed_goes_on_from_the_trainers_step[no-checkpoint]": 69,
    "tests/integration/launcher/test_launch_kube.py::test_launch_as_a_step_runs_the_job_grows_it_and_leaves_nothing_behind": 68,
    "tests/integration/launcher/test_user_code_errors.py::test_a_record_the_collate_cannot_handle_fails_at_its_step_after_one_relaunch": 58,
    "tests/integration/launcher/test_elastic_jobs.py::test_master_and_a_trainer_killed_together_fall_back_to_the_checkpoint": 58,
    "tests/integration/launcher/test_user_code_errors.py::test_a_model_that_does_not_fit_its_data_fails_within_one_relaunch[1]": 51,
    "tests/integration/launcher/test_elastic_jobs.py::test_master_killed_goes_on_from_the_trainers_step[checkpoint-far-behind]": 49,
    "tests/integration/plane/test_dev_cluster.py::test_cluster_up_prints_exports_runs_our_pods_and_down_leaves_no_process": 48,
    "tests/integration/launcher/test_launch_kube.py::test_trainers_that_fit_no_node_are_reported_unschedulable": 47,
    "tests/integration/autoscale/test_sidecar_job.py::test_sidecar_grows_into_idle_capacity_and_hands_it_back": 47,
    "tests/integration/trainer/test_onnx_export.py::test_a_trained_digits_model_is_exported_as_onnx_that_agrees_with_the_framework": 45,
    "tests/integration/launcher/test_user_code_errors.py::test_a_model_that_does_not_fit_its_data_fails_within_one_relaunch[2]": 45,
    "tests/integration/trainer/test_onnx_export.py::test_a_model_the_converter_cannot_take_keeps_its_own_export_and_the_log_says_why": 44,
    "tests/integration/plane/test_plane.py::test_a_lost_node_goes_unknown_and_its_pods_are_evicted_but_stay_terminating": 39,
    "tests/integration/launcher/test_launch_kube.py::test_the_launcher_pod_deleted_takes_a_last_checkpoint_and_removes_every_object": 39,
    "tests/integration/pipeline/test_deploy_kserve.py::test_the_deploy_step_creates_then_updates_the_inference_service_as_the_runs_account": 35,
    "tests/integration/launcher/test_launch_kube.py::test_a_higher_priority_service_takes_the_capacity_back": 34,
    "tests/integration/cluster/test_kube_cluster.py::test_a_master_that_takes_its_grace_period_is_gone_before_its_successor_is_created": 32,
    "tests/integration/launcher/test_launch_kube.py::test_trainers_run_only_on_the_nodes_their_selector_and_tolerations_allow": 31,
    "tests/integration/launcher/test_launch_kube.py::test_a_step_under_the_runs_own_account_with_only_the_rendered_binding_runs_and_audits_the_job": 31,
    "tests/integration/serving/test_serve.py::test_serve_answers_ready_metadata_and_infer_like_the_framework_and_rejects_bad_requests": 28,
    "tests/integration/launcher/test_launch_kube.py::test_an_unknown_trainer_image_fails_the_step_fast_naming_the_image": 28,
    "tests/integration/launcher/test_launch_kube.py::test_an_oom_killed_trainer_fails_the_job_naming_the_limit": 28,
    "tests/integration/launcher/test_launch_kube.py::test_an_argo_step_killed_without_cleanup_is_garbage_collected": 28,
    "tests/integration/serving/test_serve.py::test_serve_refuses_a_model_directory_without_onnx_in_one_line": 26,
    "tests/integration/plane/test_plane.py::test_a_pod_runs_under_its_service_accounts_rbac": 23,
    "tests/integration/launcher/test_launch_kube.py::test_a_kfp_step_killed_without_cleanup_leaves_nothing_running": 22,
    "tests/integration/cluster/test_kube_adapter.py::test_a_watch_from_a_compacted_version_gets_410_and_lists_again": 21,
    "tests/integration/pipeline/test_pipeline_local.py::test_a_warm_start_model_that_does_not_match_fails_with_a_message": 20,
    "tests/integration/plane/test_plane.py::test_waiting_reasons_crash_loop_image_pull_and_missing_secret": 18,
    "tests/integration/trainer/test_fused_all_reduce.py::test_two_ranks_fused_all_reduce_equals_the_per_parameter_one": 17,
    "tests/integration/serving/test_serve.py::test_serve_from_s3_under_the_default_name": 17,
    "tests/unit/sim/test_sim.py::test_edl2017_case1_fast_run_matches_the_published_shape": 16,
    "tests/integration/launcher/test_launch_kube.py::test_a_master_that_rejects_its_data_fails_the_step_fast_with_its_own_reason": 16,
    "tests/integration/launcher/test_dead_man_switch.py::test_a_launcher_gone_silent_mid_run_leaves_no_process_of_its_job[killed]": 16,
    "tests/integration/cli/test_bad_input.py::test_wrong_token_is_refused": 16,
    # added 2026-12-03, measured alone (22 s), doubled as the others were measured loaded
    "tests/integration/launcher/test_launch_kube.py::test_a_pytorch_job_trains_in_edls_pytorch_image_audited_and_exports_onnx": 44,
}


def worksteal_order(nodeids: list[str], workers: int, known: dict[str, int] = KNOWN_S) -> list[int]:
    """The collection's indices in the order to run them on ``workers`` worksteal workers.

    xdist's first hand-out gives worker ``i`` the next ``remaining // (workers - i)`` tests; each share
    gets known-slow tests longest first, each to the share with the fewest seconds so far that has room
    (the longest-processing-time rule), then unknown tests in collection order. Deterministic: every
    worker must collect the same order.
    """
    sizes, remaining = [], len(nodeids)
    for i in range(workers):
        sizes.append(remaining // (workers - i))
        remaining -= sizes[-1]
    shares: list[list[int]] = [[] for _ in sizes]
    loads = [0] * len(sizes)
    slow = sorted((i for i, n in enumerate(nodeids) if n in known), key=lambda i: -known[nodeids[i]])
    for i in slow:
        share = min((s for s in range(len(sizes)) if len(shares[s]) < sizes[s]), key=lambda s: loads[s])
        shares[share].append(i)
        loads[share] += known[nodeids[i]]
    rest = iter(i for i, n in enumerate(nodeids) if n not in known)
    for share, size in zip(shares, sizes):
        share.extend(next(rest) for _ in range(size - len(share)))
    return [i for share in shares for i in share]
