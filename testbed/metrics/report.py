"""report.md: what ran, what came out (real-world units, scale stated) and whether checks held.

The report is rendered only from the summary dict (see `testbed.metrics.summary`), the checker
results and free-form notes, so it can be regenerated from a saved summary.json without rerunning
anything. Keys the caller passed as `extra` to `summarize` ("deployment", "policy", "substrate",
"seed", "offered_rps", ...) are shown under "What ran".
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from testbed.checkers.result import CheckResult
from testbed.metrics.files import atomic_write
from testbed.metrics.router_reaction import reaction_lines
from testbed.metrics.summary import link_warning
from testbed.substrates import runs_in_virtual_time
from testbed.units import format_size, format_tokens

__all__ = ["render_report", "write_report"]

_COMPUTED = {
    "duration_s",
    "scale",
    "slo",
    "requests",
    "failures",
    "throughput_rps",
    "goodput_rps",
    "slo_attainment",
    "ttft_s",
    "tpot_s",
    "itl_s",
    "e2e_s",
    "ttft_ms",
    "tpot_ms",
    "itl_ms",
    "e2e_ms",
    "benchmark",
    "routes",
    "by_route",
    "link",
    "kv_bytes",
    "tokens",
    "retries",
    "cross_dc_bytes",
    "prefix_cache",
    "queues",
    "engine",
    "policy_thresholds",
    "faults",
    "decisions",
    "router_reaction",
    "checks",  # the runner stores checker results in summary.json too; shown under Checks
}


def _num(v: Any, unit: str = "", digits: int = 4) -> str:
    if v is None:
        return "-"
    if isinstance(v, int) and not isinstance(v, bool):
        return f"{v}{unit}"
    if isinstance(v, float):
        # Large values (token counts, byte totals) read better whole than in e-notation.
        return f"{v:,.0f}{unit}" if abs(v) >= 10**digits else f"{v:.{digits}g}{unit}"
    return f"{v}{unit}"


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v * 100:.1f}%"


def _size(v: float | None) -> str:
    return "-" if v is None else format_size(v)


def _describe(value: Any) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k}={_describe(v)}" for k, v in value.items())
    if isinstance(value, list | tuple):
        return ", ".join(_describe(v) for v in value)
    return _num(value)


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
    return out


def _latency_row(name: str, s: dict[str, Any]) -> list[str]:
    return [name, *(_num(s.get(k), " s") for k in ("mean", "p50", "p90", "p99"))]


def _prefix_cache_section(cache: dict[str, Any] | None) -> list[str]:
    """Prefix reuse per prefill cluster and the pulls (absent in summaries from before the
    prefix cache, and empty when no request carried hash ids)."""
    if not cache:
        return []
    clusters = cache["clusters"]
    pulls = cache["pulls"]
    if (
        not any(c["found_tokens"] or c["hit_tokens"] for c in clusters.values())
        and not pulls["asked"]
    ):
        return []
    lines = ["", "## Prefix cache", ""]
    lines += _table(
        ["prefill cluster", "requests", "with a hit", "hit tokens", "hit fraction",
         "found cached (all requests)"],
        [
            [name, _num(c["requests"]), _num(c["hit_requests"]), _num(c["hit_tokens"]),
             _pct(c["hit_fraction"]), _num(c["found_tokens"])]
            for name, c in clusters.items()
        ],
    )  # fmt: skip
    lines += [
        "",
        f"Prefix pulls across the link: {pulls['asked']} asked, {pulls['ok']} ok, "
        f"{pulls['failed']} failed, {pulls['skipped']} skipped; {_num(pulls['tokens'])} tokens, "
        f"{_size(pulls['bytes'])}, mean {_num(pulls['seconds']['mean'], ' s')} each.",
    ]
    return lines


_RESULT = {"ok": "PASS", "failed": "**FAIL**", "vacuous": "VACUOUS"}
"""The result column of the checks table, by verdict."""


def _threshold_rows(thr: dict[str, Any]) -> list[list[str]]:
    """The threshold the run routed by (metrics.thresholds.policy_thresholds): the policy's; for
    an outside policy its own (what its routes said) and, on a row of its own, the fallback's
    (what the snapshots carried), so the one is never read as the other."""

    def span(t: dict[str, Any]) -> str:
        return (
            f"{format_tokens(t['last'])} tokens "
            f"({format_tokens(t['min'])}-{format_tokens(t['max'])})"
        )

    fallback = thr.get("fallback")
    if fallback is None:
        return [["policy threshold (last, min-max)", span(thr)]] if thr.get("samples") else []
    rows = [
        [
            "policy threshold, its routes' (last, min-max)",
            span(thr) if thr["samples"] else "none (its routes name none)",
        ]
    ]
    if fallback["samples"]:
        rows.append(["fallback threshold (last, min-max)", span(fallback)])
    return rows


def _decisions_section(summary: dict[str, Any]) -> list[str]:
    """Who routed and how fast (testbed.policy.decider): for a plugin or an HTTP policy the
    policy's decisions against the fallback's, the fallback's name and its decisions by
    reason; ask-to-route and send-to-answer latency; live, the router's event-loop lag p99 (a
    timer cannot fire while the loop is busy, so a deadline is only as sharp as that)."""
    d = summary.get("decisions")
    if not d or not d["routed"]:
        return []
    lines = ["", "## Decisions", ""]
    by, wall, answer = d["by"], d["latency_wall_ms"], d.get("answer_wall_ms")
    sim = runs_in_virtual_time(summary.get("substrate"))
    name = d.get("fallback")
    lines.append(
        f"{by['policy']} routed by the policy, {by['fallback']} by the fallback"
        + (f" ({name})" if name else "")
        + (f"; first reason: {d['first_fallback_reason']}" if by["fallback"] else "")
        + "."
    )
    if d["fallback_reasons"]:
        reasons = [[k, _num(v)] for k, v in d["fallback_reasons"].items()]
        lines += ["", *_table(["fallback reason", "requests"], reasons)]
    cols = ("p50", "p90", "p99", "max")
    rows = [["ask-to-route, wall", _num(wall["n"]), *(_num(wall[k], " ms") for k in cols)]]
    real = d.get("latency_real_ms")
    if real is not None and not sim:
        rows.append(["ask-to-route, real-world", _num(real["n"]),
                     *(_num(real[k], " ms") for k in cols)])  # fmt: skip
    if answer and answer["n"]:
        rows.append(["send-to-answer, wall", _num(answer["n"]),
                     *(_num(answer[k], " ms") for k in cols)])  # fmt: skip
    lines += ["", "Decision latency" + (" (the sim charges no virtual time for it)" if sim else
              " (real-world = wall x time_scale)") + ":", ""]  # fmt: skip
    lines += _table(["", "decisions", *cols], rows)
    lag = d.get("loop_lag_ms")
    if lag:
        lines += ["", f"Router event-loop lag: p99 {_num(lag['p99'], ' ms')}, max "
                  f"{_num(lag['max'], ' ms')} over {_num(lag['n'])} samples (a deadline fires "
                  "no sooner than the loop is free)."]  # fmt: skip
    return lines


def _checks_verdict(checks: Sequence[CheckResult]) -> str:
    """The headline's word on the checks: a vacuous check (it exercised nothing) is named, so
    a run whose checks passed only because nothing was tested does not read as all passed."""
    failed = sum(1 for c in checks if c.verdict == "failed")
    vacuous = sum(1 for c in checks if c.verdict == "vacuous")
    if failed:
        return f"{failed} FAILED" + (f", {vacuous} vacuous" if vacuous else "")
    if vacuous:
        return f"no check failed, {vacuous} VACUOUS (exercised nothing)"
    return "all checks passed"


def render_report(
    scenario_name: str,
    summary: dict[str, Any],
    checks: Sequence[CheckResult],
    notes: Sequence[str],
    *,
    timeline: str | None = None,
) -> str:
    """The markdown text of a report; `timeline` is a relative image path to embed, if any."""
    scale, req, slo = summary["scale"], summary["requests"], summary["slo"]
    verdict = _checks_verdict(checks)
    lines = [f"# {scenario_name}", ""]
    lines += [
        f"**{req['completed']}/{req['submitted']} requests completed, goodput "
        f"{summary['goodput_rps']:.4g} req/s, {verdict}.**",
        "",
        "## What ran",
        "",
        f"- scale: time_scale {scale['time']:g} (emulation ran {scale['time']:g}x faster than "
        f"real time), byte_scale {scale['bytes']:g} (KV on the wire is 1/{scale['bytes']:g} of "
        "real size). Every number below is converted back to real-world units.",
        f"- duration: {summary['duration_s']:g} s of arrivals (real-world)",
        f"- SLO: TTFT <= {slo['ttft_s']:g} s, TPOT <= {slo['tpot_s'] * 1e3:.4g} ms "
        f"(+{slo['tpot_tolerance'] * 100:g}% tolerance for goodput)",
    ]
    for key, value in summary.items():
        if key not in _COMPUTED:
            lines.append(f"- {key}: {_describe(value)}")

    lines += ["", "## Summary (real-world units)", ""]
    failures = ", ".join(f"{k}: {v}" for k, v in summary["failures"].items()) or "none"
    thr = summary.get("policy_thresholds", {})
    rows = [
        ["requests submitted", _num(req["submitted"])],
        ["completed", _num(req["completed"])],
        ["failed", f"{req['failed']} ({failures})"],
        ["throughput", _num(summary["throughput_rps"], " req/s")],
        ["goodput (within SLO)", _num(summary["goodput_rps"], " req/s")],
        ["SLO attainment", _pct(summary.get("slo_attainment"))],
        ["retries", _num(summary.get("retries"))],
        ["KV expected / sent / received", " / ".join(
            _size(summary["kv_bytes"][k]) for k in ("expected", "sent", "received")
        )],
        ["KV across the link", _size(summary["kv_bytes"].get("cross_dc"))],
    ]  # fmt: skip
    xdc = summary.get("cross_dc_bytes")
    if xdc:
        rows.append(
            ["cross-DC bytes (KV + prefix pulls)",
             f"{_size(xdc['total'])} ({_size(xdc['kv'])} + {_size(xdc['pulls'])})"]
        )  # fmt: skip
    rows += _threshold_rows(thr)
    lines += _table(["metric", "value"], rows)
    lines += ["", "### Latency", ""]
    lines += _table(
        ["", "mean", "p50", "p90", "p99"],
        [
            _latency_row("TTFT", summary["ttft_s"]),
            _latency_row("TPOT", summary["tpot_s"]),
            *([_latency_row("ITL", summary["itl_s"])] if "itl_s" in summary else []),
            _latency_row("E2E", summary["e2e_s"]),
        ],
    )

    lines += ["", "## Routes", ""]
    by_route = summary.get("by_route", {})
    if by_route:
        lines += _table(
            ["route", "requests", "completed", "failed", "mean input", "mean cached",
             "TTFT p50", "TTFT p90", "KV received"],
            [
                [route, _num(r["requests"]), _num(r["completed"]), _num(r["failed"]),
                 _num(r["input_tokens_mean"], digits=5), _num(r["cached_tokens_mean"], digits=5),
                 _num(r["ttft_s"]["p50"], " s"), _num(r["ttft_s"]["p90"], " s"),
                 _size(r["kv_bytes"])]
                for route, r in by_route.items()
            ],
        )  # fmt: skip
    else:
        lines.append("No requests.")

    lines += _prefix_cache_section(summary.get("prefix_cache"))
    lines += _decisions_section(summary)
    link = summary["link"]
    lines += ["", "## Link", ""]
    if link["samples"]:
        cfg = link["configured_gbps"]
        lines += _table(
            ["bytes moved", "mean", "peak", "configured (min-max)", "utilisation"],
            [
                [
                    _size(link["bytes"]),
                    _num(link["mean_gbps"], " Gbps"),
                    _num(link["peak_gbps"], " Gbps"),
                    f"{_num(cfg['min'])}-{_num(cfg['max'])} Gbps",
                    _pct(link.get("utilisation")),
                ]
            ],
        )
    elif not link.get("samples_missed"):
        lines.append("No link samples (no cross-datacenter link in this deployment, or none used).")
    lines += _missed_samples_line(link)
    if link.get("shaper"):
        lines += ["", _shaper_line(link)]

    queues = summary.get("queues", {})
    if queues:
        lines += ["", "## Queues", ""]
        lines += _table(
            ["cluster/role", "peak depth", "mean depth"],
            [[k, _num(v["peak_depth"]), _num(v["mean_depth"])] for k, v in queues.items()],
        )

    engine = summary.get("engine", {})
    lines += ["", "## Engine timing", ""]
    if engine.get("instances"):
        lines.append(
            "How late emulated engine steps ran against their cost-model schedule; a large "
            "timing error means the host was too slow for this time_scale and latencies are "
            "inflated."
        )
        lines.append("")
        lines += _table(
            ["instance", "steps", "lateness mean", "lateness p99", "timing error"],
            [
                [
                    name,
                    _num(e["steps"]),
                    _num(e["lateness_mean_s"], " s"),
                    _num(e["lateness_p99_s"], " s"),
                    _pct(e["timing_error"]),
                ]
                for name, e in engine["instances"].items()
            ],
        )
        lines += ["", f"Worst timing error: {_pct(engine.get('max_timing_error'))}."]
        real = [
            [name, kind, _num(s["steps"]), _num(s["padded_steps"]), _num(s["late_steps"]),
             _num(s["late_s"], " s"), _num(s["worst_compute_over_budget"])]
            for name, e in engine["instances"].items()
            for kind, s in (e.get("real_model") or {}).items()
        ]  # fmt: skip
        if real:
            lines += [
                "",
                "Real-model (engine: torch) steps padded to the profile / time_scale, or late "
                "when the CPU was slower (late time in real-world seconds; worst ratio: the "
                "slowest step's compute over its budget):",
                "",
            ]
            lines += _table(
                ["instance", "step", "steps", "padded", "late", "late total", "worst ratio"],
                real,
            )
    else:
        lines.append("No engine timing reported.")

    faults = summary.get("faults", [])
    if faults:
        lines += ["", "## Faults", ""]
        for f in faults:
            rest = {k: v for k, v in f.items() if k not in ("t", "action")}
            lines.append(
                f"- t = {f['t']:.4g} s: {f.get('action', '?')}"
                + (f" ({_describe(rest)})" if rest else "")
            )

    lines += reaction_lines(summary.get("router_reaction"))

    lines += ["", "## Checks", ""]
    if checks:
        lines += _table(
            ["check", "result", "detail"],
            [[c.name, _RESULT[c.verdict], c.detail] for c in checks],
        )
    else:
        lines.append("No checkers ran.")

    if timeline:
        lines += _timeline_section(timeline)
    if notes:
        lines += [*_NOTES]
        lines += [f"- {n}" for n in notes]
    return "\n".join(lines) + "\n"


def _missed_samples_line(link: dict[str, Any]) -> list[str]:
    """Link samples whose read failed, with their reasons: the figures above leave them out."""
    missed = int(link.get("samples_missed") or 0)
    if not missed:
        return []
    n = missed + int(link["samples"])
    why = "; ".join(f"{v}x {k}" for k, v in (link.get("samples_missed_reasons") or {}).items())
    most = " **Most samples were missed: the bytes and rates above undercount the link.**"
    return [
        "",
        f"Samples missed: {missed} of {n} ({why or 'no reason recorded'}); the bytes and rates "
        "above are from the samples read." + (most if link_warning(link) else ""),
    ]


def _shaper_line(link: dict[str, Any]) -> str:
    """Which shaper capped the link; with tc, what its qdisc counted."""
    if link["shaper"] != "tc":
        return "Shaper: emulator (the link emulator's shared `link_bandwidth` cap)."
    k = link.get("kernel")
    if not k:
        return "Shaper: tc (kernel qdisc; no counters were sampled)."
    return (
        f"Shaper: tc (kernel qdisc): {k['bytes']:,} bytes in {k['packets']:,} packets on the "
        f"shaped interface, {k['drops']:,} drops, {k['overlimits']:,} overlimits "
        "(emulated units; the rates above are from these counters)."
    )


def write_report(
    out_dir: Path,
    scenario_name: str,
    summary: dict[str, Any],
    checks: list[CheckResult],
    notes: list[str],
) -> Path:
    """Write out_dir/report.md (embedding timeline.png if it is already there) and return it."""
    out_dir.mkdir(parents=True, exist_ok=True)
    timeline = "timeline.png" if (out_dir / "timeline.png").exists() else None
    path = out_dir / "report.md"
    atomic_write(path, render_report(scenario_name, summary, checks, notes, timeline=timeline))
    return path


_NOTES = ("", "## Notes", "")


def _timeline_section(image: str) -> list[str]:
    return ["", "## Timeline", "", f"![timeline]({image})"]


def embed_timeline(out_dir: Path) -> bool:
    """Embed out_dir/timeline.png in the run's report.md where render_report puts it (before
    the notes), for a timeline drawn after the run (`testbed timeline`). False when there is
    no report.md or it already embeds the picture."""
    path = out_dir / "report.md"
    if not path.exists():
        return False
    lines = path.read_text().rstrip("\n").split("\n")
    section = _timeline_section("timeline.png")
    if section[-1] in lines:
        return False
    at = next((i for i in range(len(lines) - 2) if tuple(lines[i : i + 3]) == _NOTES), len(lines))
    atomic_write(path, "\n".join([*lines[:at], *section, *lines[at:]]) + "\n")
    return True
