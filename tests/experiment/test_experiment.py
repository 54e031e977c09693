"""testbed.experiment: grids declared as `--set` settings, validated like `--set`, run into typed
rows; the window metrics every bench and the sweep share (testbed.metrics.window)."""

from __future__ import annotations

import pytest

from testbed.errors import UserError
from testbed.experiment import (
    Grid,
    Run,
    backlog,
    completion_rate,
    run_experiment,
    setting_text,
    steady_window,
    ttft_p90,
)
from testbed.metrics.records import RequestRecord

TINY = {"duration": "30s", "checkers": [], "nemesis": []}


def rec(i: int, arrival: float, ttft: float | None, end: float | None) -> RequestRecord:
    r = RequestRecord(id=f"r{i}", input_tokens=100, output_tokens=4, arrival=arrival)
    if ttft is not None:
        r.first_token = arrival + ttft
    if end is not None:
        r.status = "completed"
        r.last_token = end
        r.tokens_out = 4
    return r


def test_steady_window_skips_the_first_sixth() -> None:
    assert steady_window(600.0) == (100.0, 600.0)


def test_completion_rate_counts_last_tokens_inside_the_window() -> None:
    recs = [rec(0, 0, 1, 5), rec(1, 0, 1, 10), rec(2, 0, 1, 20), rec(3, 0, None, None)]
    assert completion_rate(recs, 5, 15) == pytest.approx(2 / 10)
    assert backlog(recs, 12) == 2  # r2 not finished, r3 never


def test_ttft_p90_over_arrivals_in_a_half_open_window() -> None:
    recs = [rec(i, float(i), float(i), 100) for i in range(11)] + [rec(99, 5, None, None)]
    assert ttft_p90(recs, 0, 11) == pytest.approx(9.0)
    assert ttft_p90(recs, 0, 10) == pytest.approx(8.1)  # arrival 10 is outside [0, 10)
    assert ttft_p90(recs, 50, 60) is None


@pytest.mark.parametrize(
    ("value", "text"),
    [(1.2, "1.2"), (None, "null"), (True, "true"), (3, "3"), ("10Gbps", "10Gbps"), ([], "[]")],
)
def test_setting_text_writes_yaml_scalars(value: object, text: str) -> None:
    assert setting_text(value) == text  # type: ignore[arg-type]


def test_grid_order_fixed_then_axes_policies_seeds() -> None:
    g = Grid.of(
        "paper",
        fixed={"duration": "30s"},
        axes={"workload.arrivals.load": [0.5, 1.0]},
        policies=["prfaas-static", "prfaas"],
        seeds=[1, 2],
    )
    settings = g.settings()
    assert len(settings) == 8
    assert settings[0] == (
        ("duration", "30s"),
        ("workload.arrivals.load", "0.5"),
        ("policy.name", "prfaas-static"),
        ("seed", "1"),
    )
    assert [dict(s)["seed"] for s in settings[:2]] == ["1", "2"]


def test_a_path_set_twice_is_refused() -> None:
    with pytest.raises(UserError, match="set once"):
        Grid.of("paper", fixed={"seed": 1}, seeds=[2]).settings()


def test_variants_are_validated_like_set() -> None:
    """A value without its unit fails as `testbed run --set` fails, naming the setting."""
    with pytest.raises(UserError, match="--set duration=30"):
        Grid.of("paper", fixed={"duration": 30}).scenario_of()


def _rate(run: Run) -> float:
    return completion_rate(run.records, *steady_window(run.duration_s))


def test_rows_are_typed_in_grid_order_and_the_same_for_any_jobs() -> None:
    g = Grid.of("paper", fixed={**TINY, "workload.arrivals.load": 1.2}, seeds=[1, 2])
    one = run_experiment(g, _rate, checkers=False)
    two = run_experiment(g, _rate, jobs=2, checkers=False)
    assert [r.setting("seed") for r in one] == ["1", "2"]
    assert all(isinstance(r.value, float) and r.value > 0 for r in one)
    assert one == two


def test_cases_bundle_settings_and_with_fixed_appends() -> None:
    g = Grid.of(
        "paper",
        cases=[
            {"deployment": "prfaas-pd", "policy.name": "prfaas-static"},
            {"deployment": "naive", "policy.name": "naive"},
        ],
        seeds=[1, 2],
    )
    settings = g.settings()
    assert [dict(s)["deployment"] for s in settings] == ["prfaas-pd"] * 2 + ["naive"] * 2
    assert dict(settings[3])["policy.name"] == "naive"
    later = g.with_fixed({"duration": "60s"}).with_fixed({"duration": "90s"})
    assert later.scenario_of().duration == 90.0
