import numpy as np
import pytest

from testbed.config import ArrivalsConfig
from testbed.workload.arrivals import (
    arrival_times,
    gamma_arrivals,
    onoff_arrivals,
    onoff_windows,
    poisson_arrivals,
    uniform_arrivals,
)


def rng(seed: int = 1) -> np.random.Generator:
    return np.random.default_rng(seed)


@pytest.mark.parametrize(
    "cfg",
    [
        ArrivalsConfig(process="poisson", rate=5),
        ArrivalsConfig(process="uniform", rate=5),
        ArrivalsConfig(process="gamma", rate=5, burstiness=4),
        ArrivalsConfig(process="onoff", rate=5, on_duration="3s", off_duration="7s"),
    ],
)
def test_same_seed_same_arrivals_and_shape(cfg: ArrivalsConfig) -> None:
    a = arrival_times(cfg, rate=5, duration=200, rng=rng(3))
    b = arrival_times(cfg, rate=5, duration=200, rng=rng(3))
    assert np.array_equal(a, b)
    assert a.dtype == np.float64
    assert len(a) > 0 and a.min() >= 0 and a.max() < 200
    assert np.all(np.diff(a) >= 0)


def test_different_seeds_differ() -> None:
    assert not np.array_equal(poisson_arrivals(rng(1), 5, 100), poisson_arrivals(rng(2), 5, 100))


def test_poisson_rate_and_exponential_gaps() -> None:
    a = poisson_arrivals(rng(), 20.0, 5_000.0)
    assert len(a) / 5_000.0 == pytest.approx(20.0, rel=0.02)
    gaps = np.diff(a)
    assert gaps.mean() == pytest.approx(1 / 20.0, rel=0.02)
    assert gaps.var() / gaps.mean() ** 2 == pytest.approx(1.0, abs=0.05)  # SCV of exponential


def test_uniform_is_evenly_spaced_from_zero() -> None:
    a = uniform_arrivals(4.0, 10.0)
    assert len(a) == 40
    assert a[0] == 0.0 and a[-1] == pytest.approx(9.75)
    assert np.allclose(np.diff(a), 0.25)
    # A rate that does not divide the duration evenly never overshoots it.
    assert uniform_arrivals(0.3, 10.0).max() < 10.0
    assert len(uniform_arrivals(0.3, 10.0)) == 3


@pytest.mark.parametrize("burstiness", [0.25, 1.0, 4.0])
def test_gamma_mean_rate_and_burstiness(burstiness: float) -> None:
    a = gamma_arrivals(rng(11), 10.0, 20_000.0, burstiness)
    gaps = np.diff(a)
    assert len(a) / 20_000.0 == pytest.approx(10.0, rel=0.03)
    assert gaps.mean() == pytest.approx(0.1, rel=0.03)
    assert gaps.var() / gaps.mean() ** 2 == pytest.approx(burstiness, rel=0.08)


def test_onoff_windows() -> None:
    assert onoff_windows(25.0, 5.0, 5.0) == [(0, 5), (10, 15), (20, 25)]
    assert onoff_windows(23.0, 5.0, 5.0)[-1] == (20, 23)


def test_onoff_has_no_arrivals_when_off_and_keeps_the_mean_rate() -> None:
    on, off, duration, rate = 4.0, 6.0, 10_000.0, 3.0
    a = onoff_arrivals(rng(5), rate, duration, on, off)
    phase = np.mod(a, on + off)
    assert np.all(phase < on), "an arrival fell in an OFF window"
    assert len(a) / duration == pytest.approx(rate, rel=0.03)
    # Inside ON the rate is scaled up by (on + off) / on.
    assert len(a) / (duration * on / (on + off)) == pytest.approx(rate * 2.5, rel=0.03)


def test_onoff_partial_last_window() -> None:
    a = onoff_arrivals(rng(2), 50.0, 12.0, on=5.0, off=5.0)
    assert a.max() < 12.0
    assert np.any(a >= 10.0)  # the truncated third window [10, 12) still receives arrivals
    assert not np.any((a >= 5.0) & (a < 10.0))


def test_empty_duration_and_bad_arguments() -> None:
    assert len(poisson_arrivals(rng(), 5.0, 0.0)) == 0
    assert len(uniform_arrivals(5.0, 0.0)) == 0
    with pytest.raises(ValueError, match="rate"):
        poisson_arrivals(rng(), 0.0, 10.0)
    with pytest.raises(ValueError, match="burstiness"):
        gamma_arrivals(rng(), 1.0, 10.0, 0.0)
    with pytest.raises(ValueError, match="synthetic"):
        arrival_times(ArrivalsConfig(process="trace"), rate=1.0, duration=10.0, rng=rng())
