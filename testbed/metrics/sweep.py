"""The sweep's outputs: sweep.csv, sweep.md and sweep.png (goodput and P90 TTFT against the swept
axes, and the Pareto front of goodput per GPU against P90 TTFT)."""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from testbed.metrics.files import atomic_path, atomic_write

__all__ = ["pareto_front", "write_sweep"]

_SHOWN = (
    ("throughput_rps", "throughput", ".2f"),
    ("goodput_rps", "goodput", ".2f"),
    ("goodput_per_gpu", "goodput/GPU", ".4f"),
    ("ttft_p90_s", "TTFT p90 (s)", ".2f"),
    ("slo_attainment", "SLO", ".0%"),
    ("link_mean_gbps", "link (Gbps)", ".1f"),
    ("planner_lambda_max_rps", "planner lambda_max", ".2f"),
    ("sim_saturation_rps", "sim saturation", ".2f"),
    ("saturation_vs_planner", "sim vs planner", "+.1%"),
    ("planner_bottleneck", "planner bottleneck", ""),
)


def pareto_front(rows: Sequence[dict[str, Any]]) -> list[int]:
    """Indices of the cells no other cell beats on both goodput per GPU (higher) and P90 TTFT
    (lower), sorted by TTFT."""
    pts = [
        (i, r["ttft_p90_s"], r["goodput_per_gpu"])
        for i, r in enumerate(rows)
        if r.get("ttft_p90_s") is not None and r.get("goodput_per_gpu") is not None
    ]
    front = [
        i
        for i, t, g in pts
        if not any((t2 <= t and g2 >= g) and (t2 < t or g2 > g) for _, t2, g2 in pts)
    ]
    return sorted(front, key=lambda i: rows[i]["ttft_p90_s"])


def _fmt(v: Any, spec: str) -> str:
    if v is None:
        return "-"
    return format(v, spec) if spec else str(v)


def write_sweep(rows: Sequence[dict[str, Any]], axes: Sequence[str], out: Path, title: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    keys = list(dict.fromkeys(k for r in rows for k in r))
    with atomic_path(out / "sweep.csv") as tmp, tmp.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)
    shown = [s for s in _SHOWN if any(s[0] in r for r in rows)]
    lines = [f"# {title}", "", "| " + " | ".join([*axes, *(s[1] for s in shown), "flag"]) + " |"]
    lines.append("|" + "---|" * (len(axes) + len(shown) + 1))
    for r in rows:
        cells = [str(r[a]) for a in axes] + [_fmt(r.get(k), spec) for k, _, spec in shown]
        cells.append("**flagged**" if r.get("flagged") else "")
        lines.append("| " + " | ".join(cells) + " |")
    flagged = [r for r in rows if r.get("flagged")]
    if flagged:
        lines += [
            "",
            f"{len(flagged)} cell(s) flagged: the sim saturates more than 10% away from the "
            "planner's lambda_max. The planner is a fluid model of mean lengths; it leaves out "
            "queueing behind long prompts, the link's per-transfer RTT and fair sharing, and the "
            "decode batch's ramp (docs/sim.md, 'When the sim and the planner disagree').",
        ]
    front = pareto_front(rows)
    if front:
        lines += ["", "Pareto front (goodput per GPU against P90 TTFT):", ""]
        for i in front:
            r = rows[i]
            label = ", ".join(f"{a}={r[a]}" for a in axes)
            lines.append(
                f"- {label}: {r['goodput_per_gpu']:.4f} req/s per GPU at {r['ttft_p90_s']:.2f} s"
            )
    atomic_write(out / "sweep.md", "\n".join(lines) + "\n")
    _plot(rows, axes, front, out / "sweep.png", title)


def _plot(
    rows: Sequence[dict[str, Any]], axes: Sequence[str], front: list[int], path: Path, title: str
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_g, ax_t, ax_p) = plt.subplots(1, 3, figsize=(15, 4.2))
    x_axis = axes[0]
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        key = ", ".join(f"{a.rsplit('.', 1)[-1]}={r[a]}" for a in axes[1:]) or "all"
        groups.setdefault(key, []).append(r)
    for key, rs in groups.items():
        xs = [str(r[x_axis]) for r in rs]
        ax_g.plot(xs, [r["goodput_rps"] for r in rs], marker="o", label=key)
        ax_t.plot(xs, [r["ttft_p90_s"] or 0 for r in rs], marker="o", label=key)
    short = x_axis.rsplit(".", 1)[-1]
    ax_g.set(xlabel=short, ylabel="goodput (req/s)", title="goodput")
    ax_t.set(xlabel=short, ylabel="TTFT p90 (s)", title="P90 TTFT")
    ax_t.set_yscale("log")
    if len(groups) > 1:
        ax_g.legend(fontsize=7)
    pts = [(r["ttft_p90_s"], r["goodput_per_gpu"]) for r in rows if r.get("ttft_p90_s")]
    if pts:
        ax_p.scatter([p[0] for p in pts], [p[1] for p in pts], s=14, color="grey")
        fx = [rows[i]["ttft_p90_s"] for i in front]
        fy = [rows[i]["goodput_per_gpu"] for i in front]
        ax_p.plot(fx, fy, marker="o", color="C3", label="Pareto front")
        ax_p.set_xscale("log")
        ax_p.legend(fontsize=7)
    ax_p.set(xlabel="TTFT p90 (s)", ylabel="goodput per GPU (req/s)", title="Pareto front")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=100, format="png")
    plt.close(fig)
