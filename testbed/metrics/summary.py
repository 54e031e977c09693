"""One run's numbers, in real-world units, as a plain JSON-ready dict.

Everything a report, a comparison or a CI assertion needs is computed here from the two inputs
every run leaves behind: the request records and the history. Records and history times are
already real-world seconds (the run's clock converts emulated time); byte fields named
`wire` are emulated and become real-world bytes here by multiplying by byte_scale. The scale is
written into the summary so a reader always knows how the numbers were produced.

Definitions worth knowing:
- throughput_rps: completed requests / duration_s (the arrival window of the run).
- goodput_rps: completed requests whose TTFT <= slo.ttft, whose TPOT <= (1 / decode speed)
  x (1 + slo.tpot_tolerance) and, when the scenario sets `slo.e2e`, whose E2E <= slo.e2e, per
  second of duration_s. A request with fewer than two output tokens has no TPOT and is judged on
  the other bounds. The tolerance (default TPOT_TOLERANCE) absorbs scheduler jitter of an
  emulated decode step that is nominally exactly at the SLO (the planner sizes batches to hit
  it).
- ttft/tpot/itl/e2e `_s` and `_ms`: mean, std, min, max, p50/p90/p99 and the `percentiles`
  asked for; `benchmark`: the same figures and token throughputs under `vllm bench serve`'s
  names (metrics.bench, docs/metrics.md).
- latency statistics (ttft_s, tpot_s, e2e_s) are over completed requests only: a failed request's
  latency is not a latency but a failure, counted under `failures`.
- link: from "link" history events. bytes = the last cumulative `wire_bytes` x byte_scale;
  mean_gbps = those bytes over the time of the last sample (the counter starts at 0 at t = 0);
  peak_gbps = the largest sampled interval rate. With the kernel shaper (`shaper: tc`) the
  samples are the qdisc's counters: `wire_bytes` is the qdisc's bytes as TCP payload (divided by
  testbed.link.tc.WIRE_PER_PAYLOAD), and `kernel` keeps the last raw counters (bytes, packets,
  drops, overlimits; emulated units). `samples_missed` counts the "link_miss" events (a sample
  whose read failed), `samples_missed_reasons` their reasons (the most frequent LINK_REASONS):
  bytes and rates undercount what moved by whatever the missed samples would have shown, and
  when most samples of a run were missed the console says so (`link_warning`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np

from testbed.clock import LiveClock, Scale
from testbed.config import SloConfig
from testbed.metrics.bench import DEFAULT_PERCENTILES, benchmark, latency_sections, stats
from testbed.metrics.history import RunHistory, events
from testbed.metrics.records import HistoryEvent, RequestRecord
from testbed.metrics.router_reaction import router_reaction
from testbed.metrics.table import RecordTable
from testbed.metrics.thresholds import policy_thresholds
from testbed.policy.decider import wall_percentiles_ms
from testbed.substrates import runs_in_virtual_time
from testbed.units import format_size

__all__ = [
    "TPOT_TOLERANCE",
    "link_stats",
    "link_warning",
    "meets_slo",
    "queue_depth_series",
    "stats",
    "summarize",
    "to_text",
]

TPOT_TOLERANCE = 0.05
"""Relative slack on the TPOT SLO when judging goodput (see the module docstring)."""
LINK_REASONS = 5
"""Distinct reasons of missed link samples kept in the summary (the most frequent)."""


def meets_slo(rec: RequestRecord, slo: SloConfig) -> bool:
    """Whether a request counts towards goodput: completed, TTFT, TPOT (and E2E) within the
    SLO."""
    if rec.status != "completed" or rec.ttft is None or rec.ttft > slo.ttft:
        return False
    if slo.e2e is not None and (rec.e2e is None or rec.e2e > slo.e2e):
        return False
    tpot = rec.tpot
    return tpot is None or tpot <= slo.tpot * (1.0 + slo.tpot_tolerance)


def link_stats(history: Sequence[HistoryEvent], byte_scale: float) -> dict[str, Any]:
    """Bytes and rates of the inter-datacenter link from its "link" samples, real-world units,
    and the samples missed ("link_miss" events: read, and failed) with their reasons."""
    samples = sorted(events(history, "link"), key=lambda e: e.t)
    why = Counter(str(e.data.get("reason") or "unknown") for e in events(history, "link_miss"))
    missed = {
        "samples_missed": sum(why.values()),
        "samples_missed_reasons": dict(why.most_common(LINK_REASONS)),
    }
    if not samples:
        return {
            "samples": 0,
            **missed,
            "bytes": 0.0,
            "mean_gbps": None,
            "peak_gbps": None,
            "configured_gbps": {"min": None, "max": None},
            "utilisation": None,
            "kernel": None,
        }
    real_bytes = float(max(e.data.get("wire_bytes", 0) for e in samples)) * byte_scale
    last_t = samples[-1].t
    mean_gbps = real_bytes * 8.0 / 1e9 / last_t if last_t > 0 else None
    rates = [float(e.data["gbps"]) for e in samples if e.data.get("gbps") is not None]
    configured = [
        float(e.data["configured_gbps"])
        for e in samples
        if e.data.get("configured_gbps") is not None
    ]
    mean_configured = _time_weighted_mean(samples, "configured_gbps")
    return {
        "samples": len(samples),
        **missed,
        "bytes": real_bytes,
        "mean_gbps": mean_gbps,
        "peak_gbps": max(rates) if rates else None,
        "configured_gbps": {
            "min": min(configured) if configured else None,
            "max": max(configured) if configured else None,
        },
        "utilisation": (
            mean_gbps / mean_configured if mean_gbps is not None and mean_configured else None
        ),
        "kernel": _kernel_counters(samples),
    }


def link_warning(link: dict[str, Any]) -> str | None:
    """The console's warning when most of a run's link samples were missed (more missed than
    read): its link figures then say little about what moved. None otherwise."""
    missed = int(link.get("samples_missed") or 0)
    if missed <= int(link.get("samples") or 0):
        return None
    first = next(iter(link.get("samples_missed_reasons") or {}), "unknown")
    return (
        f"WARNING: link: {missed} of {missed + int(link.get('samples') or 0)} samples missed "
        f"({first}): the link's bytes and rates undercount what moved"
    )


def _kernel_counters(samples: Sequence[HistoryEvent]) -> dict[str, int] | None:
    """The last qdisc counters of a tc-shaped link's samples; None when the emulator shaped."""
    kernel = [e for e in samples if "qdisc_bytes" in e.data]
    if not kernel:
        return None
    last = kernel[-1].data
    return {k: int(last.get(f"qdisc_{k}", 0)) for k in ("bytes", "packets", "drops", "overlimits")}


