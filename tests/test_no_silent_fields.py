"""No silent no-ops (issue #14): every configuration field and every command-line flag is either
shown by a test to change behaviour, or listed in EXCEPTIONS with the reason it is not.

The evidence for a field lives next to it where it can (issue #34): a module that defines
models may carry `EVIDENCE`, a mapping from `Model.field` to the tests that show the field at
work, beside those models (testbed/policy/predict.py, testbed/checkers/*.py,
testbed/config/policy.py); a new policy's knobs, checker or fault then brings its own rows and
edits nothing here. The rows of the modules that have no `EVIDENCE` yet stay in `FIELDS` below;
a field must have its row in exactly one of the two places.

`LinkConfig.shaper` was accepted and read by nothing, so `shaper: tc` ran the emulator and said
nothing. This table keeps that from happening again. The fields are found by walking the
pydantic models (every model of testbed.config, the scenario, the registered nemesis actions and
checkers, the services' and the scheduler's specs, and every model they contain), the flags by
walking the argparse parsers of `testbed` and `python -m testbed.substrate.compose`; so a new
field or flag fails `test_every_field_has_an_entry` / `test_every_flag_has_an_entry` until it
gets a row here. Each row names one or more tests (`path::function`) which must exist; together
they show the field or flag changing what the testbed does (a plan, a spec, a request, a route,
a verdict, a kernel command). A field is keyed by the model that declares it (`NemesisEvent.at`
is every action's `at`); a flag by its command (`testbed run --policy`). Positional operands
(the scenario file) are not settings and are left out.
"""

# ruff: noqa: E501 - a row names its tests in full, so it may run past the line length

from __future__ import annotations

import argparse
import ast
import importlib
import inspect
import pkgutil
import sys
import typing
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest
from pydantic import BaseModel

ROOT = Path(__file__).resolve().parents[1]

Tests = str | tuple[str, ...]

PROF = "tests/profiles/test_profile_files.py::"
SWEEP = "tests/scenario/test_sweep.py::"
SWEEP_CLI = SWEEP + "test_cli_writes_the_table_and_plots"
LIB_LIVE = "tests/chaos/test_library.py::test_scenario_passes_its_checkers"

# Test modules the rows point into (most rows cite one of these).
PREP = "tests/scenario/test_prepare_fields.py::"
RUN = "tests/scenario/test_runner_specs.py::"
WORK = "tests/workload/test_config_fields.py::"
KNOB = "tests/scheduler/test_knobs.py::"
CHECK = "tests/checkers/test_checker_fields.py::"
ACT = "tests/nemesis/test_action_fields.py::"
SVC = "tests/services/test_spec_fields.py::"
ROUTER = "tests/services/test_router_spec_fields.py::"
CLI = "tests/cli/test_cli_flags.py::"
UP = "tests/cli/test_cli_up.py::"
PREDICT = "tests/policy/test_predict.py::"
PV = "tests/cli/test_cli_policy_vectors.py::"
BYOS_HTTP = "tests/policy/test_policy_http.py::"
BYOS_FAULTS = "tests/policy/test_policy_faults.py::"
BYOS_CHAOS = "tests/chaos/test_byos.py::"

PLAYER = "tests/chaos/test_checkers_scenario.py::test_player_records_every_phase_and_survives_a_failing_fault"
REGISTERED = (
    "tests/nemesis/test_nemesis_plan.py::test_every_action_model_answers_to_its_registered_name"
)
LINK_SETUP = "tests/link/test_link_deployment.py::test_proxies_share_one_cap_in_emulated_units"
TORCH_SEED = (
    "tests/scenario/test_torch_live.py::test_kv_from_another_model_is_refused_with_its_reason"
)
SERVICE_IDENTITY = SVC + "test_a_started_service_binds_its_specs_host_and_ports"
ROUTED = ROUTER + "test_threshold_and_instance_table_pick_prefill_and_kv_address"
ENGINE_STRATEGY = SVC + "test_the_routers_engine_strategy_reads_engine_seeds_dtype_and_byte_scale"
PREFILL_ENGINE = SVC + "test_prefill_timing_and_kv_sizes_follow_model_hardware_and_byte_scale"
SHORT_LOOP = KNOB + "test_the_short_term_loop_hands_its_knobs_to_the_controllers"
LONG_LOOP = KNOB + "test_the_long_term_loop_hands_its_knobs_to_the_controller"
LOOP_PLAN = KNOB + "test_the_loops_plan_with_the_specs_deployment_lengths_output_slo_and_step"
EVERY_SPEC = RUN + "test_every_service_gets_the_runs_scale_model_slo_and_seeds"

