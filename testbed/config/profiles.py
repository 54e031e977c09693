"""A user's model and hardware profile, as a YAML file a scenario names (`profiles: [file]`).

The code keys timing by model x hardware, and so does the file: one model (its layer layout and
KV size) and, per hardware it runs on, the prefill time curve and the decode step model. Points
are knots of piecewise-linear curves, as the paper's own tables are used; `testbed profile fit`
turns measurements into them. Example (docs/profiles.md):

    model:
      name: my-70b-dense
      layers: {full: 80}
      kv: {per_token: 320KiB}
    hardware:
      a100x8:
        description: 8x A100 80GB
        gpus: 8
        prefill:
          - {tokens: 1K, time: 120ms}
          - {tokens: 32K, time: 4.1s}
        decode: {step_base: 18ms, step_per_seq: 0.6ms}
"""

from __future__ import annotations

import itertools
from pathlib import Path

from pydantic import Field, ValidationError, field_validator, model_validator

from testbed.config.base import STRICT_UNITS, Duration, PositiveDuration, Size, StrictModel, Tokens
from testbed.config.files import load_yaml
from testbed.config.suggest import closest_field, fields_at
from testbed.errors import ConfigError
from testbed.profiles.base import Curve, DecodeProfile, HardwareProfile, ModelProfile
from testbed.profiles.registry import ProfileConflict, register

__all__ = ["ProfileFile", "load_profile_file", "register_profile", "to_profiles"]


class TimeKnot(StrictModel):
    tokens: Tokens
    time: PositiveDuration


class SizeKnot(StrictModel):
    tokens: Tokens
    size: Size


def _increasing(knots: list[TimeKnot] | list[SizeKnot]) -> None:
    xs = [k.tokens for k in knots]
    if any(b <= a for a, b in itertools.pairwise(xs)):
        raise ValueError("knots must have strictly increasing `tokens`")


class LayersConfig(StrictModel):
    """Layer layout: full-attention layers (they hold per-token KV) and linear-attention ones
    (they hold a fixed state); the full ones are spread evenly among the linear ones."""

    full: int = Field(ge=1, le=1024)
    linear: int = Field(0, ge=0, le=1024)

    def kinds(self) -> tuple[str, ...]:
        n = self.full + self.linear
        return tuple(
            "full" if (i + 1) * self.full // n > i * self.full // n else "linear" for i in range(n)
        )


class KvConfig(StrictModel):
    """S_kv(l): a fixed state plus bytes per token, or knots of a measured curve."""

    per_token: Size | None = Field(None, description="KV bytes per input token, all layers")
    state: Size = Field(0.0, description="fixed linear-attention state bytes per request")
    curve: list[SizeKnot] | None = Field(None, min_length=2)

    @field_validator("curve")
    @classmethod
    def _curve_increasing(cls, v: list[SizeKnot] | None) -> list[SizeKnot] | None:
        if v is not None:
            _increasing(v)
        return v

    @model_validator(mode="after")
    def _one_form(self) -> KvConfig:
        if (self.per_token is None) == (self.curve is None):
            raise ValueError("kv: give exactly one of per_token or curve")
        return self


class DecodeConfig(StrictModel):
    """Decode step time = step_base + step_per_seq x batch (testbed.profiles.DecodeProfile)."""

    step_base: PositiveDuration
    step_per_seq: Duration = 0.0
    max_batch: int = Field(256, ge=1, le=100_000)


class HardwareEntry(StrictModel):
    description: str = ""
    gpus: int = Field(8, ge=1, le=4096, description="accelerators per instance")
    prefill: list[TimeKnot] | None = Field(None, min_length=2)
    """T_prefill(l) knots; without them the model cannot prefill on this hardware."""
    decode: DecodeConfig | None = None
    """Without it the model cannot decode on this hardware."""

    @field_validator("prefill")
    @classmethod
    def _prefill_increasing(cls, v: list[TimeKnot] | None) -> list[TimeKnot] | None:
        if v is not None:
            _increasing(v)
        return v

    @model_validator(mode="after")
    def _does_something(self) -> HardwareEntry:
        if self.prefill is None and self.decode is None:
            raise ValueError("a hardware entry needs prefill knots, decode, or both")
        return self


class ModelEntry(StrictModel):
    name: str = Field(min_length=1, max_length=100)
    description: str = ""
    layers: LayersConfig
    kv: KvConfig

    @model_validator(mode="after")
    def _state_needs_linear_layers(self) -> ModelEntry:
        if self.kv.state > 0 and self.layers.linear == 0:
            raise ValueError(
                "kv.state: a fixed state needs linear-attention layers (layers.linear)"
            )
        return self


class ProfileFile(StrictModel):
    model: ModelEntry
    hardware: dict[str, HardwareEntry] = Field(min_length=1)


def to_profiles(doc: ProfileFile) -> tuple[ModelProfile, list[HardwareProfile]]:
    """The testbed's profile objects for a profile file."""
    m = doc.model
    if m.kv.curve is not None:
        kv = Curve.of([(k.tokens, k.size) for k in m.kv.curve])
    else:
        per_token = m.kv.per_token or 0.0
        kv = Curve((0.0, 1e6), (m.kv.state, m.kv.state + per_token * 1e6))
    prefill = {
        name: Curve.of([(k.tokens, k.time) for k in hw.prefill])
        for name, hw in doc.hardware.items()
        if hw.prefill is not None
    }
    decode = {
        name: DecodeProfile(hw.decode.step_base, hw.decode.step_per_seq, hw.decode.max_batch)
        for name, hw in doc.hardware.items()
        if hw.decode is not None
    }
    model = ModelProfile(
        name=m.name,
        description=m.description or f"user profile {m.name}",
        kv_bytes_curve=kv,
        state_bytes=m.kv.state,
        layer_kinds=m.layers.kinds(),
        prefill=prefill,
        decode=decode,
    )
    hardware = [HardwareProfile(name, hw.description, hw.gpus) for name, hw in doc.hardware.items()]
    return model, hardware


def register_profile(doc: ProfileFile) -> None:
    """Make the file's model and hardware known by name in this process (testbed.profiles)."""
    register(*to_profiles(doc))


def _describe(exc: ValidationError) -> str:
    """The first error in one line, "where: what"; an unknown field first (a typo also makes
    the real field missing) with the closest known one suggested."""
    errors = exc.errors()
    err = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
    loc = list(err["loc"])
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        msg = "unknown field"
        if loc and isinstance(loc[-1], str):
            near = closest_field(loc[-1], fields_at(ProfileFile, loc[:-1]))
            msg += f"; did you mean {near!r}?" if near else ""
    elif err["type"] == "missing":
        msg = "missing field"
    more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    where = ".".join(str(p) for p in loc)
    return f"{where}: {msg}{more}" if where else f"{msg}{more}"


def load_profile_file(path: Path) -> ProfileFile:
    """Read, validate (units required, as in a scenario file) and register a profile file;
    every error is one line naming the file and the field."""
    data = load_yaml(path)
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping with `model` and `hardware`")
    try:
        doc = ProfileFile.model_validate(data, context=STRICT_UNITS)
    except ValidationError as exc:
        raise ConfigError(f"{path}: {_describe(exc)}") from None
    try:
        register_profile(doc)
    except (ProfileConflict, ValueError) as exc:
        raise ConfigError(f"{path}: {exc}") from None
    return doc
