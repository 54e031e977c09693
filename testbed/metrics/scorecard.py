"""The figures a scorecard and a hindsight sweep compare runs by, and the files they write.

One run becomes one flat row (`run_row`): goodput at the SLO, SLO attainment (the share of
requests within both the TTFT and TPOT SLOs, testbed.metrics.summary.meets_slo), TTFT p50/p90/p99,
the P90 TTFT over the fault window, failures, cross-datacenter bytes and each checker's verdict.
Rows of the same setting over several seeds are averaged (`mean_rows`); a scorecard compares the
policy's mean row with each baseline's (`compare`) and counts wins, ties and losses.

The fault window is the nemesis timeline's first fault start to its last fault end (the whole
run when the scenario has no faults). A request that arrived in it and failed counts as an
infinite TTFT there, so a setting cannot look faster by losing the slow requests; a P90 that is
infinite is written as null (JSON has no infinity) and ranks last.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from testbed.checkers.result import CheckResult
from testbed.config import SloConfig
from testbed.metrics.files import atomic_path, atomic_write
from testbed.metrics.records import HistoryEvent, RequestRecord
from testbed.metrics.summary import summarize
from testbed.nemesis import PlannedFault

__all__ = [
    "ATTAINMENT_TIE",
    "GOODPUT_TIE",
    "METRICS",
    "TTFT_TIE",
    "compare",
    "fault_window",
    "mean_rows",
    "run_row",
    "window_percentile",
    "write_hindsight",
    "write_scorecard",
]

ATTAINMENT_TIE = 0.005
"""SLO attainment differences within half a point are a tie (seed noise on a few hundred
requests is about that)."""
TTFT_TIE = 0.05
"""P90 TTFT within 5% of each other is a tie when SLO attainment is tied too."""
GOODPUT_TIE = 0.01
"""Goodput within 1% is a tie against the hindsight row chosen by goodput."""

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
"""What a scorecard shows per scenario and compares against the baselines."""


def fault_window(faults: Sequence[PlannedFault], duration_s: float) -> tuple[float, float]:
    """First fault start to last fault end (an instantaneous action ends where it starts);
    the whole run without faults."""
    if not faults:
        return 0.0, duration_s
    start = min(f.start for f in faults)
    end = max(f.end if f.end is not None else f.start for f in faults)
    return start, max(end, start)


def window_percentile(
    records: Iterable[RequestRecord], lo: float, hi: float, q: float = 90.0
) -> float | None:
    """The q-th percentile (linear) of TTFT over requests that arrived in [lo, hi]; a failed one
    counts as infinite. None when nothing arrived there, inf when the percentile lands on a
    failure."""
    vals = sorted(
        (r.ttft if r.status == "completed" and r.ttft is not None else math.inf)
        for r in records
        if lo <= r.arrival <= hi
    )
    if not vals:
        return None
    pos = (len(vals) - 1) * q / 100.0
    i = math.floor(pos)
    j = min(i + 1, len(vals) - 1)
    a, b = vals[i], vals[j]
    if math.isinf(a) or math.isinf(b):
        return math.inf if (math.isinf(a) or pos > i) else a
    return a + (b - a) * (pos - i)


def run_row(
    records: list[RequestRecord],
    history: list[HistoryEvent],
    checks: Sequence[CheckResult],
    *,
    duration_s: float,
    slo: SloConfig,
    scale: Any,
    window: tuple[float, float],
) -> dict[str, Any]:
    """One run's figures (a flat dict; JSON-ready: an infinite window P90 is None)."""
    s = summarize(records, history, duration_s=duration_s, slo=slo, scale=scale)
    w = window_percentile(records, *window)
    return {
        "requests": s["requests"]["submitted"],
        "completed": s["requests"]["completed"],
        "failed": s["requests"]["failed"],
        "throughput_rps": s["throughput_rps"],
        "goodput_rps": s["goodput_rps"],
        "slo_attainment": s["slo_attainment"],
        "ttft_p50_s": s["ttft_s"]["p50"],
        "ttft_p90_s": s["ttft_s"]["p90"],
        "ttft_p99_s": s["ttft_s"]["p99"],
        "window_s": [window[0], window[1]],
        "ttft_p90_window_s": None if w is None or math.isinf(w) else w,
        "window_lost": w is not None and math.isinf(w),
        "cross_dc_gib": s["cross_dc_bytes"]["total"] / 2**30,
        "link_mean_gbps": s["link"].get("mean_gbps"),
        "routes": s["routes"],
        "checks": {c.name: c.verdict for c in checks},
    }


