"""Every bench script that runs only on the sim (or runs nothing but the planner or a policy's
`decide`) runs here, on tiny options, in a few seconds each: a script that no longer runs
fails `make test`, not its next user (issue #37).

Exempt, with the reason (docs/experiments.md lists them too):
- aiperf_drive.py: NVIDIA AIPerf, installed into its own .venv-aiperf, against `testbed up`;
- facade_cost.py, fidelity.py, long_prompts.py, policy_http.py, prefix_cache.py, scheduler.py,
  receiver_flood.py, transfer_throughput.py: live processes and sockets on this machine
  (minutes per figure, and their point is the wall clock);
- link_accuracy.py, shaper_agreement.py: live, and the tc shaper needs root;
- link_cpu.py, transfer_cpu.py: live emulator or transfer processes and sockets (their figure
  is its CPU); floor_relay.py is link_cpu.py's relay process; live_targets.py runs both (and
  link_accuracy.py's bandwidth sweep, receiver_flood.py);
- router_faults.py: live, the external routers (vllm-router, SGLang's gateway) installed;
- image_build.py: a Docker engine, and it rebuilds the project's images;
- real_model_timing.py: torch (the `model` extra);
- sim_vs_live.py: its live leg (the sim leg alone is what the other smoke tests run);
- lifecycle_parity.py: compares two checkouts of the project (before and after a change);
- provenance.py, predict_grid.py, predict_hindsight.py, per_copy.py: helpers the scripts import.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SMOKE: dict[str, list[str]] = {
    "sim_saturation.py": ["--duration", "60s"],
    "sim_gap.py": ["--duration", "60s"],
    "sim_scale.py": ["--factor", "1", "--duration", "60", "--cpu", "-1", "--repeat", "2"],
    "sim_speed.py": ["--duration", "130", "--repeat", "1", "--cpu", "-1"],
    "sim_growth.py": [
        "--trace",
        str(ROOT / "scenarios/traces/mooncake-small.jsonl"),
        "--duration",
        "150",
        "--times",
        "2",
        "--policy",
        "prfaas",
        "--repeat",
        "1",
        "--cpu",
        "-1",
    ],
    "sim_cost_split.py": [
        "--trace",
        str(ROOT / "scenarios/traces/mooncake-small.jsonl"),
        "--duration",
        "150",
        "--policy",
        "prfaas-static",
        "--policy",
        "prfaas-predict",
        "--repeat",
        "1",
        "--cpu",
        "-1",
    ],
    "sim_targets.py": [
        "--trace",
        str(ROOT / "scenarios/traces/mooncake-small.jsonl"),
        "--duration",
        "150",
        "--repeat",
        "1",
        "--times",
        "2",
        "--cpu",
        "-1",
        "--scale-factor",
        "1",
        "--scale-duration",
        "60",
        "--scale-repeat",
        "1",
    ],
    "sim_sweep.py": [
        "--set",
        "deployments.prfaas-pd.prfaas.instances=2,4",
        "--set",
        "duration=120s",
        "--no-saturation",
    ],
    "planner_search.py": ["--repeat", "1", "--no-exhaustive"],
    "routing_decision.py": ["--instances", "40", "--requests", "200"],
    "sample_run.py": [
        "--substrate",
        "sim",
        "--serve",
        "least-ttft",
        "--policy",
        "{url}#timeout=50ms&fallback=prfaas-nolongterm",
    ],
    "scorecard_cost.py": ["--scenarios", "paper", "--seeds", "1"],
    "predict.py": ["--only", "saturation", "--seeds", "1", "--duration", "60", "--jobs", "1"],
    "predict_variants.py": ["--only", "floor", "--seeds", "1", "--jobs", "1"],
    "walkthrough.py": ["--only", "vectors"],  # its sim and live steps: minutes
    "thesis.py": [
        "--substrate",
        "sim",
        "--duration",
        "30s",
        "--policies",
        "prfaas-static",
        "--skip-saturation",
        "--skip-sim-sweep",
    ],
}
"""Script -> tiny options."""
SECTION = {
    "planner_search.py": "planner_search",
    "routing_decision.py": "routing_decision",
    "sample_run.py": "sample-burst-sim-least-ttft",
    "scorecard_cost.py": "scorecard_cost",
    "sim_cost_split.py": "cost_split-cpu",
    "sim_gap.py": "sim_gap",
    "sim_growth.py": "growth-x2",
    "sim_scale.py": "sim_scale-prfaas-static",
    "sim_sweep.py": "sim_sweep",
    "sim_targets.py": "sim_targets",
    "walkthrough.py": "walkthrough-vectors",
}
"""Scripts whose smoke run also writes its `--report` section (named so)."""
EXEMPT = {
    "aiperf_drive.py": "AIPerf in its own venv, live",
    "durations.py": "live: times the library, the chaos suite and the scorecard as run",
    "facade_cost.py": "live",
    "fidelity.py": "live",
    "lifecycle_parity.py": "two checkouts of the project (before and after a change)",
    "floor_relay.py": "link_cpu.py's relay process, live sockets",
    "image_build.py": "Docker engine; rebuilds the project's images",
    "link_accuracy.py": "live, tc needs root",
    "link_cpu.py": "live emulator processes and sockets",
    "live_targets.py": "live emulator and transfer processes and sockets",
    "long_prompts.py": "live",
    "per_copy.py": "a helper of sim_speed.py (--per-copy), not a bench",
    "policy_http.py": "live",
    "policy_late.py": "live",
    "predict_grid.py": "a helper of the predict*.py scripts, not a bench",
    "predict_hindsight.py": "a helper of predict.py, not a bench",
    "predict_live.py": "live",
    "prefix_cache.py": "live",
    "provenance.py": "a helper, not a bench",
    "real_model_engines.py": "torch, live",
    "real_model_timing.py": "torch",
    "receiver_flood.py": "live",
    "router_faults.py": "live external routers",
    "router_scorecard.py": "live external routers",
    "scheduler.py": "live",
    "shaper_agreement.py": "live, tc needs root",
    "sim_vs_live.py": "live leg",
    "transfer_cpu.py": "live transfer sockets",
    "transfer_throughput.py": "live",
}


def test_every_script_is_smoked_or_exempt() -> None:
    scripts = {p.name for p in (ROOT / "bench").glob("*.py")}
    assert scripts <= set(SMOKE) | set(EXEMPT), "list a new script in SMOKE or EXEMPT"
    assert set(SMOKE) <= scripts
    assert not set(SMOKE) & set(EXEMPT)


@pytest.mark.parametrize("script", sorted(SMOKE))
def test_sim_bench_runs(script: str, tmp_path: Path) -> None:
    argv = SMOKE[script]
    if script == "thesis.py":
        argv = [*argv, "--reports", str(tmp_path)]
    if script in SECTION:
        argv = [*argv, "--report", str(tmp_path / "report.md")]
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / script), *argv],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip()
    if script in SECTION:  # what it printed, in its section, under the provenance header
        report = (tmp_path / "report.md").read_text()
        assert f"<!-- {SECTION[script]}:start -->\n- command: `python bench/{script}" in report
        assert done.stdout.strip().splitlines()[-1] in report
