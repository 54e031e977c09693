import numpy as np
import pytest

from testbed.workload.lengths import EmpiricalLengths, TruncatedLognormal


@pytest.fixture
def paper() -> TruncatedLognormal:
    return TruncatedLognormal(mu=9.90, sigma=1.00, lo=128, hi=128_000)


def test_paper_distribution_statistics(paper: TruncatedLognormal) -> None:
    # PAPER.md: mean ~27.5K (27.3K with K = 1000), p = 49.6% at t = 19.4K, l_long ~44K.
    assert paper.mean() == pytest.approx(27_300, rel=0.01)
    p, l_long, l_short = paper.split(19_400)
    assert p == pytest.approx(0.496, abs=0.005)
    assert l_long == pytest.approx(44_000, rel=0.03)
    assert l_short == pytest.approx(10_200, rel=0.01)


def test_split_is_consistent_with_mean(paper: TruncatedLognormal) -> None:
    for t in (500, 5_000, 19_400, 60_000):
        p, l_long, l_short = paper.split(t)
        assert p * l_long + (1 - p) * l_short == pytest.approx(paper.mean(), rel=1e-9)


def test_split_keeps_the_floats_of_the_textbook_formula(paper: TruncatedLognormal) -> None:
    """`split` and `mean` read the window's ends from values kept at construction: the same
    floats as computing every term at each call (the planner's grid relies on equal values)."""
    cdf, part = paper._cdf, paper._partial_mean
    for t in (1.0, 128, 129.5, 500, 5_000, 19_400, 60_000, 127_999.5, 128_000, 1e9):
        c = min(max(t, paper.lo), paper.hi)
        mass_short, mass_long = cdf(c) - cdf(paper.lo), cdf(paper.hi) - cdf(c)
        sum_short, sum_long = part(c) - part(paper.lo), part(paper.hi) - part(c)
        want = (
            mass_long / (cdf(paper.hi) - cdf(paper.lo)),
            sum_long / mass_long if mass_long > 0 else 0.0,
            sum_short / mass_short if mass_short > 0 else 0.0,
        )
        assert paper.split(t) == want, t
    mass = cdf(paper.hi) - cdf(paper.lo)
    assert paper.mean() == (part(paper.hi) - part(paper.lo)) / mass
    assert paper == TruncatedLognormal(mu=9.90, sigma=1.00, lo=128, hi=128_000)  # kept values
    assert "_ends" not in repr(paper)  # are neither compared nor shown


def test_sampling_is_seeded_and_matches_the_analytic_distribution(
    paper: TruncatedLognormal,
) -> None:
    a = paper.sample(np.random.default_rng(7), 100_000)
    b = paper.sample(np.random.default_rng(7), 100_000)
    assert np.array_equal(a, b)
    assert a.min() >= 128 and a.max() <= 128_000
    assert a.mean() == pytest.approx(paper.mean(), rel=0.02)
    assert (a > 19_400).mean() == pytest.approx(paper.split(19_400)[0], abs=0.01)


def test_empirical_split() -> None:
    d = EmpiricalLengths.of([100, 200, 300, 400])
    assert d.mean() == 250
    assert d.split(250) == (0.5, 350.0, 150.0)
    assert d.split(1000) == (0.0, 0.0, 250.0)
    assert d.split(0) == (1.0, 250.0, 0.0)