def _mean(values: Sequence[Any]) -> float | None:
    if not values or any(v is None for v in values):
        return None  # one seed without a figure (or an infinite window P90): no mean
    return float(sum(values)) / len(values)


def mean_rows(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The mean over seeds of each metric, and each checker's verdict over them: "ok" only if
    every seed passed, else "failed" (or "vacuous") with how many seeds did."""
    out: dict[str, Any] = {"seeds": [r.get("seed") for r in rows]}
    for key in (*(m[0] for m in METRICS), "throughput_rps", "link_mean_gbps"):
        out[key] = _mean([r.get(key) for r in rows])
    names = list(dict.fromkeys(n for r in rows for n in r.get("checks", {})))
    verdicts: dict[str, str] = {}
    for name in names:
        vs = [r.get("checks", {}).get(name, "missing") for r in rows]
        bad = [v for v in vs if v != "ok"]
        if not bad:
            verdicts[name] = "ok"
        else:
            worst = "failed" if "failed" in bad else bad[0]
            verdicts[name] = f"{worst} ({len(bad)}/{len(vs)} seeds)"
    out["checks"] = verdicts
    out["checks_ok"] = all(v == "ok" for v in verdicts.values())
    return out


def compare(
    policy: Mapping[str, Any], base: Mapping[str, Any], objective: str | None = None
) -> dict[str, Any]:
    """Policy minus baseline for each metric, and the verdict: checkers first (a checker that
    fails for one and not the other decides), then SLO attainment (beyond ATTAINMENT_TIE), then
    P90 TTFT (beyond TTFT_TIE); else a tie.

    With an `objective` (the hindsight reference row, chosen by it) the verdict is that figure
    alone: `ttft-p90-fault` (P90 TTFT over the fault window, beyond TTFT_TIE; an infinite one
    loses) or `goodput` (beyond GOODPUT_TIE)."""
    deltas: dict[str, float | None] = {}
    for key, *_ in METRICS:
        a, b = policy.get(key), base.get(key)
        deltas[key] = None if a is None or b is None else a - b
    if objective is not None:
        return {"deltas": deltas, "verdict": _by_objective(policy, base, objective)}
    verdict = "tie"
    p_ok, b_ok = policy.get("checks_ok", True), base.get("checks_ok", True)
    att = deltas["slo_attainment"]
    pa, pb = policy.get("ttft_p90_s"), base.get("ttft_p90_s")
    if p_ok != b_ok:
        verdict = "win" if p_ok else "loss"
    elif att is not None and abs(att) > ATTAINMENT_TIE:
        verdict = "win" if att > 0 else "loss"
    elif pa is not None and pb is not None and pb > 0 and abs(pa / pb - 1) > TTFT_TIE:
        verdict = "win" if pa < pb else "loss"
    return {"deltas": deltas, "verdict": verdict}


def _by_objective(policy: Mapping[str, Any], base: Mapping[str, Any], objective: str) -> str:
    if objective == "goodput":
        a, b = policy.get("goodput_rps") or 0.0, base.get("goodput_rps") or 0.0
        if (b > 0 and abs(a / b - 1) <= GOODPUT_TIE) or a == b:
            return "tie"
        return "win" if a > b else "loss"
    x, y = policy.get("ttft_p90_window_s"), base.get("ttft_p90_window_s")
    if x is None or y is None:  # an infinite P90 (failures in the window) loses
        return "tie" if x is None and y is None else ("loss" if x is None else "win")
    if y > 0 and abs(x / y - 1) <= TTFT_TIE:
        return "tie"
    return "win" if x < y else "loss"


def _fmt(v: Any, spec: str) -> str:
    if v is None:
        return "-"
    if isinstance(v, float) and math.isinf(v):
        return "inf"
    return format(v, spec) if spec else str(v)


def _delta(v: float | None, spec: str) -> str:
    if v is None:
        return "-"
    if spec.endswith("%"):
        return f"{v * 100:+.1f} pt"
    return format(v, "+" + spec)


# ------------------------------------------------------------------------------ hindsight


def write_hindsight(result: Mapping[str, Any], out: Path) -> None:
    """hindsight.csv (one row per setting and seed), hindsight.md (mean over seeds per setting,
    the best marked) and hindsight.json (everything)."""
    out.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = result["rows"]
    flat = [
        {k: (json.dumps(v) if isinstance(v, dict | list) else v) for k, v in r.items()}
        for r in rows
    ]
    keys = list(dict.fromkeys(k for r in flat for k in r))
    with atomic_path(out / "hindsight.csv") as tmp, tmp.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(flat)
    atomic_write(out / "hindsight.json", json.dumps(result, indent=2, default=str) + "\n")
    atomic_write(out / "hindsight.md", hindsight_markdown(result))


def hindsight_markdown(result: Mapping[str, Any]) -> str:
    best = result["best"]
    lo, hi = result["window_s"]
    lines = [
        f"# Hindsight: best fixed setting for {result['scenario']}",
        "",
        f"Objective: {result['objective']} ({result['objective_text']}); fault window "
        f"{lo:.0f}-{hi:.0f} s; seeds {', '.join(str(s) for s in result['seeds'])}; policy "
        f"prfaas-static at a fixed threshold; offered {result['offered_rps']:.3f} req/s for "
        "every setting; planner's threshold "
        f"{result['planner_threshold_tokens']:.0f} tokens at {result['planner_split'][0]} PD-P / "
        f"{result['planner_split'][1]} PD-D.",
        "",
        "| threshold (tokens) | PD-P / PD-D | goodput (req/s) | SLO attainment | TTFT p90 (s) "
        "| TTFT p90 fault window (s) | failed | cross-DC (GiB) | |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for s in result["settings"]:
        mark = "**best**" if s["key"] == best["key"] else ""
        lines.append(
            f"| {s['threshold_tokens']:.0f} | {s['n_prefill']} / {s['n_decode']} | "
            f"{_fmt(s['goodput_rps'], '.3f')} | {_fmt(s['slo_attainment'], '.1%')} | "
            f"{_fmt(s['ttft_p90_s'], '.2f')} | {_fmt(s['ttft_p90_window_s'], '.2f')} | "
            f"{_fmt(s['failed'], '.1f')} | {_fmt(s['cross_dc_gib'], '.1f')} | {mark} |"
        )
    lines += [
        "",
        f"Best: threshold {best['threshold_tokens']:.0f} tokens, {best['n_prefill']} PD-P / "
        f"{best['n_decode']} PD-D: {result['objective']} = "
        f"{_fmt(best['objective_value'], '.3f')} (mean over {len(result['seeds'])} seeds).",
        "",
    ]
    return "\n".join(lines)


# ------------------------------------------------------------------------------ scorecard


def write_scorecard(card: Mapping[str, Any], out: Path) -> None:
    """scorecard.json (everything), scorecard.md (the tables) and scorecard.png."""
    out.mkdir(parents=True, exist_ok=True)
    atomic_write(out / "scorecard.json", json.dumps(card, indent=2, default=str) + "\n")
    atomic_write(out / "scorecard.md", scorecard_markdown(card))
    _plot(card, out / "scorecard.png")


def _overall_lines(card: Mapping[str, Any]) -> list[str]:
    lines = []
    for base, o in card["overall"].items():
        att = o["mean_slo_attainment_delta"]
        shown = "-" if att is None else f"{att * 100:+.1f} pt"
        lines.append(
            f"vs {base}: {o['win']} wins, {o['tie']} ties, {o['loss']} losses over "
            f"{o['scenarios']} scenarios; mean SLO attainment delta {shown}"
        )
    return lines


def overall_text(card: Mapping[str, Any]) -> str:
    """The scorecard's overall line(s), as printed at the end of the command."""
    return "\n".join(f"overall {card['policy']} " + line for line in _overall_lines(card))


def scorecard_markdown(card: Mapping[str, Any]) -> str:
    policy = card["policy"]
    lines = [
        f"# Scorecard: {policy}",
        "",
        f"Substrate {card['substrate']}; baselines {', '.join(card['baselines'])}; seeds "
        f"{', '.join(str(s) for s in card['seeds'])}; {card['runs']} runs "
        f"({card.get('cached_runs', 0)} from the cache) in "
        f"{card['wall_s']:.1f} s wall ({card.get('cpu_s', 0.0):.0f} CPU s). Figures are means "
        "over the seeds. SLO attainment is the "
        "share of requests within both the TTFT and TPOT SLOs. Verdict: a checker failing on "
        "one side decides, then SLO attainment (more than 0.5 pt apart), then P90 TTFT (more "
        "than 5% apart), else tie.",
        "",
        "## Overall",
        "",
        *(f"- {line}" for line in _overall_lines(card)),
        "",
    ]
    if card["skipped"]:
        lines += ["## Skipped", ""]
        lines += [f"- {name}: {why}" for name, why in card["skipped"].items()]
        lines.append("")
    for sc in card["scenarios"]:
        lines += [f"## {sc['name']}", ""]
        if sc.get("note"):
            lines += [sc["note"], ""]
        cols = [m for m in METRICS]
        lines.append("| row | " + " | ".join(c[1] for c in cols) + " | checkers |")
        lines.append("|---|" + "---|" * (len(cols) + 1))
        for label, row in sc["rows"].items():
            checks = ", ".join(f"{k} {v}" for k, v in row["checks"].items()) or "-"
            lines.append(
                f"| {label} | "
                + " | ".join(_fmt(row.get(k), spec) for k, _, spec, _ in cols)
                + f" | {checks} |"
            )
        for base, cmp in sc["against"].items():
            lines.append(
                f"| {policy} - {base} | "
                + " | ".join(_delta(cmp["deltas"].get(k), spec) for k, _, spec, _ in cols)
                + f" | **{cmp['verdict']}** |"
            )
        lines.append("")
    return "\n".join(lines)


def _plot(card: Mapping[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scenarios = card["scenarios"]
    labels = list(dict.fromkeys(label for sc in scenarios for label in sc["rows"]))
    fig, (ax_a, ax_t) = plt.subplots(2, 1, figsize=(max(8.0, 1.1 * len(scenarios) + 3), 7))
    width = 0.8 / max(len(labels), 1)
    xs = range(len(scenarios))
    for k, label in enumerate(labels):
        att = [(sc["rows"].get(label) or {}).get("slo_attainment") for sc in scenarios]
        p90 = [(sc["rows"].get(label) or {}).get("ttft_p90_s") for sc in scenarios]
        pos = [x + (k - (len(labels) - 1) / 2) * width for x in xs]
        ax_a.bar(pos, [a * 100 if a is not None else 0 for a in att], width, label=label)
        ax_t.bar(pos, [p if p is not None else 0 for p in p90], width, label=label)
    names = [sc["name"] for sc in scenarios]
    for ax in (ax_a, ax_t):
        ax.set_xticks(list(xs))
        ax.set_xticklabels(names, rotation=30, ha="right", fontsize=8)
    ax_a.set(ylabel="SLO attainment (%)", title="SLO attainment (higher is better)")
    ax_t.set(ylabel="TTFT p90 (s)", title="P90 TTFT (lower is better)")
    ax_t.set_yscale("log")
    ax_a.legend(fontsize=7, ncol=min(len(labels), 4))
    fig.suptitle(f"scorecard: {card['policy']} ({card['substrate']})", fontsize=10)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=100, format="png")
    plt.close(fig)
