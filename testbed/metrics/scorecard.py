"""The figures a scorecard and a hindsight sweep compare runs by, and the files they write.

One run becomes one flat row (`run_row`): goodput at the SLO, SLO attainment (the share of
requests within both the TTFT and TPOT SLOs, testbed.metrics.summary.meets_slo), TTFT p50/p90/p99,
the P90 TTFT over the fault window, failures, cross-datacenter bytes, each checker's verdict and
who decided the routes (the policy or its fallback). Rows of the same setting over several seeds
are averaged (`mean_rows`); a scorecard compares the policy's mean row with each baseline's
(`compare`, testbed.metrics.verdict: the rule and the criterion that decided each verdict) and
counts wins, ties, losses and the scenarios not judged (the fallback decided too much there).

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

from testbed.checkers.policy_share import Share, policy_share
from testbed.checkers.result import CheckResult
from testbed.config import SloConfig
from testbed.metrics.files import atomic_path, atomic_write
from testbed.metrics.records import HistoryEvent, RequestRecord
from testbed.metrics.summary import summarize
from testbed.metrics.verdict import (
    ATTAINMENT_TIE,
    GOODPUT_TIE,
    METRICS,
    NOT_JUDGED,
    TTFT_TIE,
    compare,
)
from testbed.nemesis import PlannedFault
from testbed.policy.decider import describe

__all__ = [
    "ATTAINMENT_TIE",
    "GOODPUT_TIE",
    "HEADLINE",
    "METRICS",
    "TTFT_TIE",
    "compare",
    "fault_window",
    "headline",
    "mean_rows",
    "not_judged",
    "overall_text",
    "run_row",
    "window_percentile",
    "write_hindsight",
    "write_scorecard",
]


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


HEADLINE = {
    "requests": "requests.submitted",
    "completed": "requests.completed",
    "failed": "requests.failed",
    "throughput_rps": "throughput_rps",
    "goodput_rps": "goodput_rps",
    "slo_attainment": "slo_attainment",
    "ttft_p50_s": "ttft_s.p50",
    "ttft_p90_s": "ttft_s.p90",
    "ttft_p99_s": "ttft_s.p99",
}
"""A run's headline figures: flat name -> its dotted path in the summary (summary.json)."""


def headline(summary: dict[str, Any]) -> dict[str, Any]:
    """The headline figures of a summary (testbed.metrics.summary.summarize), flat, in
    `HEADLINE`'s order: the first columns of a scorecard's run row."""
    out: dict[str, Any] = {}
    for name, path in HEADLINE.items():
        value: Any = summary
        for key in path.split("."):
            value = value[key]
        out[name] = value
    return out


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
        **headline(s),
        "window_s": [window[0], window[1]],
        "ttft_p90_window_s": None if w is None or math.isinf(w) else w,
        "window_lost": w is not None and math.isinf(w),
        "cross_dc_gib": s["cross_dc_bytes"]["total"] / 2**30,
        "link_mean_gbps": s["link"].get("mean_gbps"),
        "routes": s["routes"],
        "checks": {c.name: c.verdict for c in checks},
        "decisions": policy_share(records, history).to_json(),
    }


def _mean(values: Sequence[Any]) -> float | None:
    if not values or any(v is None for v in values):
        return None  # one seed without a figure (or an infinite window P90): no mean
    return float(sum(values)) / len(values)