FIELDS: dict[str, Tests] = {
    # user profiles (testbed.config.profiles, #17 item 5)
    "Scenario.profiles": (
        PROF + "test_a_scenario_plans_and_prepares_with_a_user_profile",
        LIB_LIVE,
    ),
    "ServiceSpec.profiles": (
        PROF + "test_services_register_the_profiles_their_spec_carries",
        LIB_LIVE,
    ),
    "ProfileFile.model": PROF + "test_a_scenario_plans_and_prepares_with_a_user_profile",
    "ProfileFile.hardware": PROF + "test_a_scenario_plans_and_prepares_with_a_user_profile",
    "ModelEntry.name": PROF + "test_a_scenario_plans_and_prepares_with_a_user_profile",
    "ModelEntry.description": PROF + "test_gpus_and_descriptions_name_the_hardware",
    "ModelEntry.layers": PROF + "test_layers_split_into_full_and_linear_kinds",
    "ModelEntry.kv": PROF + "test_kv_per_token_and_state_set_the_kv_size",
    "LayersConfig.full": PROF + "test_layers_split_into_full_and_linear_kinds",
    "LayersConfig.linear": PROF + "test_layers_split_into_full_and_linear_kinds",
    "KvConfig.per_token": PROF + "test_kv_per_token_and_state_set_the_kv_size",
    "KvConfig.state": PROF + "test_kv_per_token_and_state_set_the_kv_size",
    "KvConfig.curve": PROF + "test_kv_curve_knots_set_the_kv_size",
    "SizeKnot.tokens": PROF + "test_kv_curve_knots_set_the_kv_size",
    "SizeKnot.size": PROF + "test_kv_curve_knots_set_the_kv_size",
    "HardwareEntry.prefill": PROF + "test_prefill_knots_set_the_prefill_time",
    "TimeKnot.tokens": PROF + "test_prefill_knots_set_the_prefill_time",
    "TimeKnot.time": PROF + "test_prefill_knots_set_the_prefill_time",
    "HardwareEntry.decode": PROF + "test_decode_sets_the_step_model_and_batch",
    "DecodeConfig.step_base": PROF + "test_decode_sets_the_step_model_and_batch",
    "DecodeConfig.step_per_seq": PROF + "test_decode_sets_the_step_model_and_batch",
    "DecodeConfig.max_batch": PROF + "test_decode_sets_the_step_model_and_batch",
    "HardwareEntry.gpus": (
        PROF + "test_gpus_and_descriptions_name_the_hardware",
        PROF + "test_a_scenario_plans_and_prepares_with_a_user_profile",
    ),
    "HardwareEntry.description": PROF + "test_gpus_and_descriptions_name_the_hardware",
    # --- the scenario file
    "Scenario.seed": (PREP + "test_seed_draws_other_requests", EVERY_SPEC),
    "Scenario.duration": PREP + "test_duration_bounds_the_arrivals",
    "Scenario.scale": EVERY_SPEC,
    "Scenario.deployments": PREP + "test_deployment_picks_which_deployment_runs",
    "Scenario.deployment": PREP + "test_deployment_picks_which_deployment_runs",
    "Scenario.workload": PREP + "test_lengths_of_the_workload_are_the_prompts",
    "Scenario.slo": PREP + "test_decode_speed_slo_sets_the_decode_batch",
    "Scenario.policy": PREP + "test_policy_name_and_threshold",
    "Scenario.planner": PREP + "test_threshold_step_is_the_planners_grid",
    "Scenario.nemesis": PREP + "test_nemesis_entries_are_planned",
    # an external router in front of the fleet (issue #32; docs/real-routers.md)
    "Scenario.router": (
        "tests/scenario/test_external_router.py::test_the_scenarios_router_section_is_read",
        "tests/chaos/test_external_router.py::test_the_router_routes_the_fleet_through_a_prefill_kill",
    ),
    "ExternalRouterConfig.kind": "tests/scenario/test_external_router.py::test_the_scenarios_router_section_is_read",
    "ExternalRouterConfig.preset": (
        "tests/scenario/test_external_router.py::test_the_preset_keeps_the_router_on_loopback_with_its_policy_and_flags",
        "tests/scenario/test_external_router.py::test_the_vllm_preset_names_no_bootstrap_port_and_no_tokenizer",
    ),
    "ExternalRouterConfig.policy": (
        "tests/scenario/test_external_router.py::test_the_preset_keeps_the_router_on_loopback_with_its_policy_and_flags",
        "tests/scenario/test_external_router.py::test_a_policy_the_router_has_not_is_refused",
    ),
    "ExternalRouterConfig.flags": "tests/scenario/test_external_router.py::test_the_preset_keeps_the_router_on_loopback_with_its_policy_and_flags",
    "ExternalRouterConfig.python": (
        "tests/scenario/test_external_router.py::test_a_missing_router_says_which_extra_to_install",
        "tests/scenario/test_external_router.py::test_a_router_that_exits_is_one_line_with_its_stderr",
    ),
    "ExternalRouterConfig.ready_timeout": "tests/scenario/test_external_router.py::test_a_router_never_ready_is_stopped_after_ready_timeout",
    "ServiceSpec.keeper_token": (
        "tests/services/test_router_records.py::test_the_keepers_routes_need_the_runs_token",
        "tests/services/test_router_records.py::test_without_a_token_no_reader_can_be_a_keeper",
    ),
    "ServiceSpec.facade": (
        "tests/services/facade/test_sglang_facade.py::test_without_a_facade_a_worker_serves_only_our_routers_api",
        "tests/services/facade/test_sglang_facade.py::test_recorded_requests_are_prefilled_moved_verified_and_decoded",
        "tests/services/facade/test_vllm_facade.py::test_recorded_requests_are_prefilled_held_pulled_verified_and_decoded",
    ),
    "ServiceSpec.facade_decodes": (
        "tests/services/facade/test_sglang_facade.py::test_only_the_deployments_decode_instances_may_register",
        "tests/services/facade/test_sglang_facade.py::test_the_kv_crosses_the_link_only_between_clusters",
    ),
    "Scenario.checkers": (
        PREP + "test_checkers_are_refused_before_the_run_when_they_cannot_be_judged",
        "tests/checkers/test_checkers.py::test_summary_and_report_show_a_vacuous_check",
    ),
    "ScaleConfig.time_scale": (
        EVERY_SPEC,
        LINK_SETUP,
        "tests/engine/test_torch_calibrate.py::test_auto_resolves_and_a_requested_time_scale_above_it_is_refused",
    ),
    "ScaleConfig.byte_scale": (EVERY_SPEC, LINK_SETUP),
    # --- deployments
    "DeploymentConfig.kind": PREP + "test_kind_and_model_change_the_plan",
    "DeploymentConfig.model": (PREP + "test_kind_and_model_change_the_plan", EVERY_SPEC),
    "DeploymentConfig.prfaas": PREP + "test_instances_and_hardware_change_the_plan",
    "DeploymentConfig.local": PREP + "test_instances_and_hardware_change_the_plan",
    "DeploymentConfig.link": (
        PREP + "test_link_bandwidth_feeds_the_planner",
        RUN + "test_the_link_request_carries_the_links_config_and_the_seed",
    ),
    "DeploymentConfig.engine": (
        PREP + "test_torch_engine_is_checked_before_the_run",
        RUN + "test_the_engine_and_the_tiny_models_seed_and_dtype",
    ),
    "DeploymentConfig.tiny_model": RUN + "test_the_engine_and_the_tiny_models_seed_and_dtype",
    "TinyModelConfig.seed": (
        RUN + "test_the_engine_and_the_tiny_models_seed_and_dtype",
        TORCH_SEED,
    ),
    "TinyModelConfig.dtype": (
        RUN + "test_the_engine_and_the_tiny_models_seed_and_dtype",
        ENGINE_STRATEGY,
    ),
    "ClusterConfig.hardware": (
        PREP + "test_instances_and_hardware_change_the_plan",
        RUN + "test_clusters_hardware_and_instances",
    ),
    "ClusterConfig.instances": (
        PREP + "test_instances_and_hardware_change_the_plan",
        RUN + "test_clusters_hardware_and_instances",
    ),
    "ClusterConfig.prefill": PREP + "test_pinned_local_split",
    "ClusterConfig.decode": PREP + "test_pinned_local_split",
    "ClusterConfig.prefix_cache": (
        "tests/kvcache/test_kvcache_manager.py::test_default_capacities_from_hardware_and_config",
        RUN + "test_the_router_gets_policy_threshold_cache_and_scheduler",
    ),
    "LinkConfig.bandwidth": (LINK_SETUP, PREP + "test_link_bandwidth_feeds_the_planner"),
    "LinkConfig.rtt": (
        LINK_SETUP,
        RUN + "test_the_link_request_carries_the_links_config_and_the_seed",
    ),
    "LinkConfig.jitter": (
        LINK_SETUP,
        RUN + "test_the_link_request_carries_the_links_config_and_the_seed",
    ),
    "LinkConfig.connections": (
        EVERY_SPEC,
        SVC + "test_a_prefill_sends_kv_over_its_specs_connections",
    ),
    "LinkConfig.shaper": (
        CLI + "test_shaper_overrides_the_link_shaper_and_the_header_says_which",
        "tests/substrate/test_local_substrate_link.py::test_tc_shaper_puts_the_route_behind_the_kernel_shaped_veth",
        "tests/scenario/test_shaper_tc.py::test_bandwidth_drop_with_the_kernel_shaper",
    ),
    "LinkConfig.toxiproxy": "tests/substrate/test_local_toxiproxy.py::test_the_link_goes_on_the_named_api_and_no_emulator_is_started",
    # --- workload
    "WorkloadConfig.lengths": PREP + "test_lengths_of_the_workload_are_the_prompts",
    "WorkloadConfig.output_tokens": PREP + "test_output_tokens_shape_requests_and_plan",
    "WorkloadConfig.arrivals": PREP + "test_arrival_rate_or_load",
    "WorkloadConfig.trace": "tests/workload/test_generate.py::test_trace_content_with_synthetic_arrivals",
    "WorkloadConfig.max_requests": PREP + "test_max_requests_caps_the_run",
    "WorkloadConfig.shift": PREP + "test_shift_at_lengths_rate_and_load",
    "ShiftConfig.at": PREP + "test_shift_at_lengths_rate_and_load",
    "ShiftConfig.lengths": PREP + "test_shift_at_lengths_rate_and_load",
    "ShiftConfig.rate": PREP + "test_shift_at_lengths_rate_and_load",
    "ShiftConfig.load": PREP + "test_shift_at_lengths_rate_and_load",
    "ArrivalsConfig.process": WORK + "test_workload_arrivals_process_changes_the_arrival_times",
    "ArrivalsConfig.rate": PREP + "test_arrival_rate_or_load",
    "ArrivalsConfig.load": PREP + "test_arrival_rate_or_load",
    "ArrivalsConfig.burstiness": WORK
    + "test_gamma_burstiness_is_the_squared_coefficient_of_variation",
    "ArrivalsConfig.on_duration": WORK + "test_onoff_on_and_off_durations_place_the_windows",
    "ArrivalsConfig.off_duration": WORK + "test_onoff_on_and_off_durations_place_the_windows",
    "LognormalLengths.kind": PREP + "test_lengths_of_the_workload_are_the_prompts",
    "LognormalLengths.mu": WORK + "test_lognormal_mu_sigma_min_and_max_shape_the_lengths",
    "LognormalLengths.sigma": WORK + "test_lognormal_mu_sigma_min_and_max_shape_the_lengths",
    "LognormalLengths.min": WORK + "test_lognormal_mu_sigma_min_and_max_shape_the_lengths",
    "LognormalLengths.max": WORK + "test_lognormal_mu_sigma_min_and_max_shape_the_lengths",
    "FixedLengths.kind": PREP + "test_lengths_of_the_workload_are_the_prompts",
    "FixedLengths.tokens": (
        PREP + "test_lengths_of_the_workload_are_the_prompts",
        "tests/workload/test_generate.py::test_fixed_lengths_round_and_stay_positive",
    ),
    "TraceLengths.kind": WORK + "test_trace_lengths_path_is_the_distribution_sampled",
    "TraceLengths.path": WORK + "test_trace_lengths_path_is_the_distribution_sampled",
    # --- SLO, policy, planner, scheduler knobs
    "SchedulerSpec.deployment": LOOP_PLAN,
    "SchedulerSpec.lengths": LOOP_PLAN,
    "SchedulerSpec.output_tokens": LOOP_PLAN,
    "SchedulerSpec.tpot_slo_s": LOOP_PLAN,
    "SchedulerSpec.threshold_step": LOOP_PLAN,
    "SchedulerSpec.n_prefill": LOOP_PLAN,
    "SchedulerSpec.replans": (
        "tests/scheduler/test_link_view_loop.py::"
        "test_measuring_only_fills_the_link_view_and_nothing_else"
    ),
    "SchedulerSpec.short_term": SHORT_LOOP,
    "SchedulerSpec.long_term": LONG_LOOP,
    "SchedulerSpec.n_local": KNOB + "test_n_local_is_the_pd_cluster_a_conversion_splits",
    # --- nemesis actions (`action` is the tag that picks the fault)
    "NemesisEvent.at": (
        "tests/nemesis/test_nemesis_plan.py::test_a_burst_hits_nothing_live_and_plans_with_its_times",
        PLAYER,
    ),
    "NemesisEvent.for_": (
        "tests/nemesis/test_nemesis_plan.py::test_a_burst_hits_nothing_live_and_plans_with_its_times",
        PLAYER,
    ),
    "ProcessEvent.target": (
        "tests/nemesis/test_nemesis_plan.py::test_an_instance_target_is_that_instance_and_an_unknown_one_is_refused",
        ACT + "test_process_faults_act_on_their_planned_targets",
    ),
    "ProcessEvent.count": "tests/nemesis/test_nemesis_plan.py::test_a_group_target_picks_count_distinct_instances_of_the_group_from_the_seed",
    "BandwidthAction.action": (ACT + "test_bandwidth_sets_the_cap_and_restores_it", REGISTERED),
    "BandwidthAction.bandwidth": ACT + "test_bandwidth_sets_the_cap_and_restores_it",
    "LatencyAction.action": (ACT + "test_latency_rtt_and_jitter_in_wall_milliseconds", REGISTERED),
    "LatencyAction.rtt": ACT + "test_latency_rtt_and_jitter_in_wall_milliseconds",
    "LatencyAction.jitter": ACT + "test_latency_rtt_and_jitter_in_wall_milliseconds",
    "PartitionAction.action": (ACT + "test_partition_mode_and_timeout", REGISTERED),
    "PartitionAction.mode": ACT + "test_partition_mode_and_timeout",
    "PartitionAction.timeout": ACT + "test_partition_mode_and_timeout",
    "ResetPeerAction.action": (ACT + "test_reset_peer_timeout_and_toxicity", REGISTERED),
    "ResetPeerAction.timeout": ACT + "test_reset_peer_timeout_and_toxicity",
    "ResetPeerAction.toxicity": ACT + "test_reset_peer_timeout_and_toxicity",
    "SlowCloseAction.action": (ACT + "test_slow_close_delay_and_toxicity", REGISTERED),
    "SlowCloseAction.delay": ACT + "test_slow_close_delay_and_toxicity",
    "SlowCloseAction.toxicity": ACT + "test_slow_close_delay_and_toxicity",
    "KillAction.action": (ACT + "test_process_faults_act_on_their_planned_targets", REGISTERED),
    "PauseAction.action": (ACT + "test_process_faults_act_on_their_planned_targets", REGISTERED),
    "PauseAction.for_": (ACT + "test_process_faults_act_on_their_planned_targets", PLAYER),
    "RestartAction.action": (ACT + "test_process_faults_act_on_their_planned_targets", REGISTERED),
    "BurstAction.action": (ACT + "test_burst_at_for_and_multiplier", REGISTERED),
    "SchedulerKillAction.action": (
        BYOS_FAULTS + "test_scheduler_faults_act_on_the_owned_scheduler",
        REGISTERED,
    ),
    "SchedulerPauseAction.action": (
        BYOS_FAULTS + "test_scheduler_faults_act_on_the_owned_scheduler",
        REGISTERED,
    ),
    "SchedulerPauseAction.for_": (
        BYOS_FAULTS + "test_scheduler_faults_need_their_window_and_an_owned_scheduler",
        BYOS_CHAOS + "test_a_slow_then_paused_scheduler_falls_back_in_time",
    ),
    "SchedulerSlowAction.action": (
        BYOS_FAULTS + "test_scheduler_faults_act_on_the_owned_scheduler",
        REGISTERED,
    ),
    "SchedulerSlowAction.for_": (
        BYOS_FAULTS + "test_scheduler_faults_need_their_window_and_an_owned_scheduler",
        BYOS_CHAOS + "test_a_slow_then_paused_scheduler_falls_back_in_time",
    ),
    "SchedulerSlowAction.delay": BYOS_FAULTS + "test_scheduler_faults_act_on_the_owned_scheduler",
    "BurstAction.for_": ACT + "test_burst_at_for_and_multiplier",
    "BurstAction.multiplier": ACT + "test_burst_at_for_and_multiplier",
    # --- checkers (`check` is the tag that picks the checker)
    # --- what a service process is told (ServiceSpec) and the router's instance table
    "ServiceSpec.role": SERVICE_IDENTITY,
    "ServiceSpec.id": SERVICE_IDENTITY,
    "ServiceSpec.host": SERVICE_IDENTITY,
    "ServiceSpec.port": SERVICE_IDENTITY,
    "ServiceSpec.kv_port": SERVICE_IDENTITY,
    "ServiceSpec.cluster": SVC + "test_the_cluster_is_the_network_a_container_joins",
    "ServiceSpec.hardware": PREFILL_ENGINE,
    "ServiceSpec.model": PREFILL_ENGINE,
    "ServiceSpec.byte_scale": (PREFILL_ENGINE, ENGINE_STRATEGY),
    "ServiceSpec.time_scale": SVC + "test_a_services_clock_is_its_runs_epoch_at_its_time_scale",
    "ServiceSpec.t0": SVC + "test_a_services_clock_is_its_runs_epoch_at_its_time_scale",
    "ServiceSpec.connections": SVC + "test_a_prefill_sends_kv_over_its_specs_connections",
    "ServiceSpec.tpot_slo_s": SVC + "test_decode_batch_follows_the_tpot_slo",
    "ServiceSpec.kv_timeout_s": SVC + "test_a_decode_gives_up_on_kv_after_kv_timeout_s",
    "ServiceSpec.kv_netns": "tests/transfer/test_sender_netns.py::test_a_sender_with_netns_connects_from_that_namespace",
    "ServiceSpec.kv_targets": "tests/transfer/test_kv_targets.py::test_prefill_sends_only_to_the_targets_it_was_given",
    "ServiceSpec.engine": ENGINE_STRATEGY,
    "ServiceSpec.model_seed": TORCH_SEED,
    "ServiceSpec.model_dtype": ENGINE_STRATEGY,
    "ServiceSpec.prompt_seed": ENGINE_STRATEGY,
    "ServiceSpec.unsafe_skip_kv_verify": SVC + "test_unsafe_skip_kv_verify_decodes_without_kv",
    "ServiceSpec.unsafe_fail_prefill": SVC
    + "test_unsafe_fail_prefill_answers_every_prefill_with_an_error",
    "ServiceSpec.flush_interval_s": (
        "tests/scenario/test_standing.py::test_flush_interval_zero_streams_every_token_as_produced",
        "tests/scenario/test_standing.py::test_standing_deployment_serves_records_and_cleans_up",
    ),
    "ServiceSpec.initial_role": SVC + "test_a_pd_instance_serves_its_initial_role_first",
    "ServiceSpec.role_switch_s": "tests/scheduler/test_longterm.py::test_pd_instance_switches_role_only_when_drained",
    "ServiceSpec.policy": ROUTER + "test_the_policy_name_picks_the_policy",
    "ServiceSpec.policy_config": PREDICT
    + "test_the_router_makes_the_policy_with_the_scenarios_knobs",
    "ServiceSpec.threshold_tokens": ROUTED,
    "ServiceSpec.instances": ROUTED,
    "ServiceSpec.request_timeout_s": ROUTER
    + "test_an_instance_that_never_answers_is_given_up_on_after_request_timeout_s",
    "ServiceSpec.scheduler": ROUTER + "test_scheduler_and_prefix_cache_exist_only_when_configured",
    "ServiceSpec.prefix_cache_bytes": ROUTER
    + "test_scheduler_and_prefix_cache_exist_only_when_configured",
    "InstanceInfo.id": ROUTED,
    "InstanceInfo.cluster": ROUTED,
    "InstanceInfo.role": ROUTED,
    "InstanceInfo.url": "tests/transfer/test_router_handshake.py::test_prefill_starts_only_after_the_decode_registered",
    "InstanceInfo.switchable": ROUTER + "test_a_switchable_instance_is_reached_at_its_roles_mount",
    "InstanceInfo.kv_host": ROUTED,
    "InstanceInfo.kv_port": ROUTED,
    "InstanceInfo.kv_link_host": ROUTED,
    "InstanceInfo.kv_link_port": ROUTED,
    "InstanceInfo.hardware": "tests/services/test_router_snapshot.py::test_costs_and_queue_wait_follow_the_instances_hardware",
}

