"""Turn workload configuration into the objects that generate or describe requests."""

from __future__ import annotations

import json
from pathlib import Path

from testbed.config import FixedLengths, LengthsConfig, LognormalLengths, TraceLengths
from testbed.errors import ConfigError
from testbed.workload.lengths import (
    EmpiricalLengths,
    FixedLength,
    LengthDistribution,
    TruncatedLognormal,
)


def length_distribution(cfg: LengthsConfig) -> LengthDistribution:
    if isinstance(cfg, LognormalLengths):
        return TruncatedLognormal(cfg.mu, cfg.sigma, cfg.min, cfg.max)
    if isinstance(cfg, FixedLengths):
        return FixedLength(cfg.tokens)
    if isinstance(cfg, TraceLengths):
        return EmpiricalLengths.of(read_trace_lengths(Path(cfg.path)))
    raise AssertionError(f"unhandled lengths config {cfg!r}")


def read_trace_lengths(path: Path) -> list[float]:
    """Input lengths of a Mooncake-format JSONL trace; a bad line names its line number."""
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read trace: {exc.strerror}") from None
    out: list[float] = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            n = json.loads(line)["input_length"]
        except (json.JSONDecodeError, KeyError, TypeError):
            raise ConfigError(f"{path}:{i}: not a trace record with an input_length") from None
        if not isinstance(n, int | float) or n <= 0:
            raise ConfigError(f"{path}:{i}: input_length must be a positive number")
        out.append(float(n))
    if not out:
        raise ConfigError(f"{path}: trace has no requests")
    return out
