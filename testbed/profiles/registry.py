"""Adding profiles to the built-in ones: a user's model and hardware, from a profile file.

Every component looks a model or hardware up by name in `MODELS` / `HARDWARE` (the planner, the
engines, the router, the scheduler loops, the sim), so a user profile is registered into the same
tables, in every process of a run (the services receive the profile documents in their spec).
Registering the same profile twice is harmless (a scenario loaded twice in one process); a name
that already means something else is an error, so a file cannot silently redefine the paper's
model or another file's.
"""

from __future__ import annotations

from dataclasses import replace

from testbed.profiles.base import HardwareProfile, ModelProfile
from testbed.profiles.paper import HARDWARE, MODELS

__all__ = ["ProfileConflict", "register"]


class ProfileConflict(ValueError):
    """A profile name already defined with different contents."""


def register(model: ModelProfile, hardware: list[HardwareProfile]) -> None:
    """Make `model` and `hardware` known by name; all or nothing."""
    for hw in hardware:
        known = HARDWARE.get(hw.name)
        if known is not None and known.gpus != hw.gpus:
            raise ProfileConflict(
                f"hardware {hw.name!r} is already defined with {known.gpus} GPUs, not {hw.gpus}"
            )
    known_model = MODELS.get(model.name)
    if known_model is not None and known_model != model:
        raise ProfileConflict(
            f"model {model.name!r} is already defined differently (a built-in profile or "
            "another profile file); give yours another name"
        )
    for hw in hardware:
        known = HARDWARE.get(hw.name)
        if known is None:
            HARDWARE[hw.name] = hw
        elif not known.description and hw.description:
            HARDWARE[hw.name] = replace(known, description=hw.description)
    MODELS[model.name] = model
