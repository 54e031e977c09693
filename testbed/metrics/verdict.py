"""The scorecard's verdict on one scenario: the policy's mean row against a baseline's (or the
hindsight reference row), and which criterion decided it.

The rule, in order (issue #30):

1. **Not judged** when the policy under test decided less than `min_share` of the decisions
   itself (testbed.checkers.policy_share over every seed): the figures are then partly its
   fallback's, and no verdict on them is about the policy.
2. Against a baseline, the objective: SLO attainment more than ATTAINMENT_TIE apart decides;
   else P90 TTFT more than TTFT_TIE apart. Against the hindsight row, only the objective that
   row was chosen by (`ttft-p90-fault` or `goodput`).
3. Only when the objective against a baseline ties, a checker failing (on any seed) for one
   side and not the other decides against that side.
4. Never a win for a policy worse on SLO attainment, goodput and P90 TTFT at once, never a loss
   for one better on all three: such a verdict is a tie, saying why.

Checker gates (the checkers either side fails) are reported beside every verdict and decide
nothing else: a scenario's ratio checker (P90 TTFT during a fault against the minute before it)
is passed by a uniformly slow policy, and letting that pass decide called a round-robin policy,
worse than both baselines on every figure, a win on bandwidth-drop.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from testbed.checkers.policy_share import DEFAULT_MIN_SHARE, reasons_text

__all__ = [
    "ATTAINMENT_TIE",
    "DOMINANCE",
    "GOODPUT_TIE",
    "METRICS",
    "NOT_JUDGED",
    "TTFT_TIE",
    "compare",
    "failing",
    "not_judged_text",
]

ATTAINMENT_TIE = 0.005
"""SLO attainment differences within half a point are a tie (seed noise on a few hundred
requests is about that)."""
TTFT_TIE = 0.05
"""P90 TTFT within 5% of each other is a tie when SLO attainment is tied too."""
GOODPUT_TIE = 0.01
"""Goodput within 1% is a tie against the hindsight row chosen by goodput."""
NOT_JUDGED = "not judged"
"""The verdict of a scenario the policy under test did not decide enough of."""

METRICS: tuple[tuple[str, str, str, bool], ...] = (
    # key, label, format, higher is better
    ("goodput_rps", "goodput (req/s)", ".3f", True),
    ("slo_attainment", "SLO attainment", ".1%", True),
    ("ttft_p50_s", "TTFT p50 (s)", ".2f", False),
    ("ttft_p90_s", "TTFT p90 (s)", ".2f", False),
    ("ttft_p99_s", "TTFT p99 (s)", ".2f", False),
    ("ttft_p90_window_s", "TTFT p90 fault window (s)", ".2f", False),
    ("failed", "failed", ".1f", False),
    ("cross_dc_gib", "cross-DC (GiB)", ".1f", False),
)
"""What a scorecard shows per scenario and compares against the baselines (policy minus
baseline for each)."""

DOMINANCE: tuple[tuple[str, str, bool], ...] = (
    ("slo_attainment", "SLO attainment", True),
    ("goodput_rps", "goodput", True),
    ("ttft_p90_s", "P90 TTFT", False),
)
"""The figures a policy better (or worse) on all at once cannot lose (or win) on: key, name,
higher is better."""

Verdict = tuple[str, str]
"""(win | tie | loss, the criterion that decided it)."""


def failing(row: Mapping[str, Any]) -> list[str]:
    """The checkers a mean row fails on at least one seed (testbed.metrics.scorecard.mean_rows:
    "failed (k/n seeds)"); a vacuous one is not failing."""
    return [name for name, v in (row.get("checks") or {}).items() if str(v).startswith("failed")]


def not_judged_text(share: Mapping[str, Any]) -> str:
    """The criterion of a scenario not judged, for a `Share.to_json()`: "not judged (100% by
    the fallback: status 1351)"."""
    pct = 100.0 * share["fallback"] / max(share["policy"] + share["fallback"], 1)
    shown = f"{pct:.0f}%" if pct >= 10 else f"{pct:.1f}%"
    return f"{NOT_JUDGED} ({shown} by the fallback: {reasons_text(share['reasons'])})"


