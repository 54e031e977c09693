"""The planner's grid: Lambda_max and the stage imbalance of every (threshold, PD split) pair at
once, and the first pair with the best key, in as few numpy calls as the inputs allow.

The scheduler re-runs the search at every long-term check and at every short-term re-plan, on
grids of a few dozen to a few thousand pairs: there the cost is the number of numpy calls, not
their size. So the profile curves are lookup tables built once (the segment of each length is
one `searchsorted`, no clip and no gathers of both ends), and the pairs of the usual case (every
threshold offloads something and keeps something, every split has PD-P instances) skip the
masks the general case needs. Every value is computed with the same IEEE operations, in the
same order, as the scalar `stage_throughputs` and `Curve.__call__`: the same floats
(tests/test_planner_props.py, tests/test_planner_search.py).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from functools import lru_cache

import numpy as np

from testbed.config.limits import MAX_THRESHOLDS
from testbed.profiles import Curve, ModelProfile
from testbed.workload.lengths import LengthDistribution, split_many

__all__ = [
    "VECTOR_TOL",
    "curve_many",
    "first_best",
    "grid_size",
    "kv_bytes_many",
    "pair_grid",
    "per_many",
    "split_grid",
    "threshold_grid",
]

VECTOR_TOL = 1e-8
"""How far below the largest Lambda_max a pair may be and still round to it (at 9 decimals)."""


@lru_cache(maxsize=64)
def _tables(curve: Curve) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(xs, x0, y0, dy, dx) of `curve`, the last four indexed by `searchsorted(xs, x, "right")`:
    entry i holds the segment `Curve.__call__` uses for that index (clipped to 1..n-1), dy and
    dx its y1 - y0 and x1 - x0 as the scalar code subtracts them."""
    xs = np.asarray(curve.xs, dtype=float)
    ys = np.asarray(curve.ys, dtype=float)
    seg = np.clip(np.arange(len(xs) + 1), 1, len(xs) - 1)
    return xs, xs[seg - 1], ys[seg - 1], ys[seg] - ys[seg - 1], xs[seg] - xs[seg - 1]


def curve_many(curve: Curve, x: np.ndarray) -> np.ndarray:
    """`curve(x_i)` at every element, bit for bit (`Curve.many`, from tables built once)."""
    xs, x0, y0, dy, dx = _tables(curve)
    i = xs.searchsorted(x, side="right")
    return y0[i] + dy[i] * (x - x0[i]) / dx[i]


def prefill_time_many(model: ModelProfile, hardware: str, tokens: np.ndarray) -> np.ndarray:
    """`model.prefill_time(hardware, l)` at every element (`ModelProfile.prefill_time_many`)."""
    return np.where(tokens <= 0, 0.0, np.maximum(curve_many(model.prefill[hardware], tokens), 0.0))


def kv_bytes_many(model: ModelProfile, tokens: np.ndarray) -> np.ndarray:
    """`model.kv_bytes(l)` at every element (`ModelProfile.kv_bytes_many`)."""
    return np.where(
        tokens <= 0, 0.0, np.maximum(curve_many(model.kv_bytes_curve, tokens), model.state_bytes)
    )


def per_many(amount: float | np.ndarray, cost: np.ndarray) -> np.ndarray:
    """amount / cost element by element where the cost is positive, inf elsewhere (the
    planner's `_per`)."""
    positive = cost > 0
    return np.where(positive, amount / np.where(positive, cost, 1.0), math.inf)