RUN_FLAGS = CLI + "test_run_flags_reach_the_plan_and_the_options"
TC_UP = CLI + "test_link_tc_up_and_rate_flags"
TC_ARGS = "tests/link/test_tc_command_args.py::test_qdisc_one_way_and_wire"
TC_LIVE = "tests/link/test_link_tc.py::test_pair_shapes_and_rate_changes_live"
SERVE = CLI + "test_link_serve_flags"
FIT = "tests/profiles/test_profile_fit.py::"
FIT_FLAGS = FIT + "test_cli_flags_reach_the_fit"
VERIFY = CLI + "test_verify_model_flags"
COMPOSE = CLI + "test_compose_command_flags"

HS = "tests/scenario/test_hindsight.py::"
HS_CLI = HS + "test_cli_writes_the_table_and_prints_the_best"
SC = "tests/scenario/test_scorecard.py::"
SC_CLI = SC + "test_cli_writes_the_files_and_skips_what_the_sim_refuses"
SC_FLAGS = SC + "test_cli_substrate_hindsight_and_quiet"
SCR = "tests/scenario/test_scorecard_router.py::"

FLAGS: dict[str, Tests] = {
    "testbed hindsight --substrate": HS + "test_cli_refuses_a_live_substrate",
    "testbed hindsight --thresholds": (
        HS_CLI,
        HS + "test_best_fixed_keeps_the_best_mean_over_seeds",
    ),
    "testbed hindsight --splits": (HS_CLI, HS + "test_every_setting_is_offered_the_same_requests"),
    "testbed hindsight --no-splits": HS_CLI,
    "testbed hindsight --seeds": HS_CLI,
    "testbed hindsight --objective": (
        HS_CLI,
        HS + "test_best_fixed_keeps_the_best_mean_over_seeds",
    ),
    "testbed hindsight --out": HS_CLI,
    "testbed hindsight --jobs": HS_CLI,
    "testbed hindsight --quiet": HS_CLI,
    "testbed hindsight --set": HS + "test_cli_set_changes_the_scenario_the_grid_runs",
    "testbed scorecard --policy": (
        SC_CLI,
        SC + "test_a_policy_that_cannot_load_stops_before_any_run",
    ),
    "testbed scorecard --baseline": SC_CLI,
    "testbed policy-vectors --timeout": PV + "test_a_late_service_fails_within_the_timeout",
    "testbed policy-vectors --exact": (
        PV + "test_the_example_service_passes_every_vector",
        PV + "test_one_fixed_route_fails_only_where_the_router_would_refuse_it",
    ),
    "testbed scorecard --substrate": SC_FLAGS,
    "testbed scorecard --scenarios": SC_CLI,
    "testbed scorecard --seeds": SC_CLI,
    "testbed scorecard --router": SCR + "test_router_and_duration_reach_the_router_scorecard",
    "testbed scorecard --duration": SCR + "test_router_and_duration_reach_the_router_scorecard",
    "testbed scorecard --no-hindsight": (SC_CLI, SC_FLAGS),
    "testbed scorecard --out": SC_CLI,
    "testbed scorecard --jobs": SC_FLAGS,
    "testbed scorecard --quiet": SC_FLAGS,
    "testbed scorecard --cache": (
        SC_FLAGS,
        SC + "test_the_cache_gives_back_the_same_rows_and_only_for_library_runs",
    ),
    "testbed scorecard --no-cache": SC_CLI,
    "testbed scorecard --min-policy-share": (
        SC + "test_cli_a_service_answering_500_is_not_judged_and_exits_1"
    ),
    "testbed sweep --set": (SWEEP + "test_the_grid_is_the_product_of_the_axes", SWEEP_CLI),
    "testbed sweep --out": SWEEP_CLI,
    "testbed sweep --jobs": (SWEEP_CLI, SWEEP + "test_a_pool_gives_the_same_rows_as_one_process"),
    "testbed sweep --no-saturation": SWEEP_CLI,
    "testbed sweep --quiet": SWEEP_CLI,
    "testbed sweep --ray": SWEEP + "test_ray_without_ray_or_cluster_is_one_line",
    "testbed sweep --max-requests": (
        "tests/cli/test_cli_max_requests.py::test_the_flag_reaches_prepare_run",
        "tests/cli/test_cli_max_requests.py::test_a_lowered_cap_refuses_a_small_scenario",
    ),
    "testbed hindsight --max-requests": (
        "tests/cli/test_cli_max_requests.py::test_the_flag_reaches_prepare_run",
        "tests/cli/test_cli_max_requests.py::test_a_lowered_cap_refuses_a_small_scenario",
    ),
    "testbed scorecard --max-requests": (
        "tests/cli/test_cli_max_requests.py::test_the_flag_reaches_prepare_run",
        "tests/cli/test_cli_max_requests.py::test_a_lowered_cap_refuses_a_small_scenario",
    ),
    "testbed --version": CLI + "test_version",
    "testbed profile fit --form": FIT_FLAGS,
    "testbed profile fit --json": FIT_FLAGS,
    "testbed profile fit --max-knots": (
        FIT_FLAGS,
        FIT + "test_tolerance_and_knot_budget_change_the_fit",
    ),
    "testbed profile fit --tolerance": (
        FIT_FLAGS,
        FIT + "test_tolerance_and_knot_budget_change_the_fit",
    ),
    "testbed plan --threshold": (
        "tests/test_planner_link.py::test_plan_threshold_flag",
        "tests/test_planner_link.py::test_dense_kv_is_held_by_the_link_as_table3_says",
    ),
    "testbed plan --json": (
        "tests/cli/test_cli_plan.py::test_plan_json_has_every_deployment",
        "tests/cli/test_cli_plan.py::test_plan_table_is_readable",
    ),
    "testbed plan --max-requests": "tests/config/test_limits.py::test_max_requests_flag_of_run_and_plan",
    "testbed run --max-requests": "tests/config/test_limits.py::test_max_requests_flag_of_run_and_plan",
    "testbed run --substrate": (
        RUN_FLAGS,
        "tests/cli/test_cli_package.py::test_run_offers_the_substrates_make_substrate_knows",
        "tests/sim/test_sim_run.py::test_summary_says_sim_and_where_the_wall_time_went",
    ),
    "testbed run --seed": (
        "tests/sim/test_sim_run.py::test_seed_override_changes_the_run_and_is_recorded",
        "tests/sim/test_sim_run.py::test_seed_reaches_the_plan_on_every_substrate",
    ),
    "testbed run --policy": RUN_FLAGS,
    "testbed run --trace": RUN_FLAGS,
    "testbed run --duration": RUN_FLAGS,
    "testbed run --out": RUN_FLAGS,
    "testbed run --router": (
        "tests/scenario/test_external_router.py::test_run_router_flag_runs_the_external_router",
        "tests/scenario/test_external_router.py::test_router_option_puts_the_router_in_front_at_time_scale_1",
    ),
    "testbed run --shaper": (
        CLI + "test_shaper_overrides_the_link_shaper_and_the_header_says_which",
        "tests/scenario/test_shaper_tc.py::test_bandwidth_drop_with_the_kernel_shaper",
    ),
    "testbed run --quiet": CLI + "test_quiet_drops_the_progress_bar",
    "testbed run --no-timeline": (
        "tests/cli/test_cli_timeline.py::test_no_timeline_leaves_no_earlier_picture_behind"
    ),
    "testbed run --set": CLI + "test_set_writes_fields_of_the_scenario_for_this_run",
    "testbed run --percentiles": (
        UP + "test_percentiles_flag_of_run_and_its_errors",
        "tests/metrics/test_bench.py::test_configured_percentiles_join_the_fixed_ones",
    ),
    "testbed up --max-requests": (
        "tests/scenario/test_up_max_requests.py::"
        "test_up_max_requests_moves_the_cap_and_the_plan_keeps_no_requests"
    ),
    "testbed up --substrate": UP + "test_up_flags_reach_the_plan_and_the_options",
    "testbed up --policy": UP + "test_up_flags_reach_the_plan_and_the_options",
    "testbed up --out": (
        UP + "test_up_runs_at_time_scale_1_with_faults_by_default",
        "tests/scenario/test_standing.py::test_testbed_up_stops_on_sigint_and_writes_results",
    ),
    "testbed up --percentiles": (
        UP + "test_up_flags_reach_the_plan_and_the_options",
        "tests/metrics/test_bench.py::test_configured_percentiles_join_the_fixed_ones",
    ),
    "testbed up --time-scale": (
        UP + "test_up_runs_at_time_scale_1_with_faults_by_default",
        UP + "test_up_flags_reach_the_plan_and_the_options",
    ),
    "testbed up --router": (
        "tests/scenario/test_standing_router.py::test_up_router_stands_the_router_up_at_time_scale_1"
    ),
    "testbed up --no-faults": (
        UP + "test_up_flags_reach_the_plan_and_the_options",
        "tests/scenario/test_standing.py::test_faults_play_against_a_standing_deployment_unless_told_not_to",
    ),
    "testbed up --prometheus": (
        "tests/compose/test_prometheus.py::test_up_prometheus_flag_reaches_the_standing_deployment",
        "tests/compose/test_prometheus.py::test_prometheus_scrapes_router_and_every_worker",
    ),
    "testbed link serve --host": SERVE,
    "testbed link serve --port": (
        SERVE,
        "tests/link/test_link_cli.py::test_serve_subprocess_with_config",
    ),
    "testbed link serve --config": (
        SERVE,
        "tests/link/test_link_cli.py::test_serve_subprocess_with_config",
    ),
    "testbed link serve --seed": (
        SERVE,
        "tests/link/test_link_live.py::test_seed_makes_toxicity_reproducible",
    ),
    "testbed link serve --listen-netns": (
        SERVE,
        "tests/substrate/test_local_substrate_link.py::test_tc_shaper_puts_the_route_behind_the_kernel_shaped_veth",
    ),
    "testbed link tc down --stale": (
        CLI + "test_link_tc_show_and_down_flags",
        "tests/link/test_netns_link.py::test_tc_down_stale_removes_only_dead_runs",
    ),
    "testbed link tc up --name": TC_UP,
    "testbed link tc up --qdisc": (TC_UP, TC_ARGS),
    "testbed link tc up --one-way": (TC_UP, TC_ARGS),
    "testbed link tc up --wire": (TC_UP, TC_ARGS),
    "testbed link tc up --rate": (TC_UP, TC_LIVE),
    "testbed link tc rate --name": TC_UP,
    "testbed link tc rate --qdisc": (TC_UP, TC_ARGS),
    "testbed link tc rate --one-way": (TC_UP, TC_ARGS),
    "testbed link tc rate --wire": (TC_UP, TC_ARGS),
    "testbed link tc rate --rate": (TC_UP, TC_LIVE),
    "testbed link tc show --name": CLI + "test_link_tc_show_and_down_flags",
    "testbed link tc down --name": CLI + "test_link_tc_show_and_down_flags",
    "testbed link tc down --all": (
        CLI + "test_link_tc_show_and_down_flags",
        "tests/link/test_tc_command_args.py::test_down_all_removes_every_pair_of_this_tool",
    ),
    "testbed verify-model --prompts": VERIFY,
    "testbed verify-model --seed": VERIFY,
    "testbed verify-model --max-new-tokens": VERIFY,
    "testbed verify-model --bandwidth": VERIFY,
    "testbed verify-model --latency": VERIFY,
    "testbed verify-model --jitter": VERIFY,
    "testbed verify-model --time-scale": VERIFY,
    "testbed verify-model --dtype": VERIFY,
    "testbed verify-model --json": VERIFY,
    "python -m testbed.substrate.compose images --force": COMPOSE,
    "python -m testbed.substrate.compose down --run": COMPOSE,
    "python -m testbed.substrate.compose images --prometheus": (
        "tests/compose/test_prometheus.py::test_images_prometheus_flag_builds_the_prometheus_image"
    ),
}