def _time_weighted_mean(samples: Sequence[HistoryEvent], key: str) -> float | None:
    """Mean of a sampled value, each sample weighted by the interval it closes (from t = 0)."""
    total, weight, prev_t = 0.0, 0.0, 0.0
    for e in samples:
        v = e.data.get(key)
        dt = e.t - prev_t
        prev_t = e.t
        if v is None or dt <= 0:
            continue
        total += float(v) * dt
        weight += dt
    return total / weight if weight > 0 else None


def queue_depth_series(history: Sequence[HistoryEvent]) -> dict[str, tuple[list[float], list[int]]]:
    """Total queue depth per "cluster/role" over time, summed over that group's instances.

    Instances sample at their own instants, so each instance's depth is held at its last sampled
    value (0 before its first sample) and the group total is evaluated at every sample instant of
    the group. Returns {"prfaas/prefill": (times, depths), ...}.
    """
    if isinstance(history, RunHistory) and not history.loose_queue:  # samples as columns
        return _series_totals(history.queue_series())
    raw: dict[str, dict[str, list[tuple[float, int]]]] = {}
    for e in history:
        if e.kind != "queue":
            continue
        key = f"{e.data.get('cluster', '?')}/{e.data.get('role', '?')}"
        inst = str(e.data.get("instance", "?"))
        raw.setdefault(key, {}).setdefault(inst, []).append((e.t, int(e.data.get("depth", 0))))
    columns: dict[str, dict[Any, tuple[np.ndarray, np.ndarray]]] = {}
    for key, per_instance in raw.items():
        for inst, series in per_instance.items():
            series.sort(key=lambda p: p[0])
            ts = np.array([t for t, _ in series])
            ds = np.array([d for _, d in series], dtype=np.int64)
            columns.setdefault(key, {})[inst] = (ts, ds)
    return _series_totals(columns)