def compare(
    policy: Mapping[str, Any],
    base: Mapping[str, Any],
    objective: str | None = None,
    *,
    min_share: float = DEFAULT_MIN_SHARE,
) -> dict[str, Any]:
    """Policy minus baseline for each figure, the verdict, the criterion that decided it and
    the checker gates of both sides (the module docstring has the rule). With an `objective`
    (the hindsight reference row, chosen by it) the objective is that figure alone."""
    deltas: dict[str, float | None] = {}
    for key, *_ in METRICS:
        a, b = policy.get(key), base.get(key)
        deltas[key] = None if a is None or b is None else a - b
    mine, theirs = failing(policy), failing(base)
    gates = {"policy": mine, "baseline": theirs}
    out = {"deltas": deltas, "gates": gates}
    share = policy.get("policy_share")
    if share is not None and share["share"] is not None and share["share"] < min_share:
        return {**out, "verdict": NOT_JUDGED, "criterion": not_judged_text(share)}
    if objective is not None:
        verdict, why = _by_objective(policy, base, objective)
    else:
        verdict, why = _by_figures(policy, base)
    if verdict == "tie" and objective is None:  # the hindsight row: its objective alone
        verdict, why = _by_checkers(mine, theirs, why)
    verdict, why = _dominance(policy, base, verdict, why)
    return {**out, "verdict": verdict, "criterion": why}


def _by_figures(policy: Mapping[str, Any], base: Mapping[str, Any]) -> Verdict:
    pa, ba = policy.get("slo_attainment"), base.get("slo_attainment")
    if pa is not None and ba is not None and abs(pa - ba) > ATTAINMENT_TIE:
        return ("win" if pa > ba else "loss"), f"SLO attainment {(pa - ba) * 100:+.1f} pt"
    pt, bt = policy.get("ttft_p90_s"), base.get("ttft_p90_s")
    if pt is not None and bt is not None and bt > 0 and abs(pt / bt - 1) > TTFT_TIE:
        return ("win" if pt < bt else "loss"), f"P90 TTFT {(pt / bt - 1) * 100:+.0f}%"
    return "tie", (
        f"SLO attainment within {ATTAINMENT_TIE * 100:g} pt, P90 TTFT within {TTFT_TIE:.0%}"
    )


def _by_objective(policy: Mapping[str, Any], base: Mapping[str, Any], objective: str) -> Verdict:
    if objective == "goodput":
        a, b = policy.get("goodput_rps") or 0.0, base.get("goodput_rps") or 0.0
        if (b > 0 and abs(a / b - 1) <= GOODPUT_TIE) or a == b:
            return "tie", f"goodput within {GOODPUT_TIE:.0%}"
        rel = f"{(a / b - 1) * 100:+.1f}%" if b > 0 else f"{a:.3g} vs 0 req/s"
        return ("win" if a > b else "loss"), f"goodput {rel}"
    x, y = policy.get("ttft_p90_window_s"), base.get("ttft_p90_window_s")
    what = "P90 TTFT over the fault window"
    if x is None or y is None:  # an infinite P90 (failures in the window) loses
        if x is None and y is None:
            return "tie", f"{what}: both lost requests there"
        return ("loss", f"{what}: lost requests there") if x is None else (
            "win", f"{what}: the other lost requests there"
        )  # fmt: skip
    if y > 0 and abs(x / y - 1) <= TTFT_TIE:
        return "tie", f"{what} within {TTFT_TIE:.0%}"
    rel = f"{(x / y - 1) * 100:+.0f}%" if y > 0 else f"{x:.3g} vs 0 s"
    return ("win" if x < y else "loss"), f"{what} {rel}"


def _by_checkers(mine: Sequence[str], theirs: Sequence[str], tied: str) -> Verdict:
    """On a tied objective, a checker that fails for one side only decides against it."""
    only_mine = [n for n in mine if n not in theirs]
    only_theirs = [n for n in theirs if n not in mine]
    if only_mine and not only_theirs:
        return "loss", f"{tied}; checker {', '.join(only_mine)} fails for the policy only"
    if only_theirs and not only_mine:
        return "win", f"{tied}; checker {', '.join(only_theirs)} fails for the baseline only"
    return "tie", tied


def _dominance(
    policy: Mapping[str, Any], base: Mapping[str, Any], verdict: str, why: str
) -> Verdict:
    """No win worse on every DOMINANCE figure, no loss better on every one."""
    signs = []
    for key, _, higher in DOMINANCE:
        a, b = policy.get(key), base.get(key)
        if a is None or b is None or a == b:
            return verdict, why
        signs.append((a > b) == higher)
    names = ", ".join(name for _, name, _ in DOMINANCE[:-1]) + f" and {DOMINANCE[-1][1]}"
    if verdict == "win" and not any(signs):
        return "tie", f"{why}, but worse on {names}"
    if verdict == "loss" and all(signs):
        return "tie", f"{why}, but better on {names}"
    return verdict, why
