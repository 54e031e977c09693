"""Property tests for scenario parsing: any input either loads or raises one ConfigError line
that names the file and the field (or line); never a traceback of another kind."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from testbed.errors import ConfigError
from testbed.nemesis.actions.bandwidth import BandwidthAction
from testbed.scenario.schema import load_scenario

BASE: dict[str, Any] = {
    "deployments": {
        "d": {
            "kind": "prfaas-pd",
            "prfaas": {"hardware": "h200x8", "instances": 1},
            "local": {"hardware": "h20x8", "instances": 2, "prefill": 1, "decode": 1},
        }
    }
}
SETTINGS = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**6), 10**6),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(["10s", "5ms", "-3s", "1Gbps", "abc", "0", "100Gbpz", "1e400s", "2K"]),
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=6,
)
FIELDS = [
    "action",
    "at",
    "for",
    "target",
    "count",
    "bandwidth",
    "rtt",
    "jitter",
    "mode",
    "timeout",
    "delay",
    "toxicity",
    "multiplier",
    "bogus",
]
CHECK_FIELDS = ["check", "p", "max", "max_fraction", "fault", "within", "ttft", "streak", "nope"]


def _load(tmp: Path, doc: Any) -> Any:
    path = tmp / "s.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path, load_scenario


def _loads_or_names_field(path: Path) -> None:
    try:
        load_scenario(path)
    except ConfigError as exc:
        msg = str(exc)
        assert msg.startswith(f"{path}: "), msg
        assert "\n" not in msg
        where = msg.removeprefix(f"{path}: ").split(":")[0]
        assert where, msg


@SETTINGS
@given(st.lists(st.dictionaries(st.sampled_from(FIELDS), values, max_size=5), max_size=3))
def test_any_nemesis_list_loads_or_names_the_field(tmp_path: Path, nemesis: list[Any]) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({**BASE, "nemesis": nemesis}, allow_unicode=True))
    _loads_or_names_field(path)


@SETTINGS
@given(st.lists(st.dictionaries(st.sampled_from(CHECK_FIELDS), values, max_size=5), max_size=3))
def test_any_checker_list_loads_or_names_the_field(tmp_path: Path, checkers: list[Any]) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({**BASE, "checkers": checkers}, allow_unicode=True))
    _loads_or_names_field(path)


@SETTINGS
@given(st.text(max_size=200))
def test_any_text_loads_or_gives_one_line(tmp_path: Path, text: str) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(text)
    try:
        load_scenario(path)
    except ConfigError as exc:
        assert str(exc).startswith(str(path)) and "\n" not in str(exc)


@SETTINGS
@given(
    at=st.floats(0, 10_000, allow_nan=False),
    dur=st.floats(0.001, 10_000, allow_nan=False),
    unit=st.sampled_from([("s", 1.0), ("ms", 1e-3), ("min", 60.0)]),
    gbps=st.floats(0.001, 10_000, allow_nan=False),
)
def test_valid_faults_round_trip_in_si(
    at: float, dur: float, unit: tuple[str, float], gbps: float
) -> None:
    suffix, mult = unit
    ev = BandwidthAction.model_validate(
        {
            "action": "bandwidth",
            "at": f"{at!r}{suffix}",
            "for": f"{dur!r}{suffix}",
            "bandwidth": f"{gbps!r}Gbps",
        }
    )
    assert math.isclose(ev.at, at * mult, rel_tol=1e-9, abs_tol=1e-12)
    assert ev.end is not None and math.isclose(ev.end, (at + dur) * mult, rel_tol=1e-9)
    assert math.isclose(ev.bandwidth or 0, gbps * 1e9 / 8, rel_tol=1e-9)


@pytest.mark.parametrize(
    ("nemesis", "expect"),
    [
        ({"action": "kill", "at": "10s"}, "nemesis.0: action 'kill' needs field 'target'"),
        ({"action": "pause", "at": "1s", "target": "local-decode"}, "needs field 'for'"),
        ({"action": "kill", "at": "1s", "target": "gpu-7"}, "nemesis.0.target: unknown target"),
        ({"action": "partition", "at": "1s", "bandwidth": "1Gbps"}, "does not apply"),
        ({"action": "bandwidth", "at": "1s", "bandwidth": "1Gbpz"}, "nemesis.0.bandwidth: unknown"),
        ({"action": "burst", "at": "1s", "for": "2s", "multiplier": 0.5}, "nemesis.0.multiplier"),
        ({"action": "explode", "at": "1s"}, "nemesis.0.action"),
        ({"action": "latency", "at": "-1s", "rtt": "1ms"}, "nemesis.0.at: must not be negative"),
        ({"action": "latency", "at": "1s"}, "needs 'rtt' or 'jitter'"),
        (
            {"action": "kill", "at": "1s", "target": "local-decode", "frobnicate": 1},
            "nemesis.0.frobnicate: unknown field",
        ),
    ],
)
def test_bad_faults_name_file_and_field(
    tmp_path: Path, nemesis: dict[str, Any], expect: str
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({**BASE, "nemesis": [nemesis]}))
    with pytest.raises(ConfigError) as info:
        load_scenario(path)
    assert str(info.value).startswith(f"{path}: ")
    assert expect in str(info.value)


@pytest.mark.parametrize(
    ("checker", "expect"),
    [
        ({"check": "ttft"}, "checkers.0: check 'ttft' needs exactly one of 'max', 'max_ratio'"),
        (
            {"check": "ttft", "max_ratio": 2},
            "checkers.0: 'max_ratio' compares with the time before a fault: set 'during'",
        ),
        ({"check": "reroute", "fault": "partition"}, "needs field 'within'"),
        ({"check": "recover", "fault": "kill", "within": "1s"}, "needs field 'ttft'"),
        ({"check": "ttft", "max": "10 parsecs"}, "checkers.0.max"),
        ({"check": "ttft", "max": "1s", "p": 101}, "checkers.0.p"),
        ({"check": "vibes"}, "checkers.0.check"),
    ],
)
def test_bad_checkers_name_file_and_field(
    tmp_path: Path, checker: dict[str, Any], expect: str
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({**BASE, "checkers": [checker]}))
    with pytest.raises(ConfigError, match=None) as info:
        load_scenario(path)
    assert expect in str(info.value), str(info.value)


def test_malformed_yaml_and_unknown_scenario(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("nemesis:\n  - {action: kill, at: 10s\n")
    with pytest.raises(ConfigError, match=r"broken\.yaml:\d+: YAML syntax error"):
        load_scenario(path)
    with pytest.raises(ConfigError, match="no such file"):
        load_scenario(tmp_path / "nope.yaml")


def test_every_library_scenario_loads() -> None:
    root = Path(__file__).resolve().parents[2] / "scenarios"
    for path in sorted(root.glob("*.yaml")):
        sc = load_scenario(path)
        assert sc.description and "\n" not in sc.description, path