def mean_rows(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The mean over seeds of each metric, each checker's verdict over them ("ok" only if
    every seed passed, else "failed" (or "vacuous") with how many seeds did), and who decided
    the routes over all seeds (`policy_share`: testbed.checkers.policy_share.Share.to_json;
    None for rows that do not say, such as a cache written before it was kept)."""
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
    decided = [r["decisions"] for r in rows if r.get("decisions")]
    out["policy_share"] = Share.total(decided).to_json() if decided else None
    return out


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


def not_judged(card: Mapping[str, Any]) -> list[str]:
    """The scenarios where the policy under test decided too little to be judged (the command
    exits 1 when there is any)."""
    return [sc["name"] for sc in card["scenarios"] if not sc.get("judged", True)]


def _overall_lines(card: Mapping[str, Any]) -> list[str]:
    lines = []
    bound = card.get("min_policy_share", 1.0)
    for base, o in card["overall"].items():
        att = o["mean_slo_attainment_delta"]
        shown = "-" if att is None else f"{att * 100:+.1f} pt"
        skip = o.get("not_judged", 0)
        why = (
            f", {skip} not judged (the fallback decided more than {(1 - bound) * 100:.3g}% "
            "of the routes)"
            if skip
            else ""
        )
        lines.append(
            f"vs {describe(base)}: {o['win']} wins, {o['tie']} ties, {o['loss']} losses{why} "
            f"over {o['scenarios']} scenarios; mean SLO attainment delta {shown}"
            + (" (judged scenarios only)" if skip and att is not None else "")
        )
    return lines


def overall_text(card: Mapping[str, Any]) -> str:
    """The scorecard's overall line(s), as printed at the end of the command."""
    who = describe(card["policy"])
    return "\n".join(f"overall {who} " + line for line in _overall_lines(card))


def _verdict_cell(cmp: Mapping[str, Any]) -> str:
    """The verdict column of a delta row: "**loss**: SLO attainment -22.1 pt; gates: baseline
    fails ttft_p90_during_bandwidth"."""
    if cmp["verdict"] == NOT_JUDGED:
        return f"**{cmp['criterion']}**"
    gates = cmp.get("gates") or {}
    shown = [f"{side} fails {', '.join(names)}" for side, names in gates.items() if names]
    tail = f"; gates: {'; '.join(shown)}" if shown else ""
    return f"**{cmp['verdict']}**: {cmp.get('criterion', '')}{tail}"


def _share_text(share: Mapping[str, Any] | None) -> str:
    if share is None or share.get("share") is None:
        return "-"
    return f"{share['share']:.1%}"


