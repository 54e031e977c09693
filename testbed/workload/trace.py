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


MAX_LINE_BYTES = 8 << 20
"""Longest trace line read (a 10M-token prompt's hash_ids take about 0.4 MB)."""
MAX_TOKENS = 10_000_000
"""Largest input or output length a request may have (the router's own bound)."""
_I64_MIN, _I64_MAX = -(2**63), 2**63 - 1
"""The range of a hash id (a signed 64-bit integer: the chain keys pack it in 8 bytes)."""
MAX_TIMESTAMP_MS = 1e12
"""About 31 years: a timestamp past this is garbage, not a long trace."""


def _show(v: Any) -> str:
    text = json.dumps(v)
    return text if len(text) <= 40 else text[:37] + "..."


def _int_field(doc: dict[str, Any], name: str, where: str) -> int:
    if name not in doc:
        raise ConfigError(f"{where}: missing field {name!r}")
    v = doc[name]
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise ConfigError(f"{where}: {name} must be a number, got {_show(v)}")
    if isinstance(v, float) and (not math.isfinite(v) or v != int(v)):
        raise ConfigError(f"{where}: {name} must be a whole number, got {v!r}")
    if v <= 0:  # compared exactly for ints of any size: no float conversion
        raise ConfigError(f"{where}: {name} must be positive, got {_show(v)}")
    if v > MAX_TOKENS:
        raise ConfigError(f"{where}: {name} must be at most {MAX_TOKENS}, got {_show(v)}")
    return int(v)


def _parse_line(text: str, where: str, line: int) -> TraceRequest:
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{where}: not valid JSON ({exc.msg} at column {exc.colno})") from None
    except RecursionError:
        raise ConfigError(f"{where}: JSON nested too deeply") from None
    except ValueError:  # an integer over Python's 4300-digit conversion limit
        raise ConfigError(f"{where}: a number is too long") from None
    if not isinstance(doc, dict):
        raise ConfigError(f"{where}: expected a JSON object, got {type(doc).__name__}")
    if "timestamp" not in doc:
        raise ConfigError(f"{where}: missing field 'timestamp'")
    ts = doc["timestamp"]
    if (
        isinstance(ts, bool)
        or not isinstance(ts, int | float)
        or (isinstance(ts, float) and not math.isfinite(ts))
    ):
        raise ConfigError(f"{where}: timestamp must be a number of milliseconds, got {_show(ts)}")
    if ts < 0:
        raise ConfigError(f"{where}: timestamp must not be negative, got {_show(ts)}")
    if ts > MAX_TIMESTAMP_MS:
        raise ConfigError(f"{where}: timestamp must be at most {MAX_TIMESTAMP_MS:g} ms")
    n_in = _int_field(doc, "input_length", where)
    n_out = _int_field(doc, "output_length", where)
    if "hash_ids" not in doc:
        raise ConfigError(f"{where}: missing field 'hash_ids'")
    ids = doc["hash_ids"]
    if not isinstance(ids, list):
        raise ConfigError(f"{where}: hash_ids must be a list of integers")
    if all(type(h) is int for h in ids) and (
        not ids or (min(ids) >= _I64_MIN and max(ids) <= _I64_MAX)
    ):
        return TraceRequest(float(ts) / 1000.0, n_in, n_out, tuple(ids), line)  # the usual line
    for i, h in enumerate(ids):  # a bad id: find the first, to name it
        if isinstance(h, bool) or not isinstance(h, int):
            raise ConfigError(f"{where}: hash_ids[{i}] must be an integer, got {_show(h)}")
        if not _I64_MIN <= h <= _I64_MAX:
            raise ConfigError(f"{where}: hash_ids[{i}] must fit in a signed 64-bit integer")
    return TraceRequest(float(ts) / 1000.0, n_in, n_out, tuple(ids), line)


def read_trace(path: str | Path) -> Trace:
    """Read and validate a whole trace; blank lines are skipped, timestamps must not decrease."""
    p = Path(path)
    out: list[TraceRequest] = []
    try:
        if not p.is_file():  # a directory, a FIFO or a device is no trace (and could block)
            if not p.exists():
                raise ConfigError(f"{p}: no such trace file")
            raise ConfigError(f"{p}: not a regular file")
        with p.open("rb") as f:
            for i, raw in enumerate(iter(lambda: f.readline(MAX_LINE_BYTES + 1), b""), 1):
                if len(raw) > MAX_LINE_BYTES:
                    raise ConfigError(f"{p}:{i}: line longer than {MAX_LINE_BYTES} bytes")
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as exc:
                    raise ConfigError(
                        f"{p}:{i}: not UTF-8 text (byte {exc.start + 1} of the line); "
                        "a trace is JSON lines"
                    ) from None
                if not line.strip():
                    continue
                out.append(_checked(p, i, _parse_line(line, f"{p}:{i}", i), out))
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read trace: {exc.strerror}") from None
    if not out:
        raise ConfigError(f"{p}: trace has no requests")
    return Trace(str(p), tuple(out))


def _checked(p: Path, i: int, req: TraceRequest, out: list[TraceRequest]) -> TraceRequest:
    """The request, if its timestamp does not go back before the previous one's."""
    if out and req.timestamp_s < out[-1].timestamp_s:
        prev = out[-1]
        raise ConfigError(
            f"{p}:{i}: timestamp goes backwards ({req.timestamp_s * 1000:g} ms after "
            f"{prev.timestamp_s * 1000:g} ms on line {prev.line})"
        )
    return req