def _series_totals(
    columns: dict[str, dict[Any, tuple[np.ndarray, np.ndarray]]],
) -> dict[str, tuple[list[float], list[int]]]:
    """Each group's total depth at every sample instant of the group (see queue_depth_series)."""
    out: dict[str, tuple[list[float], list[int]]] = {}
    for key, per_instance in sorted(columns.items()):
        grid = np.unique(np.concatenate([ts for ts, _ in per_instance.values()]))
        total = np.zeros(len(grid), dtype=np.int64)
        for ts, ds in per_instance.values():
            idx = np.searchsorted(ts, grid, side="right") - 1
            total += np.where(idx >= 0, ds[np.maximum(idx, 0)], 0)
        out[key] = (grid.tolist(), total.tolist())
    return out


def _queues(history: Sequence[HistoryEvent]) -> dict[str, Any]:
    """Peak and mean (over sample instants) total queue depth per cluster/role."""
    return {
        key: {"peak_depth": max(depths), "mean_depth": float(np.mean(depths))}
        for key, (_, depths) in queue_depth_series(history).items()
    }


def _engines(history: Sequence[HistoryEvent]) -> dict[str, Any]:
    instances: dict[str, Any] = {}
    for e in events(history, "engine"):
        d = e.data
        instances[str(d.get("instance", "?"))] = {
            "steps": d.get("steps"),
            "lateness_mean_s": d.get("lateness_mean_s"),
            "lateness_p99_s": d.get("lateness_p99_s"),
            "timing_error": d.get("timing_error"),
        }
        # engine: torch reports its CpuPacer's per-kind padded/late step counts instead
        real = {k: d[k] for k in ("prefill_layer", "decode_step") if isinstance(d.get(k), dict)}
        if real:
            instances[str(d.get("instance", "?"))]["real_model"] = real
    errors = [float(v["timing_error"]) for v in instances.values() if v["timing_error"] is not None]
    return {"instances": instances, "max_timing_error": max(errors) if errors else None}


def summarize(
    records: Sequence[RequestRecord] | RecordTable,
    history: Sequence[HistoryEvent],
    *,
    duration_s: float,
    slo: SloConfig,
    scale: Scale,
    extra: dict[str, Any] | None = None,
    percentiles: Sequence[float] = DEFAULT_PERCENTILES,
) -> dict[str, Any]:
    """The summary of one run (see the module docstring for definitions).

    `extra` is merged in at the top level for what only the caller knows, e.g. "scenario",
    "deployment", "policy", "substrate", "seed", "offered_rps"; the report shows these. A key that
    would overwrite a computed one is an error rather than a silent replacement.
    """
    if duration_s <= 0:
        raise ValueError(f"duration_s must be positive, got {duration_s!r}")
    byte_scale = scale.byte_scale
    table = records if isinstance(records, RecordTable) else RecordTable.of(records)
    cols = table.columns()
    n = len(table)
    n_done = int(cols["done"].sum())
    good = table.good(cols, slo)
    done = table.done(cols)
    summary: dict[str, Any] = {
        "duration_s": duration_s,
        "scale": scale.to_json(),
        "slo": {
            "ttft_s": slo.ttft,
            "tpot_s": slo.tpot,
            "tpot_tolerance": slo.tpot_tolerance,
            "e2e_s": slo.e2e,
        },
        "requests": {"submitted": n, "completed": n_done, "failed": n - n_done},
        "failures": dict(sorted(table.failures.items())),
        "throughput_rps": n_done / duration_s,
        "goodput_rps": good / duration_s,
        "slo_attainment": good / n if n else None,
        **latency_sections(done, percentiles),
        "benchmark": benchmark(done, good, duration_s, percentiles),
        "routes": table.routes(),
        "by_route": table.by_route(cols, byte_scale),
        "link": link_stats(history, byte_scale),
        "kv_bytes": {
            "expected": float(table.kv_expected) * byte_scale,
            "sent": float(table.kv_sent) * byte_scale,
            "received": float(table.kv_received) * byte_scale,
            "cross_dc": float(table.kv_cross_dc) * byte_scale,
        },
        "tokens": {
            "input": int(cols["input"].sum()),
            "cached": int(cols["cached"].sum()),
            "output": int(cols["tokens_out"].sum()),
        },
        "cross_dc_bytes": {
            "kv": float(table.kv_cross_dc) * byte_scale,
            "pulls": float(table.pulls["bytes"]) * byte_scale,
            "total": float(table.kv_cross_dc) * byte_scale
            + float(table.pulls["bytes"]) * byte_scale,
        },
        "prefix_cache": table.prefix_cache(cols, byte_scale),
        "retries": table.retries,
        "queues": _queues(history),
        "engine": _engines(history),
        "policy_thresholds": policy_thresholds(table, history),
        "faults": [{"t": e.t, **e.data} for e in events(history, "fault")],
        "decisions": decisions(table, history, scale),
    }
    # an external router's attempts (live only: the sim, whose table may hold no records, has none)
    reaction = router_reaction(table.records, history) if table.records is not None else None
    if reaction is not None:
        summary["router_reaction"] = reaction
    if outside_policy(summary["decisions"]):  # its own threshold, the fallback's beside it
        summary["policy_thresholds"] = policy_thresholds(table, history, outside=True)
    for key, value in (extra or {}).items():
        if key in summary:
            raise ValueError(f"extra key {key!r} would overwrite a computed summary field")
        summary[key] = value
    return summary


