"""How fast this host runs the tiny model, and the time_scale that leaves the pacing honest.

A real-model run pads every prefill layer and decode step to the profile's time / time_scale.
That only works while the CPU computes a step within its budget: at too high a time_scale every
step runs late and the run measures the host, not the scheduler. So before a run:

- `measure` times the model on this host (torch, one thread): a prefill layer at a few prompt
  lengths (compute plus serialization, as the prefill service does it) and a batched decode
  pass at a few context lengths (a pass costs the same for 1 and `batched.ROWS` requests). It
  keeps a high percentile, not the median: a step is late when *it* is slow. Results are cached
  per model config, torch version and host (`cache_path`); only the first run pays (seconds).
- `largest_time_scale` turns that into the largest time_scale at which every step the run will
  take (each prompt length on the hardware its route runs on, decode at the longest context)
  has `MARGIN` x its measured compute inside its budget, and names the step that limits it.

Torch-free at import: `measure` imports torch when it runs.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import platform
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from testbed.engine.torch.config import TinyConfig
from testbed.profiles import ModelProfile

__all__ = [
    "MARGIN",
    "RECALIBRATE_ENV",
    "Calibration",
    "TimeScaleChoice",
    "cache_path",
    "calibration_for",
    "largest_time_scale",
    "measure",
]

MARGIN = 3.0
"""A step's budget must be at least this many times its calibrated compute: the run's prefill
and decode processes share the CPU (with each other and whatever else runs), so a step takes
longer live than alone."""
PREFILL_LENGTHS = (64, 512)
DECODE_CONTEXTS = (64, 1024)
RECALIBRATE_ENV = "TESTBED_RECALIBRATE"
"""Set to 1 to measure again (the host's load changed) instead of reading the cache."""
_PERCENTILE = 0.9
_VERSION = 1


def _percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _interpolate(points: dict[int, float], x: float) -> float:
    """Piecewise linear through the measured points, extended linearly past either end."""
    xs = sorted(points)
    if len(xs) == 1:
        return points[xs[0]]
    lo, hi = (xs[0], xs[1]) if x <= xs[1] else (xs[-2], xs[-1])
    for a, b in itertools.pairwise(xs):
        if a <= x <= b:
            lo, hi = a, b
            break
    slope = (points[hi] - points[lo]) / (hi - lo)
    return max(points[lo] + slope * (x - lo), min(points.values()))


@dataclass
class Calibration:
    """Wall seconds this host takes for one prefill layer (by prompt tokens) and one decode pass
    (by context tokens), each a high percentile of repeated measurements."""

    model: str
    """TinyConfig fingerprint (hex): another config is another calibration."""
    host: str
    torch: str
    measured_at: str
    prefill_layer_s: dict[int, float] = field(default_factory=dict)
    decode_pass_s: dict[int, float] = field(default_factory=dict)
    cached: bool = False
    """Read from the cache rather than measured by this run."""

    def prefill_layer(self, tokens: float) -> float:
        return _interpolate(self.prefill_layer_s, tokens)

    def decode_pass(self, context: float) -> float:
        return _interpolate(self.decode_pass_s, context)

    def to_json(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["version"] = _VERSION
        return doc

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Calibration:
        if doc.get("version") != _VERSION:
            raise ValueError("calibration cache of another version")
        return cls(
            model=str(doc["model"]),
            host=str(doc["host"]),
            torch=str(doc["torch"]),
            measured_at=str(doc["measured_at"]),
            prefill_layer_s={int(k): float(v) for k, v in doc["prefill_layer_s"].items()},
            decode_pass_s={int(k): float(v) for k, v in doc["decode_pass_s"].items()},
        )


def _host() -> str:
    return f"{platform.node()}-{platform.machine()}-{os.cpu_count()}cpu"


def cache_path(config: TinyConfig, torch_version: str) -> Path:
    """~/.cache/prfaas-testbed/calibration/<model>-<torch>-<host>.json (XDG_CACHE_HOME wins)."""
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    name = f"{config.fingerprint().hex()}-torch{torch_version}-{_host()}.json"
    return base / "prfaas-testbed" / "calibration" / name.replace("/", "_")


def measure(config: TinyConfig, repeats: int = 3) -> Calibration:
    """Time the model here: prefill layers at PREFILL_LENGTHS, decode passes at DECODE_CONTEXTS."""
    import random

    import torch

    from testbed.engine.torch.batched import DecodeBatch
    from testbed.engine.torch.codec import encode_layer
    from testbed.engine.torch.kvstate import KVState
    from testbed.engine.torch.model import TinyHybridLM

    torch.set_num_threads(1)  # as every torch service process runs
    model = TinyHybridLM(config)
    rng = random.Random(0)
    cal = Calibration(
        config.fingerprint().hex(), _host(), torch.__version__, datetime.now(UTC).isoformat()
    )
    for n in PREFILL_LENGTHS:
        if n > config.max_positions:
            continue
        samples: list[float] = []
        for _ in range(repeats):
            run = model.prefill([rng.randrange(config.vocab_size) for _ in range(n)])
            steps = iter(run)
            while True:
                t0 = time.perf_counter()
                layer = next(steps, None)
                if layer is None:
                    break
                encode_layer(config, run.state, layer, 0, n)
                samples.append(time.perf_counter() - t0)
        cal.prefill_layer_s[n] = _percentile(samples, _PERCENTILE)
    gen = torch.Generator().manual_seed(0)
    for ctx in DECODE_CONTEXTS:
        if ctx >= config.max_positions:
            continue
        state = KVState(n_tokens=ctx)
        for i, kind in enumerate(config.layer_kinds):
            if kind == "linear":
                h, d = config.linear_heads, config.linear_head_dim
                state.linear[i] = torch.randn(h, d, d, generator=gen).to(model.dtype) * 0.1
            else:
                rows = torch.randn(ctx, config.latent_width, generator=gen).to(model.dtype)
                state.latents[i] = [rows]
        batch = DecodeBatch(model)
        batch.add(0, state, 1)
        samples = []
        batch.step()  # the first pass allocates; a run's steady state does not
        for _ in range(10 * repeats):
            t0 = time.perf_counter()
            batch.step()
            samples.append(time.perf_counter() - t0)
        cal.decode_pass_s[ctx] = _percentile(samples, _PERCENTILE)
    return cal


def calibration_for(config: TinyConfig, *, refresh: bool = False) -> Calibration:
    """The cached calibration of this config on this host, measured (and cached) if missing."""
    import torch

    path = cache_path(config, torch.__version__)
    refresh = refresh or os.environ.get(RECALIBRATE_ENV, "") not in ("", "0")
    if not refresh and path.exists():
        try:
            cal = Calibration.from_json(json.loads(path.read_text()))
            cal.cached = True
            return cal
        except (ValueError, KeyError, TypeError):
            pass  # an unreadable or older cache is measured again
    cal = measure(config)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(cal.to_json(), indent=2) + "\n")
    tmp.replace(path)
    return cal


@dataclass(frozen=True)
class TimeScaleChoice:
    """The largest workable time_scale and the step that limits it."""

    largest: float
    limit: str
    """Which step sets `largest`, with its budget and calibrated compute."""

    def to_json(self) -> dict[str, Any]:
        return {"largest_time_scale": self.largest, "limited_by": self.limit, "margin": MARGIN}


def _floor2(x: float) -> float:
    """Round down to two significant digits (a time_scale a person can read and type)."""
    if x <= 0:
        return 0.0
    step = 10 ** (math.floor(math.log10(x)) - 1)
    return round(math.floor(x / step + 1e-9) * step, 12)  # 0.41, not 0.41000000000000003


def largest_time_scale(
    cal: Calibration,
    profile: ModelProfile,
    n_layers: int,
    prefills: Iterable[tuple[str, int]],
    decode_hardware: str,
    bs_max: int,
    max_context: int,
    rows: int,
) -> TimeScaleChoice:
    """Largest k with MARGIN x compute <= budget / k for every step of the run.

    `prefills`: (hardware, prompt tokens) of every prefill the run plans; decode runs on
    `decode_hardware` with batches up to `bs_max` (one pass per `rows` requests), contexts up to
    `max_context` tokens. A budget is real-world seconds; compute is wall seconds.
    """
    best = math.inf
    limit = "nothing to run"
    for hw, tokens in set(prefills):
        budget = profile.prefill_time(hw, tokens) / n_layers
        compute = cal.prefill_layer(tokens)
        k = budget / (MARGIN * compute)
        if k < best:
            best = k
            limit = (
                f"a prefill layer of {tokens} tokens on {hw}: {budget * 1e3:.3g} ms budget, "
                f"{compute * 1e3:.3g} ms compute"
            )
    dec = profile.decode[decode_hardware]
    for batch in sorted({1, *range(rows + 1, bs_max + 1, rows)}):
        if batch > max(bs_max, 1):
            continue
        budget = dec.step_time(batch)
        compute = cal.decode_pass(max_context) * math.ceil(batch / rows)
        k = budget / (MARGIN * compute)
        if k < best:
            best = k
            limit = (
                f"a decode step of batch {batch} at {max_context} tokens of context on "
                f"{decode_hardware}: {budget * 1e3:.3g} ms budget, {compute * 1e3:.3g} ms compute"
            )
    return TimeScaleChoice(_floor2(best) if math.isfinite(best) else 1.0, limit)
