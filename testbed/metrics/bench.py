"""Benchmark-grade figures of a run, named as `vllm bench serve` and AIPerf name them.

`summarize` (metrics.summary) puts these under `benchmark` in summary.json; docs/metrics.md maps
every field to its vLLM and AIPerf counterpart. Definitions:

- ITL (inter-token latency) of a request is (last token - first token) / (output tokens - 1),
  AIPerf's per-request `inter_token_latency` and the testbed's `tpot`; the summary's ITL
  statistics are over completed requests' ITLs. The spread of the gaps inside each request is
  in its record (`itl_min`, `itl_max`, `itl_std`: metrics.records.TokenTimer).
- throughputs are over `duration_s`: requests completed, and input / output / total tokens of
  completed requests, per second.
- goodput counts completed requests within every SLO bound: TTFT, TPOT x (1 + tolerance), and
  E2E when the scenario sets one (metrics.summary.meets_slo).
- latency statistics: mean, std (population), min, max and the requested percentiles (linear
  interpolation), in seconds (`*_s`) and milliseconds (`*_ms`); all None without data.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from testbed.metrics.records import RequestRecord

__all__ = [
    "DEFAULT_PERCENTILES",
    "DoneFigures",
    "benchmark",
    "describe",
    "parse_percentiles",
    "run_metadata",
    "stats",
]

DEFAULT_PERCENTILES: tuple[float, ...] = (50.0, 90.0, 99.0)
"""Always reported (the report and the checkers read p50, p90, p99); others on request."""

_LATENCIES = (("ttft", "ttft"), ("tpot", "tpot"), ("itl", "itl"), ("e2el", "e2e"))
"""(vLLM's name, the record's property)."""


def pkey(q: float) -> str:
    """The key of percentile q: p50, p99, p99.9."""
    return f"p{q:g}"


def parse_percentiles(text: str) -> tuple[float, ...]:
    """`--percentiles 50,90,95,99` -> the percentiles, each in (0, 100]; ValueError if not."""
    out = []
    for part in text.split(","):
        try:
            q = float(part.strip())
        except ValueError:
            raise ValueError(f"not a number: {part.strip()!r}") from None
        if not 0 < q <= 100:
            raise ValueError(f"percentile {q:g} is not in (0, 100]")
        out.append(q)
    return tuple(sorted(set(out)))


def describe(
    values: Sequence[float] | np.ndarray, percentiles: Sequence[float] = ()
) -> dict[str, Any]:
    """mean, std, min, max and p50/p90/p99 plus `percentiles`; all None when empty."""
    qs = sorted(set(DEFAULT_PERCENTILES) | set(percentiles))
    keys = ["mean", "std", "min", "max", *(pkey(q) for q in qs)]
    if len(values) == 0:
        return dict.fromkeys(keys)
    a = np.asarray(values, dtype=np.float64)
    out: dict[str, Any] = {
        "mean": float(a.mean()),
        "std": float(a.std()),
        "min": float(a.min()),
        "max": float(a.max()),
    }
    for q, v in zip(qs, np.percentile(a, qs), strict=True):
        out[pkey(q)] = float(v)
    return out


def stats(values: Sequence[float] | np.ndarray) -> dict[str, float | None]:
    """Mean and p50/p90/p99 (linear interpolation); all None when there is no data."""
    if len(values) == 0:
        return {"mean": None, "p50": None, "p90": None, "p99": None}
    a = np.asarray(values, dtype=np.float64)
    p50, p90, p99 = np.percentile(a, [50, 90, 99])
    return {"mean": float(a.mean()), "p50": float(p50), "p90": float(p90), "p99": float(p99)}


def _ms(stats: dict[str, Any]) -> dict[str, Any]:
    return {k: None if v is None else v * 1e3 for k, v in stats.items()}


def benchmark(
    done: Sequence[RequestRecord] | DoneFigures,
    good: int,
    duration_s: float,
    percentiles: Sequence[float],
) -> dict[str, Any]:
    """The `benchmark` section: vLLM-bench-serve-style flat fields over completed requests
    (their records, or their figures from a testbed.metrics.table.RecordTable)."""
    d = done if isinstance(done, DoneFigures) else DoneFigures.of(done)
    out: dict[str, Any] = {
        "completed": d.n,
        "duration": duration_s,
        "request_throughput": d.n / duration_s,
        "request_goodput": good / duration_s,
        "total_input_tokens": d.input_tokens,
        "total_output_tokens": d.output_tokens,
    }
    out["input_throughput"] = out["total_input_tokens"] / duration_s
    out["output_throughput"] = out["total_output_tokens"] / duration_s
    out["total_token_throughput"] = out["input_throughput"] + out["output_throughput"]
    for name, prop in _LATENCIES:
        stats = _ms(describe(d.latencies[prop], percentiles))
        for key, v in stats.items():
            out[f"{'median' if key == 'p50' else key}_{name}_ms"] = v
            if key == "p50":  # vLLM writes both median_ and p50_
                out[f"p50_{name}_ms"] = v
    return out


def latency_sections(
    done: Sequence[RequestRecord] | DoneFigures, percentiles: Sequence[float]
) -> dict[str, Any]:
    """`ttft_s`, `tpot_s`, `itl_s`, `e2e_s` and their `_ms` twins for the summary."""
    d = done if isinstance(done, DoneFigures) else DoneFigures.of(done)
    out: dict[str, Any] = {}
    for name in ("ttft", "tpot", "itl", "e2e"):
        s = describe(d.latencies[name], percentiles)
        out[f"{name}_s"] = s
        out[f"{name}_ms"] = _ms(s)
    return out


@dataclass
class DoneFigures:
    """What the latency sections read of the completed requests: their count, token totals and
    latencies (each property's values that are not None, in record order)."""

    n: int
    input_tokens: int
    output_tokens: int
    latencies: dict[str, Sequence[float] | np.ndarray]

    @classmethod
    def of(cls, done: Sequence[RequestRecord]) -> DoneFigures:
        return cls(
            len(done),
            sum(r.input_tokens for r in done),
            sum(r.tokens_out for r in done),
            {
                p: [v for r in done if (v := getattr(r, p)) is not None]
                for p in ("ttft", "tpot", "itl", "e2e")
            },
        )


def _git_commit() -> str | None:
    """The checkout's commit, when the package runs from one (None in an installed wheel)."""
    root = Path(__file__).resolve().parents[2]
    try:
        done = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() or None if done.returncode == 0 else None


def run_metadata(
    *, version: str, seed: int, scenario_json: str, started_at: float, argv: Sequence[str] | None
) -> dict[str, Any]:
    """What produced a run, for summary.json: enough to rerun it and to tell runs apart."""
    return {
        "testbed_version": version,
        "git_commit": _git_commit(),
        "command_line": list(sys.argv if argv is None else argv),
        "seed": seed,
        "scenario_sha256": hashlib.sha256(scenario_json.encode()).hexdigest(),
        "host_cores": os.cpu_count(),
        "start_time": datetime.fromtimestamp(started_at, UTC).isoformat(timespec="seconds"),
    }