def decisions(
    records: Sequence[RequestRecord] | RecordTable, history: Sequence[HistoryEvent], scale: Scale
) -> dict[str, Any]:
    """Who routed (policy or fallback), which policy the fallback is, why it decided (by
    `fallback_kind`), and how long decisions took, in wall milliseconds: ask-to-route
    (`latency_wall_ms`: from asking the policy to holding a route, fallback included) and
    send-to-answer (`answer_wall_ms`: an HTTP policy's exchange, for the answers read in time).
    Live runs add ask-to-route in real-world milliseconds (`latency_real_ms`: wall x time_scale,
    what the emulated deployment waited) and the router's event-loop lag (`loop_lag_ms`: how
    late its timers fire; null when the router did not say). The sim charges a decision no
    virtual time, so it reports wall figures only, from its `decisions` event (its records
    carry none: same seed, same requests.jsonl). One latency per routed request (its last
    attempt's decision; testbed.policy.decider)."""
    table = records if isinstance(records, RecordTable) else RecordTable.of(records)
    routed = sum(table.decided.values())
    wall = wall_percentiles_ms(table.decision_wall)
    answer = wall_percentiles_ms(table.decision_answer)
    said: dict[str, Any] = {}  # the sim's decisions event, or the live router's (its /stats)
    for e in events(history, "decisions"):
        said.update(e.data)
    sim = "wall_ms" in said
    if sim and not wall["n"]:
        wall = dict(said["wall_ms"])
        answer = dict(said.get("answer_wall_ms") or answer)
    clock = LiveClock.paced(scale)
    out: dict[str, Any] = {
        "routed": routed,
        "by": {
            "policy": table.decided.get("policy", 0),
            "fallback": table.decided.get("fallback", 0),
        },
        "fallback": said.get("fallback"),
        "fallback_reasons": dict(sorted(table.fallback_kinds.items())),
        "first_fallback_reason": table.first_fallback,
        "latency_wall_ms": wall,
        "answer_wall_ms": answer,
        "loop_lag_ms": said.get("loop_lag_ms"),
    }
    if not sim:
        out["latency_real_ms"] = {
            k: (v if k == "n" or v is None else clock.real(v)) for k, v in wall.items()
        }
    return out


def outside_policy(d: dict[str, Any]) -> bool:
    """Whether the run's policy was an outside one (a plugin or an HTTP service: it has a
    fallback), whose decisions the console and the report always account for."""
    return d.get("fallback") is not None or bool(d["by"]["fallback"] or d["answer_wall_ms"]["n"])


