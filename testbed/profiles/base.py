"""Shapes of model and hardware profiles: piecewise-linear curves and the per-layer KV split.

The paper's throughput model interpolates its measured tables linearly (Table 5), so a profile is
a handful of measured points plus linear interpolation, extrapolated from the end segments. The
KV size is additionally split into a fixed linear-attention state part and a per-token
full-attention part, spread over the layers, so engines can emit KV layer by layer and the layer
sizes always add up to S_kv(l) exactly.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from dataclasses import dataclass, field

import numpy as np

__all__ = ["Curve", "DecodeProfile", "HardwareProfile", "ModelProfile"]


@dataclass(frozen=True)
class Curve:
    """y(x) by linear interpolation through measured points, linear extrapolation outside."""

    xs: tuple[float, ...]
    ys: tuple[float, ...]
    _inner: tuple[float, ...] = field(init=False, repr=False, compare=False)
    _segments: tuple[tuple[float, float, float, float], ...] = field(
        init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        if len(self.xs) != len(self.ys) or len(self.xs) < 2:
            raise ValueError("a curve needs at least two (x, y) points")
        if any(b <= a for a, b in zip(self.xs, self.xs[1:], strict=False)):
            raise ValueError("curve x values must be strictly increasing")
        # Each segment's (x0, y0, y1 - y0, x1 - x0), found by bisecting the inner knots: the
        # same operands as interpolating from the knots, so the same floats, in a third of the
        # bytecodes (a curve is evaluated a dozen times per request: T_prefill in the load
        # book and the policies, S_kv). Equality, repr and hash stay the knots'.
        xs, ys = self.xs, self.ys
        segments = tuple(
            (xs[i - 1], ys[i - 1], ys[i] - ys[i - 1], xs[i] - xs[i - 1]) for i in range(1, len(xs))
        )
        object.__setattr__(self, "_inner", xs[1:-1])
        object.__setattr__(self, "_segments", segments)

    @classmethod
    def of(cls, points: list[tuple[float, float]]) -> Curve:
        return cls(tuple(p[0] for p in points), tuple(p[1] for p in points))

    def __call__(self, x: float) -> float:
        # the segment of x, clamped to the first and last (linear extrapolation): the count of
        # inner knots <= x (`many` below must stay equal to this bit for bit)
        x0, y0, dy, dx = self._segments[bisect_right(self._inner, x)]
        return y0 + dy * (x - x0) / dx

    def many(self, x: np.ndarray) -> np.ndarray:
        """The curve at every element of `x`, each equal to `self(x_i)` bit for bit (the same
        segment choice and the same IEEE operations in the same order): the planner's
        threshold search evaluates it at ~1,000 lengths per re-plan."""
        xs = np.asarray(self.xs, dtype=float)
        ys = np.asarray(self.ys, dtype=float)
        i = np.clip(np.searchsorted(xs, x, side="right"), 1, len(xs) - 1)
        x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
        return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


@dataclass(frozen=True)
class HardwareProfile:
    """One serving instance: `gpus` accelerators (the paper's are 8-GPU nodes), named so that
    figures can be given per GPU."""

    name: str
    description: str
    gpus: int = 8


@dataclass(frozen=True)
class DecodeProfile:
    """Decode step time of one instance as a function of batch size: base + per_seq x batch.

    The paper gives only the operating point (T_decode ~ 25 ms at BS_max ~ 20 for the 40 tok/s
    SLO); the affine form lets a live decode worker slow down as its batch grows and lets the
    planner derive BS_max from any TPOT SLO instead of hard-coding 20.
    """

    step_base_s: float
    step_per_seq_s: float
    max_batch: int = 256

    def step_time(self, batch: int) -> float:
        return self.step_base_s + self.step_per_seq_s * max(batch, 1)

    def bs_max(self, tpot_slo_s: float) -> int:
        """Largest batch whose step time still meets the per-token SLO (at least 1)."""
        if self.step_per_seq_s <= 0:
            return self.max_batch
        room = (tpot_slo_s - self.step_base_s) / self.step_per_seq_s + 1e-9
        if not room < self.max_batch:  # a very loose SLO (or an inf/NaN quotient): the cap
            return self.max_batch
        if not room >= 1:  # a step slower than the SLO allows (down to -inf): one at a time
            return 1
        return math.floor(room)


@dataclass(frozen=True)
class ModelProfile:
    """KV size, prefill time per hardware and decode speed per hardware of one model."""

    name: str
    description: str
    kv_bytes_curve: Curve
    """S_kv(l): bytes of KVCache for l input tokens (fixed states + full-attention KV)."""
    state_bytes: float
    """The fixed part of S_kv: linear-attention recurrent states, independent of length."""
    layer_kinds: tuple[str, ...]
    """"linear" or "full" per layer, in order."""
    prefill: dict[str, Curve] = field(default_factory=dict)
    """T_prefill(l) in seconds per hardware profile name."""
    decode: dict[str, DecodeProfile] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if "full" not in self.layer_kinds:
            raise ValueError(f"{self.name}: a model needs at least one full-attention layer")
        if self.state_bytes > 0 and "linear" not in self.layer_kinds:
            raise ValueError(f"{self.name}: fixed state bytes need linear-attention layers")

    @property
    def n_layers(self) -> int:
        return len(self.layer_kinds)

    def kv_bytes(self, tokens: float) -> float:
        """S_kv(l), never below the fixed state part."""
        if tokens <= 0:
            return 0.0
        return max(self.kv_bytes_curve(tokens), self.state_bytes)

    def prefill_time(self, hardware: str, tokens: float) -> float:
        if tokens <= 0:
            return 0.0
        return max(self.prefill[hardware](tokens), 0.0)

    def kv_bytes_many(self, tokens: np.ndarray) -> np.ndarray:
        """`kv_bytes` at every element of `tokens` (element for element equal)."""
        return np.where(
            tokens <= 0, 0.0, np.maximum(self.kv_bytes_curve.many(tokens), self.state_bytes)
        )

    def prefill_time_many(self, hardware: str, tokens: np.ndarray) -> np.ndarray:
        """`prefill_time` at every element of `tokens` (element for element equal)."""
        return np.where(tokens <= 0, 0.0, np.maximum(self.prefill[hardware].many(tokens), 0.0))

    def kv_throughput(self, hardware: str, tokens: float) -> float:
        """Phi_kv(l) = S_kv(l) / T_prefill(l), bytes/s of KV one instance emits."""
        return self.kv_bytes(tokens) / self.prefill_time(hardware, tokens)

    def layer_bytes(self, tokens: float) -> list[int]:
        """Bytes each layer emits for `tokens` input tokens; sums to round(S_kv(l)).

        Linear-attention layers carry an equal share of the fixed state; full-attention layers
        share the length-dependent rest.
        """
        total = round(self.kv_bytes(tokens))
        if total == 0:
            return [0] * self.n_layers
        n_lin = self.layer_kinds.count("linear")
        n_full = self.n_layers - n_lin
        state = min(round(self.state_bytes), total) if n_lin else 0
        rest = total - state
        out: list[int] = []
        lin_i = full_i = 0
        for kind in self.layer_kinds:
            if kind == "linear":
                out.append(_share(state, n_lin, lin_i))
                lin_i += 1
            else:
                out.append(_share(rest, n_full, full_i))
                full_i += 1
        return out


def _share(total: int, parts: int, i: int) -> int:
    """The i-th of `parts` near-equal integer shares of `total` (the shares sum to total)."""
    base, extra = divmod(total, parts)
    return base + (1 if i < extra else 0)
