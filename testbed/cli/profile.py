"""`testbed profile fit MEASUREMENTS.csv`: measured points to the knots a profile file takes.

The CSV has a header and two columns: `tokens,seconds` (prefill time by prompt length; `length`
and `input_tokens` are accepted for the first) or `batch,seconds` (decode step time by batch).
The output is the YAML to paste under a hardware entry of a profile file (docs/profiles.md),
preceded by the fit's error, or the same as JSON with `--json`.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
from pathlib import Path
from typing import Any

from testbed.config.files import read_text
from testbed.errors import UserError
from testbed.profiles.fit import fit_affine, fit_curve
from testbed.units import format_duration

MAX_CSV_BYTES = 16 << 20
MAX_ROWS = 100_000
LENGTH_COLUMNS = ("tokens", "length", "input_tokens")
BATCH_COLUMNS = ("batch",)
TIME_COLUMNS = ("seconds", "time_s", "time")


def read_measurements(path: Path) -> tuple[str, list[float], list[float]]:
    """(first column's name, xs, ys) of a two-column CSV; errors name the file and line."""
    text = read_text(path, MAX_CSV_BYTES, "a measurement file")
    rows = list(csv.reader(io.StringIO(text)))
    rows = [r for r in rows if r and not r[0].lstrip().startswith("#")]
    if not rows:
        raise UserError(f"{path}: empty; expected a header `tokens,seconds` or `batch,seconds`")
    header = [h.strip().lower() for h in rows[0]]
    if len(header) != 2 or header[0] not in LENGTH_COLUMNS + BATCH_COLUMNS:
        raise UserError(
            f"{path}:1: expected a header `tokens,seconds` or `batch,seconds`, got {rows[0]!r}"
        )
    if header[1] not in TIME_COLUMNS:
        raise UserError(f"{path}:1: the second column must be seconds, got {rows[0][1]!r}")
    if len(rows) - 1 > MAX_ROWS:
        raise UserError(f"{path}: more than {MAX_ROWS} measurements")
    xs: list[float] = []
    ys: list[float] = []
    for line, row in enumerate(rows[1:], start=2):
        try:
            x, y = (float(v) for v in row)
        except ValueError:
            raise UserError(f"{path}:{line}: expected two numbers, got {row!r}") from None
        if not (math.isfinite(x) and math.isfinite(y)) or y <= 0 or x < 0:
            raise UserError(f"{path}:{line}: values must be finite, x >= 0 and seconds > 0")
        xs.append(x)
        ys.append(y)
    if len(set(xs)) < 2:
        raise UserError(f"{path}: a fit needs at least two measurements at different x")
    return header[0], xs, ys


def _seconds(y: float) -> str:
    """Four significant digits with a unit a profile file accepts."""
    return f"{y:.4g}s" if y >= 1 else f"{y * 1e3:.4g}ms"


def _tolerance(text: str) -> float:
    try:
        v = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a tolerance: {text!r} (e.g. 1% or 0.01)") from None
    if not 0 < v < 1:
        raise argparse.ArgumentTypeError("tolerance must be between 0 and 100%")
    return v


def _run(args: argparse.Namespace) -> int:
    path = Path(args.measurements)
    column, xs, ys = read_measurements(path)
    doc: dict[str, Any]
    if column in BATCH_COLUMNS:
        a = fit_affine(xs, ys)
        doc = {
            "fit": "decode step = step_base + step_per_seq x batch",
            "points": len(xs),
            "max_rel_error": a.max_rel_error,
            "rms_rel_error": a.rms_rel_error,
            "decode": {"step_base": a.base, "step_per_seq": a.per_unit},
        }
        body = (
            f"decode: {{step_base: {format_duration(a.base)}, "
            f"step_per_seq: {format_duration(a.per_unit)}}}"
        )
    else:
        c = fit_curve(xs, ys, form=args.form, tolerance=args.tolerance, max_knots=args.max_knots)
        knots = list(zip(c.curve.xs, c.curve.ys, strict=True))
        doc = {
            "fit": f"prefill time by prompt tokens, {c.form}",
            "points": len(xs),
            "max_rel_error": c.max_rel_error,
            "rms_rel_error": c.rms_rel_error,
            "prefill": [{"tokens": x, "seconds": y} for x, y in knots],
        }
        body = "prefill:\n" + "\n".join(
            f"  - {{tokens: {round(x)}, time: {_seconds(y)}}}" for x, y in knots
        )
    if args.json:
        print(json.dumps(doc, indent=2))
        return 0
    print(
        f"# {doc['fit']}: {len(xs)} points from {path.name}; worst error "
        f"{doc['max_rel_error']:.2%}, rms {doc['rms_rel_error']:.2%}"
    )
    print(body)
    return 0


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "profile", help="model and hardware profiles (docs/profiles.md)"
    )
    psub = p.add_subparsers(dest="profile_command", required=True)
    fit = psub.add_parser(
        "fit",
        help="fit measured (tokens, seconds) or (batch, seconds) points into profile knots",
        description="Read a two-column CSV (header `tokens,seconds` for prefill time or "
        "`batch,seconds` for decode step time) and print the profile entry that fits it, with "
        "the fit's worst and rms relative error.",
    )
    fit.add_argument("measurements", help="CSV file")
    fit.add_argument(
        "--form",
        choices=("pwl", "smooth"),
        default="pwl",
        help="pwl: piecewise-linear with free knots (default); smooth: a + b*l + c*l^2 "
        "sampled at knots, for noisy measurements",
    )
    fit.add_argument(
        "--tolerance",
        type=_tolerance,
        default=0.01,
        help="pwl: add knots until the worst relative error is within this (default 1%%)",
    )
    fit.add_argument(
        "--max-knots", type=int, default=8, help="knots at most (default 8; at least 2)"
    )
    fit.add_argument("--json", action="store_true", help="print JSON instead of YAML")
    fit.set_defaults(func=_run)