def scorecard_markdown(card: Mapping[str, Any]) -> str:
    policy = card["policy"]
    who = describe(policy)
    bound = card.get("min_policy_share", 1.0)
    lines = [
        f"# Scorecard: {who}",
        "",
        f"Substrate {card['substrate']}; baselines {', '.join(card['baselines'])}; seeds "
        f"{', '.join(str(s) for s in card['seeds'])}; {card['runs']} runs "
        f"({card.get('cached_runs', 0)} from the cache) in "
        f"{card['wall_s']:.1f} s wall ({card.get('cpu_s', 0.0):.0f} CPU s). Figures are means "
        "over the seeds. SLO attainment is the share of requests within both the TTFT and TPOT "
        f"SLOs. A scenario where the policy decided less than {bound:.0%} of the routes itself "
        "(its fallback the rest) is not judged. Verdict: SLO attainment (more than "
        f"{ATTAINMENT_TIE * 100:g} pt apart), then P90 TTFT (more than {TTFT_TIE:.0%} apart), "
        "then, on a tie, a checker failing for one side only; never a win worse on SLO "
        "attainment, goodput and P90 TTFT at once. Against hindsight-best: its objective only "
        f"(P90 TTFT over the fault window, {TTFT_TIE:.0%}; goodput, {GOODPUT_TIE:.0%}). The "
        "checkers either side fails (gates) are shown beside each verdict.",
        "",
        *([f"External router: {card['router']['setup']}.", ""] if card.get("router") else []),
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
        share = sc.get("policy_share")
        if share is not None and share.get("by") == "router":  # testbed.scenario.scorecard_router
            lines += [f"Decided by {who}: all {share['policy']} routes (our policy none).", ""]
        elif share is not None and share.get("share") is not None:
            kinds = ", ".join(f"{k} {v}" for k, v in share["reasons"].items())
            lines += [
                f"Decided by {who}: {share['policy']} of {share['policy'] + share['fallback']} "
                f"routes ({share['share']:.1%}); by its fallback {share['fallback']}"
                + (f" ({kinds})." if kinds else "."),
                "",
            ]
        cols = list(METRICS)
        lines.append("| row | " + " | ".join(c[1] for c in cols) + " | decided by the policy "
                     "| checkers |")  # fmt: skip
        lines.append("|---|" + "---|" * (len(cols) + 2))
        for label, row in sc["rows"].items():
            checks = ", ".join(f"{k} {v}" for k, v in row["checks"].items()) or "-"
            lines.append(
                f"| {describe(label)} | "
                + " | ".join(_fmt(row.get(k), spec) for k, _, spec, _ in cols)
                + f" | {_share_text(row.get('policy_share'))} | {checks} |"
            )
        for base, cmp in sc["against"].items():
            lines.append(
                f"| {who} - {describe(base)} | "
                + " | ".join(_delta(cmp["deltas"].get(k), spec) for k, _, spec, _ in cols)
                + f" | | {_verdict_cell(cmp)} |"
            )
        lines.append("")
    return "\n".join(lines)


def _cell_text(verdict: str, share: float | None) -> str:
    if verdict == NOT_JUDGED and share is not None:
        return f"{verdict} ({(1 - share) * 100:.3g}% fallback)"
    return verdict


_COLOURS = {"win": "#c8e6c9", "tie": "#eeeeee", "loss": "#ffcdd2", NOT_JUDGED: "#ffe0b2"}


def _plot(card: Mapping[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scenarios = card["scenarios"]
    labels = list(dict.fromkeys(label for sc in scenarios for label in sc["rows"]))
    bases = list(dict.fromkeys(b for sc in scenarios for b in sc["against"]))
    fig, (ax_a, ax_t, ax_v) = plt.subplots(
        3,
        1,
        figsize=(max(8.0, 1.1 * len(scenarios) + 3), 9 + 0.3 * len(bases)),
        gridspec_kw={"height_ratios": [3, 3, 1 + 0.4 * len(bases)]},
    )
    width = 0.8 / max(len(labels), 1)
    xs = range(len(scenarios))
    for k, label in enumerate(labels):
        att = [(sc["rows"].get(label) or {}).get("slo_attainment") for sc in scenarios]
        p90 = [(sc["rows"].get(label) or {}).get("ttft_p90_s") for sc in scenarios]
        pos = [x + (k - (len(labels) - 1) / 2) * width for x in xs]
        shown = describe(label)
        ax_a.bar(pos, [a * 100 if a is not None else 0 for a in att], width, label=shown)
        ax_t.bar(pos, [p if p is not None else 0 for p in p90], width, label=shown)
    names = [sc["name"] for sc in scenarios]
    for ax in (ax_a, ax_t):
        ax.set_xticks(list(xs))
        ax.set_xticklabels(names, rotation=30, ha="right", fontsize=8)
    ax_a.set(ylabel="SLO attainment (%)", title="SLO attainment (higher is better)")
    ax_t.set(ylabel="TTFT p90 (s)", title="P90 TTFT (lower is better)")
    ax_t.set_yscale("log")
    ax_a.legend(fontsize=7, ncol=min(len(labels), 4))
    # the verdicts: one row per baseline, one column per scenario, coloured by the verdict
    ax_v.axis("off")
    if scenarios and bases:
        verdicts = [
            [(sc["against"].get(b) or {}).get("verdict", "-") for sc in scenarios] for b in bases
        ]
        shares = [(sc.get("policy_share") or {}).get("share") for sc in scenarios]
        texts = [
            [_cell_text(v, share) for v, share in zip(row, shares, strict=True)] for row in verdicts
        ]
        table = ax_v.table(
            cellText=texts,
            rowLabels=[f"vs {describe(b)}" for b in bases],
            colLabels=names,
            cellColours=[[_COLOURS.get(v, "white") for v in row] for row in verdicts],
            loc="upper center",
            cellLoc="center",
        )
        table.auto_set_font_size(False)
        table.set_fontsize(7)
        ax_v.set_title(f"verdicts of {describe(card['policy'])} (scorecard.md says why)")
    fig.suptitle(f"scorecard: {describe(card['policy'])} ({card['substrate']})", fontsize=10)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=100, format="png")
    plt.close(fig)