EXCEPTIONS: dict[str, str] = {
    "Scenario.name": "a label: the run header, the default results directory (results/NAME) "
    "and error messages name the scenario by it; nothing a run does depends on it",
    "Scenario.description": "a label: `testbed scenarios` lists it beside the file name "
    "(tests/chaos/test_library.py requires one); nothing a run does depends on it",
}


# ------------------------------------------------------------------ what there is to cover


def _models_in(annotation: object) -> Iterator[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation
    for arg in typing.get_args(annotation):
        yield from _models_in(arg)


@cache
def config_models() -> tuple[type[BaseModel], ...]:
    """Every configuration model: testbed.config's, the scenario, the registered actions' and
    checkers' entries, the service and scheduler specs, and every model any of them holds."""
    import testbed.config
    from testbed.checkers import CHECKERS
    from testbed.config.policy import POLICY_KNOBS
    from testbed.nemesis import ACTIONS
    from testbed.scenario.schema import Scenario
    from testbed.scheduler.spec import SchedulerSpec
    from testbed.services.spec import InstanceInfo, ServiceSpec

    roots: list[type[BaseModel]] = [Scenario, ServiceSpec, InstanceInfo, SchedulerSpec]
    roots += [fault.config for fault in ACTIONS.entries()]
    roots += [entry.config for entry in CHECKERS.entries()]
    roots += list(POLICY_KNOBS.entries())  # each policy's knobs (`policy.<section>`)
    for info in pkgutil.iter_modules(testbed.config.__path__, "testbed.config."):
        module = importlib.import_module(info.name)
        roots += [
            v
            for v in vars(module).values()
            if isinstance(v, type) and issubclass(v, BaseModel) and v.__module__ == module.__name__
        ]
    seen: dict[type[BaseModel], None] = {}
    todo = list(roots)
    while todo:
        model = todo.pop()
        if model in seen:
            continue
        seen[model] = None
        for field in model.model_fields.values():
            todo.extend(_models_in(field.annotation))
    return tuple(seen)


def _owner(model: type[BaseModel], name: str) -> type:
    """The class that declares `name` (a base's field is one row, not one per subclass)."""
    for klass in model.__mro__:
        if name in inspect.get_annotations(klass):
            return klass
    raise AssertionError(f"{model.__qualname__}.{name}: no class declares it")


def field_keys(models: tuple[type[BaseModel], ...] | None = None) -> set[str]:
    return set(_field_modules(models or config_models()))


def _field_modules(models: tuple[type[BaseModel], ...]) -> dict[str, str]:
    """`Model.field` -> the module of the class that declares it."""
    out = {}
    for model in models:
        for name in model.model_fields:
            owner = _owner(model, name)
            out[f"{owner.__qualname__}.{name}"] = owner.__module__
    return out


def evidence(models: tuple[type[BaseModel], ...] | None = None) -> dict[str, Tests]:
    """The rows declared beside the models (each module's `EVIDENCE`), checked to name fields of
    that module's own models."""
    where = _field_modules(models or config_models())
    out: dict[str, Tests] = {}
    for module in sorted(set(where.values())):
        rows = getattr(sys.modules[module], "EVIDENCE", {})
        foreign = sorted(k for k in rows if where.get(k) != module)
        assert not foreign, f"{module}.EVIDENCE has rows for fields it does not define: {foreign}"
        out.update(rows)
    return out


def unproven(models: tuple[type[BaseModel], ...] | None = None) -> list[str]:
    """Fields with no row anywhere: neither beside their model nor in FIELDS or EXCEPTIONS."""
    rows = FIELDS.keys() | EXCEPTIONS.keys() | evidence(models).keys()
    return sorted(field_keys(models) - rows)


def _flags(parser: argparse.ArgumentParser, command: str) -> Iterator[str]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _flags(sub, f"{command} {name}")
        elif action.option_strings and not isinstance(action, argparse._HelpAction):
            yield f"{command} {max(action.option_strings, key=len)}"


def flag_keys() -> set[str]:
    from testbed.cli import build_parser
    from testbed.substrate.compose.__main__ import build_parser as compose_parser

    return set(_flags(build_parser(), "testbed")) | set(
        _flags(compose_parser(), "python -m testbed.substrate.compose")
    )


def _node_ids(tests: Tests) -> tuple[str, ...]:
    return (tests,) if isinstance(tests, str) else tests


@cache
def _defined(path: str) -> frozenset[str]:
    """Test functions of a module: `name` at top level, `Class::name` in a class."""
    tree = ast.parse((ROOT / path).read_text())
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.ClassDef):
            names |= {
                f"{node.name}::{n.name}"
                for n in node.body
                if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
            }
    return frozenset(names)


