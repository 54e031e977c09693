"""Turning measurements into profile curves: `testbed profile fit MEASUREMENTS.csv`.

A profile is knots of a piecewise-linear curve (the paper uses its tables that way), so the
default fit is piecewise-linear with free knot positions: start from the two end points, add the
knot where the relative error is worst, move every inner knot to where the fit is best, and stop
when the worst relative error is within the tolerance or the knot budget is spent. Knot values
come from least squares on relative error, so short prompts (fast) weigh as much as long ones.
A smoothed form (a quadratic in the length: linear work plus attention's quadratic term, fitted
by relative least squares, then knotted as above) is the option for noisy measurements; it
cannot follow a measured curve's kinks.

Decode measurements (batch, seconds) fit the decode step model the engines use, an affine
step_base + step_per_seq x batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from testbed.profiles.base import Curve

__all__ = ["AffineFit", "CurveFit", "fit_affine", "fit_curve"]

FitForm = Literal["pwl", "smooth"]


@dataclass(frozen=True)
class CurveFit:
    curve: Curve
    form: FitForm
    max_rel_error: float
    """Worst |fit - measured| / measured over the points."""
    rms_rel_error: float


@dataclass(frozen=True)
class AffineFit:
    base: float
    per_unit: float
    max_rel_error: float
    rms_rel_error: float


def _points(xs: Sequence[float], ys: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    x = np.asarray(xs, dtype=float)
    y = np.asarray(ys, dtype=float)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError("x and y must be two columns of the same length")
    if len(x) < 2 or len(np.unique(x)) < 2:
        raise ValueError("a fit needs at least two points with different x")
    if not (np.all(np.isfinite(x)) and np.all(np.isfinite(y))) or np.any(y <= 0):
        raise ValueError("measurements must be finite and their times positive")
    order = np.argsort(x, kind="stable")
    return x[order], y[order]


def _hat_basis(x: np.ndarray, knots: np.ndarray) -> np.ndarray:
    """Column j: the piecewise-linear function that is 1 at knot j and 0 at the others."""
    basis = np.zeros((len(x), len(knots)))
    idx = np.clip(np.searchsorted(knots, x, side="right"), 1, len(knots) - 1)
    left, right = knots[idx - 1], knots[idx]
    w = (x - left) / (right - left)
    rows = np.arange(len(x))
    basis[rows, idx - 1] = 1 - w
    basis[rows, idx] = w
    return basis


def _solve(x: np.ndarray, y: np.ndarray, knots: np.ndarray) -> tuple[np.ndarray, float]:
    """Knot values minimising the squared relative error, and that error."""
    a = _hat_basis(x, knots) / y[:, None]
    values, *_ = np.linalg.lstsq(a, np.ones_like(y), rcond=None)
    err = float(np.sum((a @ values - 1.0) ** 2))
    return values, err


def _rel_errors(curve: Curve, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    return np.abs(np.array([curve(v) for v in x]) - y) / y


def _refine(x: np.ndarray, y: np.ndarray, knots: np.ndarray, passes: int = 4) -> np.ndarray:
    """Move each inner knot, one at a time, to the best of a grid between its neighbours."""
    knots = knots.copy()
    for _ in range(passes):
        moved = False
        for j in range(1, len(knots) - 1):
            lo, hi = knots[j - 1], knots[j + 1]
            best, best_err = knots[j], _solve(x, y, knots)[1]
            coarse = np.linspace(lo, hi, 66)[1:-1]
            step = coarse[1] - coarse[0]
            for grid in (coarse, None):  # a coarse grid, then a fine one around its best
                if grid is None:
                    grid = np.linspace(max(lo, best - step), min(hi, best + step), 33)[1:-1]
                for cand in grid:
                    trial = knots.copy()
                    trial[j] = cand
                    err = _solve(x, y, trial)[1]
                    if err < best_err - 1e-15:
                        best, best_err = cand, err
            if best != knots[j]:
                knots[j], moved = best, True
        if not moved:
            break
    return knots


def fit_curve(
    xs: Sequence[float],
    ys: Sequence[float],
    *,
    form: FitForm = "pwl",
    tolerance: float = 0.01,
    max_knots: int = 8,
) -> CurveFit:
    """A curve through (x, y) measurements, e.g. (prompt tokens, prefill seconds)."""
    if max_knots < 2:
        raise ValueError("max_knots must be at least 2")
    x, y = _points(xs, ys)
    if form == "smooth":  # the quadratic, densely sampled, then knotted like measurements
        coef = _quadratic(x, y)
        dense = np.geomspace(x[0], x[-1], 200) if x[0] > 0 else np.linspace(x[0], x[-1], 200)
        fitted = coef[0] + coef[1] * dense + coef[2] * dense * dense
        if np.any(fitted <= 0):
            raise ValueError("the smoothed fit goes to zero or below; use the pwl form")
        curve = fit_curve(
            list(dense), list(fitted), form="pwl", tolerance=tolerance / 4, max_knots=max_knots
        ).curve
    else:
        knots = np.array([x[0], x[-1]])
        curve = Curve(tuple(knots), tuple(_solve(x, y, knots)[0]))
        while len(knots) < min(max_knots, len(np.unique(x))):
            rel = _rel_errors(curve, x, y)
            if rel.max() <= tolerance:
                break
            worst = x[int(np.argmax(rel))]
            if worst in knots:  # the worst point is a knot already: split its widest side
                worst = _widest_gap_mid(knots)
            knots = _refine(x, y, np.sort(np.append(knots, worst)))
            curve = Curve(tuple(float(k) for k in knots), tuple(_solve(x, y, knots)[0]))
    rel = _rel_errors(curve, x, y)
    return CurveFit(curve, form, float(rel.max()), float(np.sqrt(np.mean(rel**2))))


def _widest_gap_mid(knots: np.ndarray) -> float:
    gaps = np.diff(knots)
    i = int(np.argmax(gaps))
    return float(knots[i] + gaps[i] / 2)


def _quadratic(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """(a, b, c) of a + b x + c x^2 by relative least squares."""
    design = np.stack([np.ones_like(x), x, x * x], axis=1) / y[:, None]
    coef, *_ = np.linalg.lstsq(design, np.ones_like(y), rcond=None)
    return np.asarray(coef)


def fit_affine(xs: Sequence[float], ys: Sequence[float]) -> AffineFit:
    """y = base + per_unit x by relative least squares, e.g. decode step seconds by batch."""
    x, y = _points(xs, ys)
    design = np.stack([np.ones_like(x), x], axis=1) / y[:, None]
    (base, per_unit), *_ = np.linalg.lstsq(design, np.ones_like(y), rcond=None)
    rel = np.abs(base + per_unit * x - y) / y
    return AffineFit(
        float(base), float(per_unit), float(rel.max()), float(np.sqrt(np.mean(rel**2)))
    )
