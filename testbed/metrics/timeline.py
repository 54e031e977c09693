"""timeline.png: one picture of a run, to see at a glance what happened when.

Four panels share the real-world time axis, top to bottom, in the order cause leads to effect:
arrivals per second (stacked by route), total queue depth per cluster/role, link throughput
(measured against configured), and each request's TTFT at its arrival time (with the SLO line
and failed requests marked). Faults from the history are drawn as vertical lines through every
panel, so a TTFT spike can be read straight up to the fault or burst that caused it.

matplotlib is imported inside `write_timeline` so importing this module, which the CLI does, stays
cheap. It draws on a bare Figure with the Agg canvas rather than through pyplot, so it never needs
a display, never switches the process-wide backend and leaves no figure registered globally.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from testbed.metrics.files import atomic_path
from testbed.metrics.history import RunHistory, events
from testbed.metrics.records import HistoryEvent, RequestRecord
from testbed.metrics.summary import outside_policy, queue_depth_series
from testbed.metrics.table import RecordTable
from testbed.metrics.thresholds import threshold_lines

__all__ = ["draw_run", "write_timeline"]

_LEGEND: dict[str, Any] = {"loc": "upper left", "bbox_to_anchor": (1.005, 1.0), "fontsize": 8}
"""Legends sit outside the plot on the right, so they never hide data."""
_TITLE: dict[str, Any] = {"loc": "left", "fontsize": 10, "y": 1.0}
"""Panel titles at a fixed height: placed automatically, matplotlib measures every axes' tick
labels to keep clear of them (a sixth of the drawing's CPU)."""
_ROUTE_COLORS = {"prfaas": "tab:orange", "local": "tab:blue", "unrouted": "tab:gray"}
_GROUP_COLORS = {
    "prfaas/prefill": "tab:orange",
    "local/prefill": "tab:blue",
    "local/decode": "tab:green",
}


def _bin_width(span: float) -> float:
    """Arrival histogram bin: 1 s, or a 1-2-5 multiple so a long run has at most ~150 bins."""
    target = span / 150.0
    if target <= 1.0:
        return 1.0
    mag = 10.0 ** math.floor(math.log10(target))
    return next(m * mag for m in (1.0, 2.0, 5.0, 10.0) if m * mag >= target)


def _end_time(table: RecordTable, history: Sequence[HistoryEvent]) -> float:
    if isinstance(history, RunHistory):
        times = history.times()
    else:
        times = np.array([e.t for e in history], dtype=np.float64)
    cols = table.columns()
    times = np.concatenate(
        [times, *(cols[k][~np.isnan(cols[k])] for k in ("arrival", "first", "last"))]
    )
    return (float(times.max()) if len(times) else 1.0) or 1.0


def _no_data(ax: Any, what: str) -> None:
    ax.text(0.5, 0.5, f"no {what}", transform=ax.transAxes, ha="center", va="center", color="0.5")


def write_timeline(
    path: Path,
    records: Sequence[RequestRecord] | RecordTable,
    history: Sequence[HistoryEvent],
    *,
    title: str,
    ttft_slo_s: float | None = None,
    outside: bool = False,
) -> Path:
    """Render the four-panel timeline of a run to `path` (PNG) and return it.

    All times are real-world seconds since the start of the run; `ttft_slo_s` draws the SLO line
    on the TTFT panel. `outside` (the run's policy is a plugin or an HTTP service,
    metrics.summary.outside_policy) plots the policy's own threshold and labels the
    scheduler's as the fallback's (metrics.thresholds.threshold_lines).
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    table = records if isinstance(records, RecordTable) else RecordTable.of(records)
    cols = table.columns()
    end = _end_time(table, history)
    fig = Figure(figsize=(12, 11))
    # Fixed margins, not layout="constrained": the constrained layout measures every tick label
    # and legend in an extra draw pass, about a third of the drawing's CPU on every run. The
    # right margin holds the legends beside the panels.
    fig.subplots_adjust(left=0.07, right=0.79, top=0.94, bottom=0.05, hspace=0.22)
    lines = threshold_lines(table, history, outside)
    FigureCanvasAgg(fig)
    axes = fig.subplots(4, 1, sharex=True)
    ax_arr, ax_q, ax_link, ax_ttft = axes
    fig.suptitle(title, fontsize=14)

    # 1. Arrivals per second, stacked by route.
    width = _bin_width(end)
    edges = np.arange(0.0, end + width, width)
    routes = sorted(set(table.route_names))
    bottom = np.zeros(len(edges) - 1)
    for route in routes:
        arrivals = cols["arrival"][table.route_mask(cols, route)]
        counts, _ = np.histogram(arrivals, bins=edges)
        top = bottom + counts / width
        ax_arr.stairs(
            top,
            edges,
            baseline=bottom,
            fill=True,
            alpha=0.8,
            color=_ROUTE_COLORS.get(route),
            label=f"{route} ({len(arrivals)})",
        )
        bottom = top
    if len(table):  # beside the threshold's axis when there is one
        beside = {**_LEGEND, "bbox_to_anchor": (1.07, 1.0)} if lines else _LEGEND
        ax_arr.legend(**beside, title="route (requests)", title_fontsize=8)
    else:
        _no_data(ax_arr, "requests")
    ax_arr.set_ylabel("arrivals / s")
    ax_arr.set_title(f"Arrivals per second by route ({width:g} s bins)", **_TITLE)

    # 2. Queue depth per cluster/role (summed over instances).
    series = queue_depth_series(history)
    for group, (ts, depths) in series.items():
        ax_q.step(ts, depths, where="post", color=_GROUP_COLORS.get(group), label=group)
    if series:
        ax_q.legend(**_LEGEND)
    else:
        _no_data(ax_q, "queue samples")
    ax_q.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax_q.set_ylabel("queued requests")
    ax_q.set_title("Queue depth per cluster/role (sum over instances)", **_TITLE)

    # 3. Link throughput: measured over each sample interval vs configured bandwidth.
    link = sorted(events(history, "link"), key=lambda e: e.t)
    if link:
        t = [e.t for e in link]
        measured = [float(e.data.get("gbps") or 0.0) for e in link]
        configured = [e.data.get("configured_gbps") for e in link]
        # Each sample is the rate over the interval that *ends* at its time: step "pre".
        kernel = any("qdisc_bytes" in e.data for e in link)
        label = "measured (tc qdisc counters)" if kernel else "measured (emulator)"
        ax_link.step(t, measured, where="pre", color="tab:purple", label=label)
        if kernel:  # when the kernel held packets back (overlimits) or dropped them
            over = [float(e.data.get("qdisc_overlimits", 0)) for e in link]
            drops = [float(e.data.get("qdisc_drops", 0)) for e in link]
            ax_k = ax_link.twinx()
            ax_k.step(t, np.diff(over, prepend=over[0]), where="pre", color="tab:gray",
                      linewidth=0.8, label="overlimits / sample")  # fmt: skip
            if drops[-1] > drops[0]:
                ax_k.step(t, np.diff(drops, prepend=drops[0]), where="pre", color="tab:red",
                          linewidth=0.8, label="drops / sample")  # fmt: skip
            ax_k.set_ylabel("qdisc events", fontsize=8)
            ax_k.set_ylim(bottom=0)
            ax_k.legend(loc="upper left", fontsize=7, frameon=False)
        if any(c is not None for c in configured):
            ax_link.step(
                t,
                [np.nan if c is None else float(c) for c in configured],
                where="post",
                color="black",
                linestyle="--",
                label="configured",
            )
        ax_link.set_ylim(bottom=0)
        ax_link.legend(**_LEGEND)
    else:
        _no_data(ax_link, "link samples")
    ax_link.set_ylabel("Gbit/s")
    ax_link.set_title("Cross-datacenter link throughput (real-world)", **_TITLE)

    # 4. TTFT per request at its arrival time, by route; failures along the bottom.
    for route in routes:
        has = table.route_mask(cols, route) & ~np.isnan(cols["ttft"])
        if has.any():
            xs, ys = cols["arrival"][has], cols["ttft"][has]
            ax_ttft.scatter(xs, ys, s=8, alpha=0.7, color=_ROUTE_COLORS.get(route), label=route)
    failed = cols["arrival"][~cols["done"]]
    if len(failed):
        ax_ttft.scatter(
            failed,
            [0.0] * len(failed),
            marker="x",
            s=20,
            color="red",
            clip_on=False,
            label=f"failed ({len(failed)}, at their arrival)",
        )
    if ttft_slo_s is not None:
        ax_ttft.axhline(
            ttft_slo_s, color="red", linestyle="--", linewidth=1, label=f"TTFT SLO {ttft_slo_s:g} s"
        )
    if len(table):
        ax_ttft.legend(**_LEGEND)
    else:
        _no_data(ax_ttft, "requests")
    ax_ttft.set_ylim(bottom=0)
    ax_ttft.set_ylabel("TTFT (s)")
    ax_ttft.set_title("Time to first token per request, at its arrival", **_TITLE)
    ax_ttft.set_xlabel("time since start of run (real-world seconds)")
    ax_ttft.set_xlim(0, end)

    # The threshold over time (twin axis of the arrivals panel) and every PD split change
    # (long-term loop) through every panel.
    if lines:
        ax_t = ax_arr.twinx()
        for label, (steps, style) in lines.items():
            ax_t.step(
                [t for t, _ in steps] + [end],
                [v / 1000 for _, v in steps] + [steps[-1][1] / 1000],
                where="post",
                color="black" if style == "-" else "0.45",
                linestyle=style,
                linewidth=1,
                label=label,
            )
        if outside:  # two lines to tell apart, under the routes' legend
            ax_t.legend(loc="lower left", bbox_to_anchor=(1.04, 0.0), fontsize=7)
        ax_t.set_ylim(bottom=0)
        ax_t.set_ylabel("t (K tokens)")
    for e in events(history, "split", "fault"):
        if e.kind == "split":
            label = f"PD {e.data.get('n_prefill')}/{e.data.get('n_decode')}"
            _mark(axes, ax_q, e.t, label, "darkgreen", "--")
        elif e.kind == "fault":  # through every panel, labelled once at the top
            _mark(axes, ax_arr, e.t, str(e.data.get("action", "fault")), "crimson", ":")

    for ax in axes:
        ax.grid(True, alpha=0.3)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:  # a reader never sees half a PNG
        fig.savefig(tmp, dpi=100, format="png")
    return path


def draw_run(
    out_dir: Path,
    records: Sequence[RequestRecord] | RecordTable,
    history: Sequence[HistoryEvent],
    summary: dict[str, Any],
) -> Path:
    """out_dir/timeline.png of the run `summary` describes (its summary.json): the title, the
    SLO line and the threshold's labels come from the summary, so a run and `testbed timeline`
    on its files afterwards draw the same picture."""
    return write_timeline(
        out_dir / "timeline.png",
        records,
        history,
        title=f"{summary['scenario']} ({summary['policy']})",
        ttft_slo_s=summary["slo"]["ttft_s"],
        outside=outside_policy(summary["decisions"]),
    )


def _mark(axes: Sequence[Any], labelled: Any, t: float, label: str, color: str, style: str) -> None:
    """A vertical line at `t` through every panel, labelled at the top of one."""
    for ax in axes:
        ax.axvline(t, color=color, linestyle=style, linewidth=1.2)
    labelled.annotate(
        label,
        (t, 1.0),
        xycoords=("data", "axes fraction"),
        xytext=(2, -10),
        textcoords="offset points",
        fontsize=8,
        color=color,
    )