# ------------------------------------------------------------------ the checks


def test_every_field_has_an_entry() -> None:
    missing = unproven()
    assert not missing, (
        f"configuration fields with no test showing they change behaviour: {missing}; add a "
        "row to the EVIDENCE beside the model (or to FIELDS here; with a reason, to "
        "EXCEPTIONS), or remove the field"
    )


def test_a_field_without_evidence_fails_and_one_with_it_passes() -> None:
    """The rule can fail: a model of a module with no row for its field is unproven, and a row
    in the module's EVIDENCE proves it."""
    import types

    module = types.ModuleType("toy_evidence")
    sys.modules[module.__name__] = module
    try:
        toy = type("ToyKnobs", (BaseModel,), {"__module__": module.__name__,
                                               "__annotations__": {"dial": float}})  # fmt: skip
        assert unproven((toy,)) == ["ToyKnobs.dial"]
        module.EVIDENCE = {"ToyKnobs.dial": "tests/test_no_silent_fields.py::test_x"}  # type: ignore[attr-defined]
        assert unproven((toy,)) == []
        module.EVIDENCE = {"Other.dial": "x"}  # type: ignore[attr-defined]
        with pytest.raises(AssertionError, match="does not define"):
            evidence((toy,))
    finally:
        del sys.modules[module.__name__]


