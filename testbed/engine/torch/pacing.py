"""CPU-scaled timing for the real model: its steps take what the hardware profile says.

The tiny model on a CPU is no H200, so its raw speed means nothing for the emulation. Instead,
each prefill layer and each decode step is padded to the profile's time (T_prefill / layers,
T_decode(batch)) divided by time_scale, like the emulated engine. When the real compute is the
slower of the two, nothing can be padded: the step is late, and the pacer records by how much,
so a report can say the real model did not keep up at this time_scale instead of hiding it.
Torch-free on purpose: it only reads clocks and profiles.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from testbed.clock import Clock
from testbed.engine.timing import sleep_until
from testbed.profiles import ModelProfile

__all__ = ["CpuPacer", "ProfileBudget", "StepStats"]


@dataclass(frozen=True)
class ProfileBudget:
    """Real-world seconds a step of the tiny model stands for, read from a model profile."""

    profile: ModelProfile
    prefill_hardware: str
    decode_hardware: str
    n_layers: int
    """Layers of the *tiny* model: each carries an equal share of the profile's prefill time."""

    def prefill_layer_s(self, uncached_tokens: int) -> float:
        return self.profile.prefill_time(self.prefill_hardware, uncached_tokens) / self.n_layers

    def decode_step_s(self, batch: int = 1) -> float:
        return self.profile.decode[self.decode_hardware].step_time(batch)


@dataclass
class StepStats:
    """Per kind of step. Seconds are real-world (wall x time_scale)."""

    steps: int = 0
    padded_steps: int = 0
    padded_s: float = 0.0
    late_steps: int = 0
    late_s: float = 0.0
    """Sum over late steps of (compute - budget): how far the CPU fell behind the profile."""
    worst_ratio: float = 0.0
    """Largest compute / budget seen (above 1: a step was slower than the hardware it models)."""

    def to_json(self) -> dict[str, float | int]:
        return {
            "steps": self.steps,
            "padded_steps": self.padded_steps,
            "padded_s": round(self.padded_s, 6),
            "late_steps": self.late_steps,
            "late_s": round(self.late_s, 6),
            "worst_compute_over_budget": round(self.worst_ratio, 3),
        }


@dataclass
class CpuPacer:
    """Pads steps up to their budget on the run's clock (wall); records the slower steps."""

    clock: Clock
    kinds: dict[str, StepStats] = field(default_factory=dict)

    async def pace(self, kind: str, started: float, budget_s: float) -> None:
        """A step of `kind` began at wall time `started` (time.monotonic) and is modelled to
        take `budget_s` real seconds: sleep out the rest, or record how late it is."""
        st = self.kinds.setdefault(kind, StepStats())
        st.steps += 1
        target = self.clock.wall(budget_s)
        actual = time.monotonic() - started
        if target > 0:
            st.worst_ratio = max(st.worst_ratio, actual / target)
        if actual < target:
            st.padded_steps += 1
            st.padded_s += self.clock.real(target - actual)
            await sleep_until(started + target)
        elif actual > target:
            st.late_steps += 1
            st.late_s += self.clock.real(actual - target)

    def stats(self) -> dict[str, object]:
        return {
            "time_scale": self.clock.time_scale,
            **{kind: st.to_json() for kind, st in sorted(self.kinds.items())},
        }
