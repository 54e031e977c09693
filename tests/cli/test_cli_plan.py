"""`testbed plan` as a user runs it: a subprocess, its stdout, stderr and exit code."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "testbed.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )


def test_plan_json_has_every_deployment() -> None:
    out = run("plan", "scenarios/paper.yaml", "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert set(doc["deployments"]) == {"prfaas-pd", "homogeneous", "naive"}
    for entry in doc["deployments"].values():
        for key in (
            "lambda_max_rps",
            "n_prfaas",
            "n_prefill",
            "n_decode",
            "offload_fraction",
            "egress_gbps",
            "theta_prfaas_rps",
            "theta_pdp_rps",
            "theta_pdd_rps",
        ):
            assert key in entry
    assert doc["deployments"]["prfaas-pd"]["threshold_tokens"] == pytest.approx(19_400, rel=0.05)
    assert doc["deployments"]["prfaas-pd"]["lambda_max_rps"] == pytest.approx(3.24, rel=0.03)


def test_plan_table_is_readable() -> None:
    out = run("plan", "scenarios/paper.yaml")
    assert out.returncode == 0, out.stderr
    assert "lambda_max (req/s)" in out.stdout
    assert "3 / 5" in out.stdout and "9 / 3" in out.stdout


BASE = "deployments: {a: {kind: homogeneous, local: {hardware: h20x8, instances: 12}%s}}\n"


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        (
            BASE % ", link: {bandwidth: 100Gbpz}",
            "deployments.a.link.bandwidth: unknown bandwidth unit",
        ),
        (
            BASE % ", link: {bandwidth: -5Gbps}",
            "deployments.a.link.bandwidth: must be greater than zero",
        ),
        (
            "deployments: {a: {kind: homogeneous, local: {hardware: h20x8}}}\n",
            "deployments.a.local.instances: missing field",
        ),
        (
            "deployments: {a: {kind: homogeneous, local: {hardware: b200, instances: 3}}}\n",
            "unknown hardware profile 'b200'",
        ),
        (
            "deployments: {a: {kind: homogeneous, model: gpt9,"
            " local: {hardware: h20x8, instances: 3}}}\n",
            "unknown model profile 'gpt9'",
        ),
        ("deployments: {a: [kind: homogeneous\n", ":2: YAML syntax error"),
        (BASE % ", colour: red", "deployments.a.colour: unknown field"),
    ],
)
def test_bad_input_is_one_line_exit_2(tmp_path: Path, text: str, needle: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    out = run("plan", str(path))
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert str(path) in lines[0] and needle in lines[0]
    assert "Traceback" not in out.stderr


def test_missing_file_is_one_line_exit_2(tmp_path: Path) -> None:
    out = run("plan", str(tmp_path / "nope.yaml"))
    assert out.returncode == 2
    assert "no such file" in out.stderr and "Traceback" not in out.stderr


def test_run_rejects_bad_arguments_with_one_line(tmp_path: Path) -> None:
    for args, needle in (
        (("run", "scenarios/paper.yaml", "--policy", "random"), "unknown policy 'random'"),
        (("run", str(tmp_path / "missing.yaml")), "no such file"),
        (("run", "scenarios/paper.yaml", "--trace", str(tmp_path / "t.jsonl")), "t.jsonl"),
    ):
        out = run(*args)
        assert out.returncode == 2, (args, out.stderr)
        assert needle in out.stderr and "Traceback" not in out.stderr
    out = run("run", "scenarios/paper.yaml", "--duration", "-3")
    assert out.returncode == 2 and "must be greater than zero" in out.stderr


def test_scenarios_lists_the_library() -> None:
    out = run("scenarios")
    assert out.returncode == 0, out.stderr
    names = [line.split()[0] for line in out.stdout.splitlines()]
    assert {"burst", "paper"} <= set(names)