def pair_grid(
    model: ModelProfile,
    prfaas_hw: str | None,
    local_hw: str,
    n_prfaas: int,
    link: float,
    pdd: np.ndarray,
    p: np.ndarray,
    l_long: np.ndarray,
    l_short: np.ndarray,
    n_p: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """(Lambda_max, imbalance) of every pair, thresholds by rows and splits (`n_p` PD-P
    instances, `pdd` their Theta_pdd) by columns: what `_Search.point` computes pair by pair."""
    offload, local = p > 0, p < 1
    with np.errstate(divide="ignore", invalid="ignore"):
        if n_prfaas > 0 and prfaas_hw is not None:
            compute = per_many(n_prfaas, prefill_time_many(model, prfaas_hw, l_long))
            network = per_many(link, kv_bytes_many(model, l_long))
            th_pf = np.where(offload, np.minimum(compute, network), 0.0)
        else:
            th_pf = np.zeros_like(p)
        prf = np.where(offload, th_pf / np.where(offload, p, 1.0), math.inf)
        cost = prefill_time_many(model, local_hw, l_short)
        if local.all() and (cost > 0).all() and (n_p > 0).all():
            # every pair has a PD-P stage: Theta_pdp is n_p / cost; while every PD-P rate is
            # finite, only rows without a finite PrfaaS rate (nothing offloaded) have no
            # imbalance
            pdp = n_p / cost[:, None] / (1 - p)[:, None]
            if np.isfinite(pdp).all():
                lam = np.minimum(np.minimum(prf[:, None], pdp), pdd)
                imbalance = np.abs(prf[:, None] - pdp)
                none = ~np.isfinite(prf)
                if none.any():
                    imbalance[none] = 0.0
                return lam, imbalance
        prf = prf[:, None]
        cost = cost[:, None]
        th_pdp = np.where(local[:, None] & (n_p > 0), per_many(n_p, cost), 0.0)
        pdp = np.where(local[:, None], th_pdp / (1 - p)[:, None], math.inf)
        lam = np.minimum(np.minimum(prf, pdp), pdd)
        both = np.isfinite(prf) & np.isfinite(pdp)
        imbalance = np.where(both, np.abs(prf - pdp), 0.0)
    return lam, imbalance


def first_best(lam: np.ndarray, imbalance: np.ndarray) -> int:
    """Index of the first pair with the largest key (round(Lambda_max, 9), -imbalance), pairs
    in the search's order. `round(., 9)` is Python's, applied to the few distinct Lambda_max
    within VECTOR_TOL of the largest (only those can round to it); when they are all the
    largest itself (pairs bound by PD-D tie by the thousand when the split is free) no
    rounding is needed. The imbalance then decides, in one `argmin`."""
    top_value = lam.max()
    near = np.flatnonzero(lam >= top_value - VECTOR_TOL)
    values = lam[near]
    if values.min() != top_value:
        distinct, which = np.unique(values, return_inverse=True)
        rounded = np.array([round(float(v), 9) for v in distinct])[which.ravel()]
        near = near[rounded == rounded.max()]
    return int(near[np.argmin(imbalance[near])])


def grid_size(lengths: LengthDistribution, step: float) -> float:
    """Thresholds `threshold_grid` has at `step`, counted without building it (inf for a
    step so small that the count overflows)."""
    lo, hi = lengths.bounds
    first = lo / step
    if not math.isfinite(first) or not math.isfinite(hi / step):
        return math.inf
    return math.floor((hi + step - math.floor(first) * step) / step) + 1


def threshold_grid(lengths: LengthDistribution, step: float) -> np.ndarray:
    """Thresholds every `step` tokens over the lengths' range. A re-plan over lengths observed
    at run time (the long-term loop) wider than MAX_THRESHOLDS steps uses a coarser step rather
    than allocate without bound: the scenario's own range was checked by `plan_inputs`.
    Read-only: one grid serves every search over the same range (the observed window's
    shortest and longest prompts change less often than the rest of it)."""
    lo, hi = lengths.bounds
    while grid_size(lengths, step) > MAX_THRESHOLDS:
        step *= 2
    return _grid_of(lo, hi, step)


@lru_cache(maxsize=16)
def _grid_of(lo: float, hi: float, step: float) -> np.ndarray:
    grid = np.clip(np.arange(math.floor(lo / step) * step, hi + step, step), lo, hi)
    # sorted already: np.unique's result without its sort (the clip repeats only the ends)
    keep = np.ones(len(grid), dtype=bool)
    keep[1:] = grid[1:] != grid[:-1]
    grid = grid[keep]
    grid.flags.writeable = False
    return grid


_SPLITS: OrderedDict[tuple[object, bytes], tuple[np.ndarray, np.ndarray, np.ndarray]] = (
    OrderedDict()
)
"""(p, l_long, l_short) over a threshold grid, for distributions that split threshold by
threshold (no `split_many`: the scenario's log-normal, ~10 ms a grid): the run's first plan
and the short-term loop's first re-plan ask for the same one."""


def split_grid(
    lengths: LengthDistribution, thresholds: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`split_many(lengths, thresholds)`, remembered for the last few scalar-only
    distributions (frozen, so equal ones split alike)."""
    if getattr(lengths, "split_many", None) is not None:
        return split_many(lengths, thresholds)
    try:
        key = (lengths, thresholds.tobytes())
        hit = _SPLITS.get(key)
    except TypeError:  # an unhashable distribution
        return split_many(lengths, thresholds)
    if hit is None:
        hit = split_many(lengths, thresholds)
        for a in hit:
            a.flags.writeable = False
        _SPLITS[key] = hit
        while len(_SPLITS) > 4:
            _SPLITS.popitem(last=False)
    return hit
