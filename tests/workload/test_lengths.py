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
