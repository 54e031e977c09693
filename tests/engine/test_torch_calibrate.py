"""`time_scale: auto` and the calibration behind it: the largest time_scale whose budgets cover
MARGIN x the host's compute, a requested one above it refused with one line naming it, the
calibration cached per model config. Uses fixed calibrations (no timing is asserted)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from testbed.config import ScaleConfig
from testbed.engine.torch import calibrate, live
from testbed.engine.torch.calibrate import MARGIN, Calibration, largest_time_scale
from testbed.errors import UserError
from testbed.profiles import MODELS
from testbed.scenario.plan import RunOptions, prepare_run
from testbed.scenario.schema import load_scenario

pytestmark = pytest.mark.model

ROOT = Path(__file__).resolve().parents[2]
PROFILE = MODELS["internal-1t-hybrid"]


def _cal(prefill_ms: float, decode_ms: float) -> Calibration:
    return Calibration(
        "m",
        "h",
        "t",
        "now",
        prefill_layer_s={64: prefill_ms / 1e3, 512: prefill_ms / 1e3},
        decode_pass_s={64: decode_ms / 1e3, 1024: decode_ms / 1e3},
    )


def test_largest_time_scale_is_the_tightest_step_with_its_margin() -> None:
    budget_prefill = PROFILE.prefill_time("h200x8", 300) / 8
    budget_decode = PROFILE.decode["h20x8"].step_time(1)
    # prefill-bound: 10 ms per layer against ~50 ms of budget
    c = largest_time_scale(_cal(10, 0.1), PROFILE, 8, [("h200x8", 300)], "h20x8", 20, 400, 32)
    assert c.largest == pytest.approx(budget_prefill / (MARGIN * 0.010), rel=0.05)
    assert c.largest <= budget_prefill / (MARGIN * 0.010)
    assert "prefill layer of 300 tokens on h200x8" in c.limit
    # decode-bound: batch 1 has the smallest decode budget
    c = largest_time_scale(_cal(0.1, 5), PROFILE, 8, [("h200x8", 300)], "h20x8", 20, 400, 32)
    assert c.largest == pytest.approx(budget_decode / (MARGIN * 0.005), rel=0.05)
    assert "decode step of batch 1" in c.limit
    # a slower host gets a smaller time_scale
    slow = largest_time_scale(_cal(20, 0.1), PROFILE, 8, [("h200x8", 300)], "h20x8", 20, 400, 32)
    assert (
        slow.largest
        < largest_time_scale(
            _cal(10, 0.1), PROFILE, 8, [("h200x8", 300)], "h20x8", 20, 400, 32
        ).largest
    )


def _fixed_calibration(monkeypatch: pytest.MonkeyPatch, cal: Calibration) -> None:
    monkeypatch.setattr(calibrate, "calibration_for", lambda config, refresh=False: cal)


def test_auto_resolves_and_a_requested_time_scale_above_it_is_refused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _fixed_calibration(monkeypatch, _cal(5, 1))
    sc = load_scenario(ROOT / "scenarios" / "real-model.yaml")
    assert sc.scale.auto
    rp = prepare_run(sc, RunOptions(out_dir=tmp_path, progress=False, duration_s=30.0))
    k = rp.scenario.scale.time_scale
    assert not rp.scenario.scale.auto and k > 1
    assert rp.calibration is not None and rp.calibration["time_scale"] == k
    assert rp.calibration["requested"] == "auto" and "limited_by" in rp.calibration
    # twice as slow a host: half the time_scale
    _fixed_calibration(monkeypatch, _cal(10, 2))
    slower = prepare_run(sc, RunOptions(out_dir=tmp_path, progress=False, duration_s=30.0))
    assert slower.scenario.scale.time_scale < k
    _fixed_calibration(monkeypatch, _cal(5, 1))
    # a number is kept when it fits, refused with one line naming the largest when it does not
    fixed = sc.model_copy(update={"scale": ScaleConfig(time_scale=k / 4)})
    rp = prepare_run(fixed, RunOptions(out_dir=tmp_path, progress=False, duration_s=30.0))
    assert rp.scenario.scale.time_scale == k / 4
    too_fast = sc.model_copy(update={"scale": ScaleConfig(time_scale=k * 2)})
    with pytest.raises(UserError) as err:
        prepare_run(too_fast, RunOptions(out_dir=tmp_path, progress=False, duration_s=30.0))
    line = str(err.value)
    assert "\n" not in line and f"the largest that works is {k:g}" in line


def test_auto_with_the_emulated_engine_is_an_error(tmp_path: Path) -> None:
    sc = load_scenario(ROOT / "scenarios" / "real-model.yaml")
    dep = next(iter(sc.deployments.values()))
    emulated = dep.model_copy(update={"engine": "emulated", "tiny_model": type(dep.tiny_model)()})
    sc = sc.model_copy(update={"deployments": {"prfaas-pd": emulated}, "checkers": []})
    with pytest.raises(UserError, match="auto applies to engine: torch only"):
        prepare_run(sc, RunOptions(out_dir=tmp_path, progress=False, duration_s=30.0))


def test_calibration_is_cached_per_model_config(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv(calibrate.RECALIBRATE_ENV, raising=False)
    measured: list[str] = []

    def fake_measure(config: object, repeats: int = 3) -> Calibration:
        measured.append(str(config))
        return _cal(3, 1)

    monkeypatch.setattr(calibrate, "measure", fake_measure)
    a = calibrate.calibration_for(live.tiny_config(0))
    b = calibrate.calibration_for(live.tiny_config(0))
    assert len(measured) == 1 and not a.cached and b.cached
    assert b.prefill_layer_s == a.prefill_layer_s
    calibrate.calibration_for(live.tiny_config(1))  # another seed: another config
    assert len(measured) == 2
    files = sorted((tmp_path / "prfaas-testbed" / "calibration").iterdir())
    assert len(files) == 2 and json.loads(files[0].read_text())["version"] == 1
    monkeypatch.setenv(calibrate.RECALIBRATE_ENV, "1")
    calibrate.calibration_for(live.tiny_config(0))
    assert len(measured) == 3
