"""Each field of the workload's length and arrival models changes what a run generates: the
same call with one field moved gives different lengths or arrival times (the entries of
tests/test_no_silent_fields.py for testbed.config.workload)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from testbed.config import ArrivalsConfig, LognormalLengths, TraceLengths, WorkloadConfig
from testbed.workload.arrivals import arrival_times
from testbed.workload.build import length_distribution
from testbed.workload.generate import generate_requests


def _sample(cfg: LognormalLengths, n: int = 20_000) -> np.ndarray:
    return length_distribution(cfg).sample(np.random.default_rng(0), n)


def test_lognormal_mu_sigma_min_and_max_shape_the_lengths() -> None:
    base = LognormalLengths(mu=9.0, sigma=1.0, min=128, max=100_000)
    lengths = _sample(base)
    assert np.median(_sample(base.model_copy(update={"mu": 10.0}))) > 2 * np.median(lengths)
    wide = _sample(base.model_copy(update={"sigma": 0.3}))
    assert np.std(np.log(wide)) < 0.5 * np.std(np.log(lengths))
    assert _sample(base.model_copy(update={"min": 5_000})).min() >= 5_000 > lengths.min()
    assert _sample(base.model_copy(update={"max": 10_000})).max() <= 10_000 < lengths.max()


def test_trace_lengths_path_is_the_distribution_sampled(tmp_path: Path) -> None:
    def trace(name: str, lengths: list[int]) -> str:
        p = tmp_path / name
        rows = [
            {"timestamp": i, "input_length": n, "output_length": 1} for i, n in enumerate(lengths)
        ]
        p.write_text("".join(json.dumps(r) + "\n" for r in rows))
        return str(p)

    short = length_distribution(TraceLengths(path=trace("short.jsonl", [100, 200])))
    long = length_distribution(TraceLengths(path=trace("long.jsonl", [9_000, 11_000])))
    assert short.mean() == 150 and long.mean() == 10_000


def _gaps(cfg: ArrivalsConfig) -> np.ndarray:
    times = arrival_times(cfg, rate=10.0, duration=2_000.0, rng=np.random.default_rng(1))
    return np.diff(times)


def test_gamma_burstiness_is_the_squared_coefficient_of_variation() -> None:
    smooth = _gaps(ArrivalsConfig(process="gamma", rate=10, burstiness=0.25))
    bursty = _gaps(ArrivalsConfig(process="gamma", rate=10, burstiness=4.0))
    scv = [g.var() / g.mean() ** 2 for g in (smooth, bursty)]
    assert scv[0] < 0.4 and scv[1] > 3.0


def test_onoff_on_and_off_durations_place_the_windows() -> None:
    def times(on: float, off: float) -> np.ndarray:
        cfg = ArrivalsConfig(process="onoff", rate=10, on_duration=on, off_duration=off)
        return arrival_times(cfg, rate=10.0, duration=400.0, rng=np.random.default_rng(2))

    base = times(2.0, 8.0)
    assert np.mod(base, 10.0).max() < 2.0  # on for 2 s of every 10 s
    assert np.mod(times(6.0, 4.0), 10.0).max() > 5.0  # on_duration: a longer window
    shorter_off = times(2.0, 5.0)
    assert np.mod(shorter_off, 7.0).max() < 2.0  # off_duration: the cycle is 7 s now
    assert np.mod(shorter_off, 10.0).max() > 2.0


def test_workload_arrivals_process_changes_the_arrival_times() -> None:
    def arrivals(process: str) -> list[float]:
        wl = WorkloadConfig(arrivals=ArrivalsConfig(process=process, rate=2))  # type: ignore[arg-type]
        return [r.arrival for r in generate_requests(wl, rate_rps=2.0, duration_s=20, seed=0)]

    uniform = arrivals("uniform")
    assert uniform == [i * 0.5 for i in range(40)]
    assert arrivals("poisson") != uniform


def test_a_shape_for_another_process_is_refused() -> None:
    from pydantic import ValidationError

    for field, value, process in (
        ("burstiness", 4.0, "gamma"),
        ("on_duration", "5s", "onoff"),
        ("off_duration", "5s", "onoff"),
    ):
        ArrivalsConfig.model_validate({"process": process, "rate": 1, field: value})
        with pytest.raises(ValidationError, match=f"'{field}' applies to process '{process}'"):
            ArrivalsConfig.model_validate({"process": "poisson", "rate": 1, field: value})
