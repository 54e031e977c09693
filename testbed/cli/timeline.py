"""`testbed timeline RUN_DIR`: draw a finished run's timeline.png from its result files.

A run draws its timeline unless told not to (`testbed run --no-timeline`: matplotlib costs
about 0.7 CPU s, a sim run's largest fixed cost); this draws the same picture afterwards from
requests.jsonl, history.jsonl and summary.json (testbed.metrics.timeline.draw_run) and embeds it
in report.md. Also for a run whose picture was lost or that predates a drawing change.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from testbed.errors import UserError
from testbed.metrics.records import HistoryEvent, RequestRecord, read_jsonl
from testbed.metrics.report import embed_timeline

__all__ = ["add_parser"]

_FILES = ("summary.json", "requests.jsonl", "history.jsonl")


def _timeline(args: argparse.Namespace) -> int:
    from testbed.metrics.timeline import draw_run  # matplotlib: only when drawing

    out = Path(args.run_dir)
    missing = [name for name in _FILES if not (out / name).is_file()]
    if missing:
        raise UserError(
            f"{out}: not a run's results directory (missing {', '.join(missing)}; "
            "`testbed run --out DIR` writes them)"
        )
    try:
        summary = json.loads((out / "summary.json").read_text())
        records = [RequestRecord.from_json(d) for d in read_jsonl(out / "requests.jsonl")]
        history = [HistoryEvent.from_json(d) for d in read_jsonl(out / "history.jsonl")]
        path = draw_run(out, records, history, summary)
    except (ValueError, KeyError, TypeError) as exc:  # a truncated or foreign file
        raise UserError(f"{out}: cannot read the run's results: {exc!r}") from None
    embedded = embed_timeline(out)
    print(f"{path}{' (embedded in report.md)' if embedded else ''}")
    return 0


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "timeline",
        help="draw a finished run's timeline.png from its result files",
        description="Draw timeline.png for a run's results directory (requests.jsonl, "
        "history.jsonl, summary.json), as the run itself does unless --no-timeline, and embed "
        "it in the run's report.md.",
    )
    p.add_argument("run_dir", metavar="RUN_DIR", help="a results directory, e.g. results/burst")
    p.set_defaults(func=_timeline)
