"""#17 item 6: units and names, strictly. A duration, size or bandwidth in a file must carry its
unit; a typo gets the closest known field; `plan` refuses an unknown policy as `run` does; library
scenarios resolve by name from any directory; CLI durations take units."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from testbed.cli import main
from testbed.config import LinkConfig
from testbed.config.catalog import unit_fields
from testbed.config.profiles import ProfileFile
from testbed.errors import ConfigError, UserError
from testbed.scenario.library import LIBRARY_DIR, resolve_scenario
from testbed.scenario.schema import Scenario, load_scenario

ROOT = Path(__file__).resolve().parents[2]

BASE = """\
deployments:
  d:
    kind: prfaas-pd
    local: {{instances: 4, hardware: h20x8}}
    prfaas: {{instances: 2, hardware: h200x8}}
    link: {{bandwidth: {bw}, rtt: {rtt}}}
duration: {duration}
"""


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "s.yaml"
    p.write_text(text)
    return p


def load(tmp_path: Path, bw: str = "100Gbps", rtt: str = "10ms", duration: str = "60s") -> Scenario:
    return load_scenario(write(tmp_path, BASE.format(bw=bw, rtt=rtt, duration=duration)))


@pytest.mark.parametrize(
    ("field", "kw"),
    [
        ("deployments.d.link.rtt", {"rtt": "10"}),
        ("deployments.d.link.rtt", {"rtt": "'10'"}),  # a quoted bare number too
        ("deployments.d.link.bandwidth", {"bw": "100"}),
        ("duration", {"duration": "60"}),
    ],
)
def test_a_bare_number_in_a_file_names_the_file_and_field(
    tmp_path: Path, field: str, kw: dict[str, str]
) -> None:
    with pytest.raises(ConfigError) as err:
        load(tmp_path, **kw)
    msg = str(err.value)
    assert msg.startswith(f"{tmp_path / 's.yaml'}: {field}: ")
    assert "has no unit" in msg
    assert "\n" not in msg


def test_with_units_it_loads_and_zero_needs_none(tmp_path: Path) -> None:
    sc = load(tmp_path, rtt="0")
    link = sc.deployments["d"].link
    assert link is not None
    assert link.rtt == 0.0
    assert link.bandwidth == pytest.approx(100e9 / 8)
    assert load(tmp_path, rtt="20ms").deployments["d"].link.rtt == pytest.approx(0.02)  # type: ignore[union-attr]


def test_token_counts_may_stay_bare(tmp_path: Path) -> None:
    text = (
        BASE.format(bw="100Gbps", rtt="10ms", duration="60s") + "workload: {output_tokens: 512}\n"
    )
    assert load_scenario(write(tmp_path, text)).workload.output_tokens == 512


def test_python_callers_still_pass_si_numbers() -> None:
    link = LinkConfig.model_validate({"bandwidth": 1e9, "rtt": 0.01})
    assert (link.bandwidth, link.rtt) == (1e9, 0.01)


def test_a_typo_gets_the_closest_known_field(tmp_path: Path) -> None:
    text = BASE.format(bw="100Gbps", rtt="10ms", duration="60s").replace("bandwidth", "bandwith")
    with pytest.raises(
        ConfigError, match=r"link\.bandwith: unknown field; did you mean 'bandwidth'"
    ):
        load_scenario(write(tmp_path, text))


def test_a_typo_in_a_nemesis_entry_is_named_before_the_field_it_hides(tmp_path: Path) -> None:
    text = BASE.format(bw="100Gbps", rtt="10ms", duration="60s")
    text += "nemesis:\n  - {action: kill, target: prefill-0, att: 10s}\n"
    with pytest.raises(ConfigError, match=r"nemesis\.0\.att: unknown field; did you mean 'at'"):
        load_scenario(write(tmp_path, text))


def test_no_suggestion_for_a_field_like_nothing(tmp_path: Path) -> None:
    text = BASE.format(bw="100Gbps", rtt="10ms", duration="60s") + "zzzqqq: 1\n"
    with pytest.raises(ConfigError) as err:
        load_scenario(write(tmp_path, text))
    assert str(err.value).endswith("zzzqqq: unknown field")


def test_plan_refuses_an_unknown_policy_as_run_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = BASE.format(bw="100Gbps", rtt="10ms", duration="60s") + "policy: {name: nonsense}\n"
    path = write(tmp_path, text)
    for argv in (["plan", str(path)], ["run", str(path), "--quiet", "--out", str(tmp_path / "o")]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "policy.name: unknown policy 'nonsense'" in err, argv
    assert not (tmp_path / "o").exists()


def test_library_names_resolve_and_paths_stay_paths(tmp_path: Path) -> None:
    assert resolve_scenario("burst") == LIBRARY_DIR / "burst.yaml"
    assert resolve_scenario("burst.yaml") == LIBRARY_DIR / "burst.yaml"
    own = write(tmp_path, "x")
    assert resolve_scenario(str(own)) == own
    with pytest.raises(UserError, match=r"no library scenario of that name; library: .*burst"):
        resolve_scenario("no-such-scenario")
    assert (ROOT / "scenarios").resolve() == LIBRARY_DIR  # the repository's view of it


def test_scenarios_and_plan_work_from_any_directory(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    listed = subprocess.run(
        [sys.executable, "-m", "testbed.cli", "scenarios"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    assert {line.split()[0] for line in listed.splitlines()} == {
        p.stem for p in LIBRARY_DIR.glob("*.yaml")
    }
    planned = subprocess.run(
        [sys.executable, "-m", "testbed.cli", "plan", "paper", "--json"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    assert '"prfaas-pd"' in planned


@pytest.mark.parametrize(
    ("text", "seconds"), [("20s", 20.0), ("2m", 120.0), ("500ms", 0.5), ("7", 7.0)]
)
def test_duration_flag_takes_units(text: str, seconds: float) -> None:
    from testbed.cli import build_parser

    args = build_parser().parse_args(["run", "burst", "--duration", text])
    assert args.duration == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["2x", "-3s", "0"])
def test_duration_flag_refuses_nonsense(text: str, capsys: pytest.CaptureFixture[str]) -> None:
    from testbed.cli import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args(["run", "burst", "--duration", text])
    assert "--duration" in capsys.readouterr().err


def test_docs_list_every_field_that_needs_a_unit() -> None:
    docs = (ROOT / "docs" / "scenarios.md").read_text()
    section = docs[docs.index("## Fields that need a unit") :]
    in_scenario = [p for p in unit_fields(Scenario) if not p.startswith("profiles[]")]
    missing = [p for p in in_scenario if f"`{p}`" not in section]
    assert not missing, f"docs/scenarios.md does not list: {missing}"
    assert "`deployments.*.link.rtt`" in section
    profiles = (ROOT / "docs" / "profiles.md").read_text()
    missing = [p for p in unit_fields(ProfileFile) if f"`{p}`" not in profiles]
    assert not missing, f"docs/profiles.md does not list: {missing}"