def _decisions_text(summary: dict[str, Any]) -> list[str]:
    """One console line for every run of an outside policy (a plugin or an HTTP one), a clean
    run too: who decided, the fallback's name and kinds, ask-to-route and send-to-answer wall
    latency, the router's loop lag. None for a built-in policy (it is its own reference)."""
    d = summary.get("decisions")
    if not d or not outside_policy(d):
        return []
    why = ", ".join(f"{k} {v}" for k, v in d["fallback_reasons"].items())
    name = d.get("fallback") or "?"
    lat, ans, lag = d["latency_wall_ms"], d["answer_wall_ms"], d.get("loop_lag_ms")
    line = (
        f"decisions: {d['by']['policy']} by the policy, {d['by']['fallback']} by the fallback "
        f"({name}{': ' + why if why else ''}); ask-to-route p50 {_ms(lat['p50'])} p99 "
        f"{_ms(lat['p99'])} ms"
    )
    if ans["n"]:
        line += f", send-to-answer p50 {_ms(ans['p50'])} p99 {_ms(ans['p99'])} ms"
    if lag:
        line += f", loop lag p99 {_ms(lag['p99'])} ms"
    return [line]


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.3g}"


def _fmt(v: float | None, unit: str = "s", digits: int = 3) -> str:
    return "-" if v is None else f"{v:.{digits}g}{unit}"


def _cache_text(summary: dict[str, Any]) -> list[str]:
    """One console line on cross-DC bytes and prefix hits, when the run had a prefix cache."""
    cache, xdc = summary.get("prefix_cache"), summary.get("cross_dc_bytes")
    if not cache or not xdc:
        return []
    hits = cache["clusters"]
    pulls = cache["pulls"]
    if not pulls["asked"] and not any(c["hit_tokens"] for c in hits.values()):
        return []
    return [
        f"cross-DC {format_size(xdc['total'])} (KV {format_size(xdc['kv'])} + pulls "
        f"{format_size(xdc['pulls'])}); prefix hits: "
        + ", ".join(f"{k} {v['hit_tokens']:,} tokens" for k, v in hits.items())
        + f"; pulls {pulls['ok']}/{pulls['asked']} ok"
    ]


def to_text(summary: dict[str, Any]) -> str:
    """A few lines for the console after a run."""
    req, scale, link = summary["requests"], summary["scale"], summary["link"]
    ttft, e2e = summary["ttft_s"], summary["e2e_s"]
    routes = ", ".join(f"{k} {v}" for k, v in summary["routes"].items()) or "-"
    top = sorted(summary["failures"].items(), key=lambda kv: -kv[1])
    failures = "; ".join(f"{v}x {k[:100]}" for k, v in top[:3])
    if len(top) > 3:
        failures += f"; and {len(top) - 3} other reasons (see summary.json)"
    lines = [
        f"requests: {req['submitted']} submitted, {req['completed']} completed, "
        f"{req['failed']} failed" + (f" ({failures})" if failures else ""),
        f"throughput {summary['throughput_rps']:.3g} req/s, goodput "
        f"{summary['goodput_rps']:.3g} req/s over {summary['duration_s']:g}s; routes: {routes}",
        f"TTFT mean {_fmt(ttft['mean'])} p50 {_fmt(ttft['p50'])} p90 {_fmt(ttft['p90'])} "
        f"p99 {_fmt(ttft['p99'])}; E2E p50 {_fmt(e2e['p50'])} p99 {_fmt(e2e['p99'])}",
        f"link: {format_size(link['bytes'])} moved, mean {_fmt(link['mean_gbps'], ' Gbps')}, "
        f"peak {_fmt(link['peak_gbps'], ' Gbps')}"
        + (f"; shaper {link['shaper']}" if link.get("shaper") else "")
        + (f"; {link['samples_missed']} samples missed" if link.get("samples_missed") else ""),
        *filter(None, [link_warning(link)]),
        *_cache_text(summary),
        *_decisions_text(summary),
        f"(real-world units; simulated in virtual time, byte_scale {scale['bytes']:g})"
        if runs_in_virtual_time(summary.get("substrate"))
        else f"(real-world units; time_scale {scale['time']:g}, byte_scale {scale['bytes']:g})",
    ]
    wall = summary.get("wall")
    if wall and wall.get("simulate_s") is not None:
        lines.append(
            f"wall: {wall['simulate_s']:.2f}s running, {wall['results_s']:.2f}s results, "
            f"{wall['total_s']:.2f}s in all"
        )
    return "\n".join(lines)
