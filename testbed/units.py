"""Unit parsing for quantities that people write in YAML and on the command line.

People write "100Gbps", "12.5MB/s", "701.3MiB", "25ms" and "19.4K"; inside the testbed everything
is SI (bytes, seconds, bytes/s, tokens). Keeping the parsing in one place means a unit error always
reads the same way and names what was wrong. A bare number is taken in the SI base unit
(bytes/s, bytes, seconds, tokens), which is what Python callers pass.

Token counts use K = 1000 tokens (so the paper's threshold t = 19.4K is 19,400 tokens, which is
what makes its 49.6% offload fraction come out right). Binary prefixes exist for sizes only.
"""

from __future__ import annotations

import math
import re

__all__ = [
    "UnitError",
    "format_bandwidth",
    "format_duration",
    "format_size",
    "format_tokens",
    "parse_bandwidth",
    "parse_duration",
    "parse_size",
    "parse_tokens",
]


class UnitError(ValueError):
    """A quantity that could not be parsed; the message says what is accepted."""


_NUM = r"(?P<num>[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)"
_RE = re.compile(rf"^\s*{_NUM}\s*(?P<unit>[A-Za-z/]*)\s*$")

_SI = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}
_BIN = {"Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40}

# Bandwidth units: value is bytes per second for one unit.
_BANDWIDTH: dict[str, float] = {}
for _p, _m in _SI.items():
    for _suffix in ("bps", "bit/s", "b/s"):
        _BANDWIDTH[f"{_p}{_suffix}"] = _m / 8.0
    for _suffix in ("Bps", "B/s"):
        _BANDWIDTH[f"{_p}{_suffix}"] = _m
for _p, _m in _BIN.items():
    _BANDWIDTH[f"{_p}B/s"] = _m
    _BANDWIDTH[f"{_p}bit/s"] = _m / 8.0

_SIZE: dict[str, float] = {"B": 1.0, "": 1.0}
for _p, _m in _SI.items():
    if _p:
        _SIZE[f"{_p}B"] = _m
for _p, _m in _BIN.items():
    _SIZE[f"{_p}B"] = _m

_DURATION = {
    "": 1.0,
    "s": 1.0,
    "ms": 1e-3,
    "us": 1e-6,
    "µs": 1e-6,
    "ns": 1e-9,
    "m": 60.0,
    "min": 60.0,
    "h": 3600.0,
}

_TOKENS = {"": 1.0, "K": 1e3, "k": 1e3, "M": 1e6, "m": 1e6}


def _split(value: object, kind: str, examples: str) -> tuple[float, str]:
    if isinstance(value, bool):
        raise UnitError(f"expected a {kind} like {examples}, got {value!r}")
    if isinstance(value, int | float):
        try:
            num = float(value)
        except OverflowError:  # a 400-digit integer
            raise UnitError(f"{kind} is far too large") from None
        if not math.isfinite(num):
            raise UnitError(f"{value!r} is not a finite {kind}")
        return num, ""
    if not isinstance(value, str):
        raise UnitError(f"expected a {kind} like {examples}, got {type(value).__name__}")
    m = _RE.match(value.replace("µ", "u"))
    if not m:
        raise UnitError(f"cannot read {value!r} as a {kind}; write it like {examples}")
    num = float(m.group("num"))
    if not math.isfinite(num):
        raise UnitError(f"{value!r} is not a finite {kind}")
    return num, m.group("unit")


def _lookup(value: object, kind: str, examples: str, table: dict[str, float]) -> float:
    num, unit = _split(value, kind, examples)
    if not isinstance(value, str):
        return num  # a bare number is already in the SI base unit
    if unit not in table:
        raise UnitError(f"unknown {kind} unit {unit!r} in {value!r}; write it like {examples}")
    return num * table[unit]


def parse_bandwidth(value: object) -> float:
    """Bandwidth in bytes/s. "100Gbps" and "100Gbit/s" are bits (SI); "12.5MB/s" is bytes."""
    return _lookup(value, "bandwidth", '"100Gbps", "12.5MB/s"', _BANDWIDTH)


def parse_size(value: object) -> float:
    """Size in bytes. "701.3MiB" is binary, "1GB" decimal."""
    return _lookup(value, "size", '"701.3MiB", "64KB"', _SIZE)


def parse_duration(value: object) -> float:
    """Duration in seconds: "25ms", "1.5s", "2m", "500us"."""
    return _lookup(value, "duration", '"25ms", "1.5s", "2m"', _DURATION)


def parse_tokens(value: object) -> float:
    """Token count: "19.4K" is 19,400 tokens (K = 1000), "1M" is 1,000,000."""
    return _lookup(value, "token count", '"19.4K", "1024"', _TOKENS)


def format_bandwidth(bytes_per_s: float) -> str:
    """Bits per second with an SI prefix, as link bandwidths are usually quoted."""
    bits = bytes_per_s * 8.0
    for prefix, mult in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(bits) >= mult:
            return f"{bits / mult:.3g}{prefix}bps"
    return f"{bits:.3g}bps"


def format_size(n_bytes: float) -> str:
    for prefix, mult in (("Ti", 2.0**40), ("Gi", 2.0**30), ("Mi", 2.0**20), ("Ki", 2.0**10)):
        if abs(n_bytes) >= mult:
            return f"{n_bytes / mult:.4g}{prefix}B"
    return f"{n_bytes:.0f}B"


def format_duration(seconds: float) -> str:
    if abs(seconds) >= 1.0:
        return f"{seconds:.3g}s"
    if abs(seconds) >= 1e-3:
        return f"{seconds * 1e3:.3g}ms"
    return f"{seconds * 1e6:.3g}us"


def format_tokens(tokens: float) -> str:
    if abs(tokens) >= 1e3:
        return f"{tokens / 1e3:.3g}K"
    return f"{tokens:.0f}"
