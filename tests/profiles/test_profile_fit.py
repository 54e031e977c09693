"""#17 item 5: `testbed profile fit` turns measurements into profile knots. Acceptance: 20
points sampled from the paper's h20x8 prefill curve give back that curve within 1% (default)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from testbed.cli import main
from testbed.config.profiles import load_profile_file
from testbed.profiles import MODELS
from testbed.profiles.fit import fit_affine, fit_curve

H20 = MODELS["internal-1t-hybrid"].prefill["h20x8"]
GRID = np.geomspace(1024, 128 * 1024, 400)


def sampled(n: int = 20) -> tuple[np.ndarray, list[float]]:
    xs = np.geomspace(1024, 128 * 1024, n)
    return xs, [H20(x) for x in xs]


def worst_vs_truth(curve) -> float:  # type: ignore[no-untyped-def]
    return max(abs(curve(g) - H20(g)) / H20(g) for g in GRID)


def test_pwl_fit_of_20_points_reproduces_the_h20_curve_within_1_percent() -> None:
    xs, ys = sampled()
    fit = fit_curve(xs, ys)
    assert fit.form == "pwl"
    assert worst_vs_truth(fit.curve) < 0.01  # measured here: 0.03%
    assert fit.max_rel_error < 0.01
    assert len(fit.curve.xs) <= 8


def test_tolerance_and_knot_budget_change_the_fit() -> None:
    xs, ys = sampled()
    two = fit_curve(xs, ys, max_knots=2)
    assert len(two.curve.xs) == 2 and two.max_rel_error > 0.05  # a line cannot follow the kinks
    loose = fit_curve(xs, ys, tolerance=0.2)
    tight = fit_curve(xs, ys, tolerance=0.001)
    assert len(loose.curve.xs) < len(tight.curve.xs)


def test_smooth_form_is_a_quadratic_knotted_within_the_budget() -> None:
    x = np.linspace(1000, 100_000, 30)
    y = 0.1 + 2e-5 * x + 3e-10 * x * x
    few = fit_curve(x, y, form="smooth", max_knots=6)
    more = fit_curve(x, y, form="smooth", max_knots=12)
    assert few.form == "smooth" and len(few.curve.xs) == 6
    assert more.max_rel_error < few.max_rel_error < 0.03  # measured: 0.3% and 2.2%
    assert more.curve(1000) == pytest.approx(0.1 + 2e-5 * 1000 + 3e-10 * 1e6, rel=0.01)


def test_affine_fit_recovers_a_decode_step_model() -> None:
    d = MODELS["internal-1t-hybrid"].decode["h20x8"]
    batches = list(range(1, 33))
    fit = fit_affine(batches, [d.step_time(b) for b in batches])
    assert (fit.base, fit.per_unit) == (pytest.approx(0.015), pytest.approx(0.0005))


def csv(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "m.csv"
    p.write_text(text)
    return p


def test_cli_prints_knots_a_profile_file_accepts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    xs, ys = sampled()
    path = csv(
        tmp_path,
        "tokens,seconds\n" + "".join(f"{x:.0f},{y:.6f}\n" for x, y in zip(xs, ys, strict=True)),
    )
    assert main(["profile", "fit", str(path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# prefill time by prompt tokens, pwl: 20 points")
    knots = out.split("prefill:\n", 1)[1]
    profile = tmp_path / "p.yaml"
    profile.write_text(
        "model: {name: fitted-h20, layers: {full: 1}, kv: {per_token: 1KiB}}\n"
        "hardware:\n  fittedhw:\n    prefill:\n"
        + "".join(f"    {line}\n" for line in knots.splitlines())
    )
    model = load_profile_file(profile).model  # the printed knots load as they are, units and all
    assert model.name == "fitted-h20"
    fitted = MODELS["fitted-h20"].prefill["fittedhw"]
    assert worst_vs_truth(fitted) < 0.01


def test_cli_flags_reach_the_fit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    xs, ys = sampled()
    path = csv(
        tmp_path, "length,seconds\n" + "".join(f"{x},{y}\n" for x, y in zip(xs, ys, strict=True))
    )
    assert main(["profile", "fit", str(path), "--json", "--max-knots", "3"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert len(doc["prefill"]) == 3 and doc["points"] == 20
    assert (
        main(["profile", "fit", str(path), "--json", "--form", "smooth", "--max-knots", "5"]) == 0
    )
    assert json.loads(capsys.readouterr().out)["fit"].endswith("smooth")
    assert main(["profile", "fit", str(path), "--json", "--tolerance", "50%"]) == 0
    assert len(json.loads(capsys.readouterr().out)["prefill"]) == 2  # a line is within 50%
    batch = csv(tmp_path, "batch,seconds\n1,0.0155\n8,0.019\n16,0.023\n")
    assert main(["profile", "fit", str(batch)]) == 0
    assert "decode: {step_base: 15ms, step_per_seq: 500us}" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("", "empty"),
        ("x,y\n1,2\n", ":1: expected a header"),
        ("tokens,watts\n1,2\n", "second column must be seconds"),
        ("tokens,seconds\n1,2\n3,oops\n", ":3: expected two numbers"),
        ("tokens,seconds\n1,2\n3,-1\n", ":3: values must be finite"),
        ("tokens,seconds\n1,2\n1,3\n", "at least two measurements at different x"),
    ],
)
def test_bad_measurements_are_one_line_naming_file_and_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, needle: str
) -> None:
    assert main(["profile", "fit", str(csv(tmp_path, text))]) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1