def test_a_field_has_its_row_in_one_place() -> None:
    twice = sorted(evidence().keys() & (FIELDS.keys() | EXCEPTIONS.keys()))
    assert not twice, f"rows both beside the model and in this file: {twice}"


def test_every_flag_has_an_entry() -> None:
    missing = sorted(flag_keys() - FLAGS.keys() - EXCEPTIONS.keys())
    assert not missing, (
        f"command-line flags with no test showing they change behaviour: {missing}; add a row "
        "to FLAGS (or, with a reason, to EXCEPTIONS), or remove the flag"
    )


def test_no_row_for_a_field_or_flag_that_is_gone() -> None:
    rows = FIELDS.keys() | FLAGS.keys() | EXCEPTIONS.keys() | evidence().keys()
    stale = sorted(rows - field_keys() - flag_keys())
    assert not stale, f"rows for fields or flags that no longer exist: {stale}"
    assert not (FIELDS.keys() | FLAGS.keys()) & EXCEPTIONS.keys()


def test_every_named_test_exists() -> None:
    bad: list[str] = []
    for key, tests in [*FIELDS.items(), *FLAGS.items(), *evidence().items()]:
        assert _node_ids(tests), f"{key}: names no test"
        for node in _node_ids(tests):
            path, sep, name = node.partition("::")
            test = name.rpartition("::")[2]
            if not (sep and (ROOT / path).is_file() and name in _defined(path)):
                bad.append(f"{key}: {node}")
            elif not test.startswith("test_"):
                bad.append(f"{key}: {node} is not a test function")
    assert not bad, "rows naming tests that do not exist:\n" + "\n".join(bad)


def test_every_exception_gives_its_reason() -> None:
    assert all(len(reason.split()) >= 3 for reason in EXCEPTIONS.values())


def test_model_names_are_unambiguous() -> None:
    """Rows are keyed by class name, so two models may not share one."""
    names = [m.__qualname__ for m in config_models()]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)


def test_the_walk_finds_the_models_and_the_parsers_it_should() -> None:
    """The enumeration itself can fail silently (an empty walk passes everything)."""
    fields, flags = field_keys(), flag_keys()
    assert {"LinkConfig.shaper", "NemesisEvent.at", "ServiceSpec.kv_targets"} <= fields
    assert {"testbed run --policy", "testbed link tc up --wire"} <= flags
    assert "python -m testbed.substrate.compose down --run" in flags
    assert len(fields) > 150 and len(flags) > 30
