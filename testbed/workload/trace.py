"""Mooncake-format JSONL request traces, read and validated line by line.

One request a line: `{"timestamp": <ms since trace start>, "input_length": <tokens>,
"output_length": <tokens>, "hash_ids": [<int>, ...]}`; each hash id names one prompt block, and
requests sharing a leading run of hash ids share that prompt prefix (what prefix-cache scenarios
replay). A trace is an input a person hands us, so every line is checked and the first bad one
raises a ConfigError naming the file, the line number and what is wrong; a half-read trace would
quietly change the workload. Extra fields are ignored so richer traces still load.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from testbed.errors import ConfigError

__all__ = ["Trace", "TraceRequest", "read_trace"]


@dataclass(frozen=True)
class TraceRequest:
    """One trace line. `timestamp_s` is the trace's millisecond timestamp in seconds."""

    timestamp_s: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]
    line: int
    """1-based line number in the file, so later errors can point back at the source."""


@dataclass(frozen=True)
class Trace:
    path: str
    requests: tuple[TraceRequest, ...]

    def __len__(self) -> int:
        return len(self.requests)

    @property
    def span_s(self) -> float:
        """Seconds from the first to the last timestamp."""
        return self.requests[-1].timestamp_s - self.requests[0].timestamp_s

    @property
    def mean_rate_rps(self) -> float | None:
        """Gaps per second over the span, (n - 1) / span; None if every request shares a timestamp.

        This is the rate whose mean gap equals the trace's mean gap, which is what rescaling a
        trace to a target rate has to match.
        """
        span = self.span_s
        return (len(self.requests) - 1) / span if span > 0 else None


def _int_field(doc: dict[str, Any], name: str, where: str, *, positive: bool) -> int:
    if name not in doc:
        raise ConfigError(f"{where}: missing field {name!r}")
    v = doc[name]
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise ConfigError(f"{where}: {name} must be a number, got {json.dumps(v)}")
    if not math.isfinite(v) or v != int(v):
        raise ConfigError(f"{where}: {name} must be a whole number, got {v!r}")
    if positive and v <= 0:
        raise ConfigError(f"{where}: {name} must be positive, got {v!r}")
    if not positive and v < 0:
        raise ConfigError(f"{where}: {name} must not be negative, got {v!r}")
    return int(v)


def _parse_line(text: str, where: str, line: int) -> TraceRequest:
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{where}: not valid JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(doc, dict):
        raise ConfigError(f"{where}: expected a JSON object, got {type(doc).__name__}")
    if "timestamp" not in doc:
        raise ConfigError(f"{where}: missing field 'timestamp'")
    ts = doc["timestamp"]
    if isinstance(ts, bool) or not isinstance(ts, int | float) or not math.isfinite(ts):
        raise ConfigError(f"{where}: timestamp must be a number of milliseconds, got {ts!r}")
    if ts < 0:
        raise ConfigError(f"{where}: timestamp must not be negative, got {ts!r}")
    n_in = _int_field(doc, "input_length", where, positive=True)
    n_out = _int_field(doc, "output_length", where, positive=True)
    if "hash_ids" not in doc:
        raise ConfigError(f"{where}: missing field 'hash_ids'")
    ids = doc["hash_ids"]
    if not isinstance(ids, list):
        raise ConfigError(f"{where}: hash_ids must be a list of integers")
    for i, h in enumerate(ids):
        if isinstance(h, bool) or not isinstance(h, int):
            raise ConfigError(f"{where}: hash_ids[{i}] must be an integer, got {json.dumps(h)}")
    return TraceRequest(float(ts) / 1000.0, n_in, n_out, tuple(ids), line)


def read_trace(path: str | Path) -> Trace:
    """Read and validate a whole trace; blank lines are skipped, timestamps must not decrease."""
    p = Path(path)
    try:
        text = p.read_text()
    except FileNotFoundError:
        raise ConfigError(f"{p}: no such trace file") from None
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read trace: {exc.strerror}") from None
    out: list[TraceRequest] = []
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        req = _parse_line(line, f"{p}:{i}", i)
        if out and req.timestamp_s < out[-1].timestamp_s:
            prev = out[-1]
            raise ConfigError(
                f"{p}:{i}: timestamp goes backwards ({req.timestamp_s * 1000:g} ms after "
                f"{prev.timestamp_s * 1000:g} ms on line {prev.line})"
            )
        out.append(req)
    if not out:
        raise ConfigError(f"{p}: trace has no requests")
    return Trace(str(p), tuple(out))
