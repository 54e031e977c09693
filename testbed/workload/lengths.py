"""Input length distributions with the statistics the planner needs and seeded sampling.

The planner asks three questions of a length distribution at a threshold t: p = P(L > t),
l_long = E[L | L > t] and l_short = E[L | L <= t]. For the paper's truncated log-normal these have
closed forms (via the normal CDF), so planning is exact and fast enough to re-run inside the
scheduler; for a trace they come from the sorted empirical lengths with prefix sums.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Protocol

import numpy as np

__all__ = [
    "EmpiricalLengths",
    "FixedLength",
    "LengthDistribution",
    "TruncatedLognormal",
    "split_many",
]


class LengthDistribution(Protocol):
    def mean(self) -> float: ...
    def split(self, t: float) -> tuple[float, float, float]:
        """(p, l_long, l_short) at threshold t: P(L > t), E[L | L > t], E[L | L <= t]."""
        ...

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray: ...
    @property
    def bounds(self) -> tuple[float, float]: ...


def _phi(z: float) -> float:
    return 0.5 * (1.0 + math.erf(z / math.sqrt(2.0)))


@dataclass(frozen=True)
class TruncatedLognormal:
    """ln L ~ N(mu, sigma^2) truncated to [lo, hi]; the paper: mu 9.90, sigma 1.00, [128, 128K]."""

    mu: float
    sigma: float
    lo: float
    hi: float
    _ends: tuple[float, float, float] = field(init=False, repr=False, compare=False)
    """CDF at lo, at hi, and the mass between."""
    _means: tuple[float, float] = field(init=False, repr=False, compare=False)
    """E[L; L <= x] of the untruncated log-normal at lo and at hi."""

    def __post_init__(self) -> None:
        # The config bounds mu and sigma and checks the window's mass (LognormalLengths); a
        # distribution built in code gets the same refusal, not a ZeroDivisionError later.
        if not (self.sigma > 0 and 0 < self.lo < self.hi and math.isfinite(self.hi)):
            raise ValueError(f"a truncated log-normal needs sigma > 0 and 0 < lo < hi: {self}")
        # The window's ends, computed once: `split` needed them at every call (six of its ten
        # erf calls; the planner's first grid asks it ~1,300 times), `mean` and `sample` too.
        lo, hi = self._cdf(self.lo), self._cdf(self.hi)
        object.__setattr__(self, "_ends", (lo, hi, hi - lo))
        object.__setattr__(
            self, "_means", (self._partial_mean(self.lo), self._partial_mean(self.hi))
        )
        if not self._ends[2] > 0 or not math.isfinite(self.mean()):
            raise ValueError(f"[{self.lo:g}, {self.hi:g}] holds none of the log-normal: {self}")

    def _cdf(self, x: float) -> float:
        return _phi((math.log(x) - self.mu) / self.sigma)

    def _partial_mean(self, x: float) -> float:
        """E[L; L <= x] of the untruncated log-normal."""
        m = math.exp(self.mu + self.sigma**2 / 2)
        return m * _phi((math.log(x) - self.mu - self.sigma**2) / self.sigma)

    @property
    def bounds(self) -> tuple[float, float]:
        return (self.lo, self.hi)

    def mean(self) -> float:
        mean_lo, mean_hi = self._means
        return (mean_hi - mean_lo) / self._ends[2]

    def split(self, t: float) -> tuple[float, float, float]:
        t = min(max(t, self.lo), self.hi)
        cdf_lo, cdf_hi, mass = self._ends
        mean_lo, mean_hi = self._means
        cdf_t, mean_t = self._cdf(t), self._partial_mean(t)
        mass_short = cdf_t - cdf_lo
        mass_long = cdf_hi - cdf_t
        sum_short = mean_t - mean_lo
        sum_long = mean_hi - mean_t
        p = mass_long / mass
        l_long = sum_long / mass_long if mass_long > 0 else 0.0
        l_short = sum_short / mass_short if mass_short > 0 else 0.0
        return p, l_long, l_short

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """Inverse-CDF sampling restricted to [lo, hi]: no rejection loop, exact truncation."""
        lo_u, hi_u, _ = self._ends
        u = rng.uniform(lo_u, hi_u, size=n)
        z = _norm_ppf(u)
        return np.clip(np.exp(self.mu + self.sigma * z), self.lo, self.hi)


@dataclass(frozen=True)
class EmpiricalLengths:
    """The lengths of a trace, as an empirical distribution."""

    lengths: tuple[float, ...]
    _sorted: tuple[float, ...] = field(init=False, repr=False)
    _prefix: tuple[float, ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not self.lengths:
            raise ValueError("an empirical length distribution needs at least one length")
        s = tuple(sorted(self.lengths))
        object.__setattr__(self, "_sorted", s)
        object.__setattr__(self, "_prefix", (0.0, *accumulate(s)))

    @classmethod
    def of(cls, lengths: Sequence[float]) -> EmpiricalLengths:
        return cls(tuple(map(float, lengths)))

    @property
    def bounds(self) -> tuple[float, float]:
        return (self._sorted[0], self._sorted[-1])

    def mean(self) -> float:
        return self._prefix[-1] / len(self._sorted)

    def split(self, t: float) -> tuple[float, float, float]:
        n = len(self._sorted)
        k = bisect.bisect_right(self._sorted, t)  # lengths <= t
        p = (n - k) / n
        l_short = self._prefix[k] / k if k else 0.0
        l_long = (self._prefix[-1] - self._prefix[k]) / (n - k) if k < n else 0.0
        return p, l_long, l_short

    def split_many(self, ts: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """`split` at every threshold of `ts` at once, with the same IEEE operations on the
        same prefix sums, so each element equals `split(t)` bit for bit (the planner re-runs
        its threshold search every scheduler tick, over ~1,000 thresholds)."""
        return self.split_ranks(self.ranks(ts))

    def ranks(self, ts: np.ndarray) -> np.ndarray:
        """How many lengths are <= each threshold (`bisect_right`): all that `split` depends
        on, so thresholds of equal rank split alike and those of different ranks do not (p
        differs). The planner keeps one threshold per rank before it computes any pair: a
        30 s window of ~100 lengths leaves ~100 of a grid's ~1,000 thresholds."""
        return np.searchsorted(np.asarray(self._sorted), ts, side="right")

    def split_ranks(self, k: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """`split` at thresholds of ranks `k` (`ranks`), bit for bit."""
        n = len(self._sorted)
        prefix = np.asarray(self._prefix)
        p = (n - k) / n
        l_short = np.where(k > 0, prefix[k] / np.maximum(k, 1), 0.0)
        l_long = np.where(k < n, (prefix[-1] - prefix[k]) / np.maximum(n - k, 1), 0.0)
        return p, l_long, l_short

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.choice(np.asarray(self._sorted), size=n, replace=True)


@dataclass(frozen=True)
class FixedLength:
    tokens: float

    @property
    def bounds(self) -> tuple[float, float]:
        return (self.tokens, self.tokens)

    def mean(self) -> float:
        return self.tokens

    def split(self, t: float) -> tuple[float, float, float]:
        if self.tokens > t:
            return 1.0, self.tokens, 0.0
        return 0.0, 0.0, self.tokens

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.full(n, self.tokens)


def split_many(
    lengths: LengthDistribution, ts: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(p, l_long, l_short) at every threshold of `ts`, as arrays: a distribution's own
    `split_many` where it has one (the empirical lengths the scheduler re-plans with), else
    `split` threshold by threshold (the same values either way)."""
    many = getattr(lengths, "split_many", None)
    if many is not None:
        return many(ts)
    rows = [lengths.split(float(t)) for t in ts]
    if not rows:
        return np.empty(0), np.empty(0), np.empty(0)
    p, l_long, l_short = (np.array(col, dtype=float) for col in zip(*rows, strict=True))
    return p, l_long, l_short


def _norm_ppf(u: np.ndarray) -> np.ndarray:
    """Inverse standard normal CDF (Acklam's rational approximation, refined by one Halley step).

    numpy has no ppf and scipy is a heavy dependency for one function; after the Halley step the
    relative error is below 1e-12, far finer than token granularity.
    """
    a = (-3.969683028665376e01, 2.209460984245205e02, -2.759285104469687e02,
         1.383577518672690e02, -3.066479806614716e01, 2.506628277459239e00)  # fmt: skip
    b = (-5.447609879822406e01, 1.615858368580409e02, -1.556989798598866e02,
         6.680131188771972e01, -1.328068155288572e01)  # fmt: skip
    c = (-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e00,
         -2.549732539343734e00, 4.374664141464968e00, 2.938163982698783e00)  # fmt: skip
    d = (7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e00,
         3.754408661907416e00)  # fmt: skip
    u = np.clip(np.asarray(u, dtype=float), 1e-300, 1 - 1e-16)
    if u.size == 0:  # no request drawn (np.vectorize refuses size-0 input)
        return u
    x = np.empty_like(u)
    lo, hi = u < 0.02425, u > 1 - 0.02425
    mid = ~(lo | hi)
    q = np.sqrt(-2 * np.log(u[lo]))
    x[lo] = (((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) / (
        (((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1
    )
    q = u[mid] - 0.5
    r = q * q
    x[mid] = (
        (((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5])
        * q
        / (((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1)
    )
    q = np.sqrt(-2 * np.log(1 - u[hi]))
    x[hi] = -(((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) / (
        (((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1
    )
    # One Halley refinement step against the exact CDF.
    erf = np.vectorize(math.erf)
    e = 0.5 * (1 + erf(x / math.sqrt(2))) - u
    pdf_inv = math.sqrt(2 * math.pi) * np.exp(x * x / 2)
    step = e * pdf_inv
    return x - step / (1 + x * step / 2)
