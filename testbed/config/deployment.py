"""The deployment: clusters of instances on hardware profiles, the link between them, the scale."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    Field,
    ModelWrapValidatorHandler,
    PrivateAttr,
    model_validator,
)

from testbed.config.base import Bandwidth, Duration, Size, StrictModel
from testbed.config.limits import BYTE_SCALE, TIME_SCALE, within
from testbed.profiles import HARDWARE, MODELS
from testbed.units import parse_bandwidth

__all__ = [
    "ClusterConfig",
    "DeploymentConfig",
    "DeploymentKind",
    "LinkConfig",
    "ScaleConfig",
    "TinyModelConfig",
]

DeploymentKind = Literal["prfaas-pd", "homogeneous", "naive"]


def _known_hardware(name: str) -> str:
    if name not in HARDWARE:
        raise ValueError(f"unknown hardware profile {name!r}; known: {', '.join(sorted(HARDWARE))}")
    return name


def _known_model(name: str) -> str:
    if name not in MODELS:
        raise ValueError(f"unknown model profile {name!r}; known: {', '.join(sorted(MODELS))}")
    return name


class ScaleConfig(StrictModel):
    """How much faster and smaller than the real system the emulation runs.

    Emulated durations are real durations / time_scale; KV bytes on the wire are real bytes /
    byte_scale, so emulated link bandwidth is real bandwidth x time_scale / byte_scale.
    """

    time_scale: Annotated[
        float, within(*TIME_SCALE, "x real time", "library scenarios: 10, 20")
    ] = 1.0
    """A number, or `auto` in a file (engine: torch only): the largest time_scale this host's
    calibrated compute keeps up with, resolved by scenario.plan.prepare_run before anything
    starts. Until then the field holds a placeholder and `auto` says so; it is stored as a
    float so everything downstream of planning reads one type."""
    byte_scale: Annotated[
        float, within(*BYTE_SCALE, "(KV bytes divided by it)", "library scenarios: 1000")
    ] = 1.0
    _auto: bool = PrivateAttr(False)

    @model_validator(mode="wrap")
    @classmethod
    def _time_scale_auto(cls, data: Any, handler: ModelWrapValidatorHandler[ScaleConfig]) -> Any:
        if not isinstance(data, dict):  # an instance keeps its own flag
            return handler(data)
        auto = data.get("time_scale") == "auto"
        model = handler({**data, "time_scale": 1.0} if auto else data)
        model._auto = auto
        return model

    @property
    def auto(self) -> bool:
        """True while `time_scale: auto` is unresolved (see `resolved`)."""
        return self._auto

    def resolved(self, time_scale: float) -> ScaleConfig:
        """This scale with a concrete time_scale (what `auto` became)."""
        return ScaleConfig(time_scale=time_scale, byte_scale=self.byte_scale)


class LinkConfig(StrictModel):
    """The cross-datacenter link, in real-world units."""

    bandwidth: Bandwidth = Field(default_factory=lambda: parse_bandwidth("100Gbps"))
    rtt: Duration = 0.0
    jitter: Duration = 0.0
    connections: int = Field(4, ge=1, le=64, description="parallel TCP connections per transfer")
    shaper: Literal["emulator", "tc"] = "emulator"
    toxiproxy: str | None = Field(
        None, description="host:port of an external Toxiproxy-compatible API to use instead"
    )


class ClusterConfig(StrictModel):
    """One datacenter's instances, all on one hardware profile."""

    hardware: Annotated[str, AfterValidator(_known_hardware)]
    instances: int = Field(ge=1, le=1000)
    prefill: int | None = Field(None, ge=0)
    decode: int | None = Field(None, ge=0)
    prefix_cache: Size | None = Field(
        None,
        description="bytes of prefix cache the cluster's pool holds (real-world, e.g. '4TiB'); "
        "default: half the host memory of each instance (testbed.kvcache.manager)",
    )

    @model_validator(mode="after")
    def _split_fits(self) -> ClusterConfig:
        if (
            self.prefill is not None
            and self.decode is not None
            and self.prefill + self.decode != self.instances
        ):
            raise ValueError(
                f"prefill ({self.prefill}) + decode ({self.decode}) must equal "
                f"instances ({self.instances})"
            )
        for role in ("prefill", "decode"):
            n = getattr(self, role)
            if n is not None and n > self.instances:
                raise ValueError(f"{role} ({n}) exceeds instances ({self.instances})")
        return self

    @property
    def pinned_prefill(self) -> int | None:
        """The PD-P count the file fixes (`prefill`, or `instances - decode`); None lets the
        planner pick the split. The run and the planner both read it, so a `load:` rate is a
        fraction of the split that actually runs."""
        if self.prefill is not None:
            return self.prefill
        if self.decode is not None:
            return self.instances - self.decode
        return None


class TinyModelConfig(StrictModel):
    """The tiny real model of `engine: torch` (testbed.engine.torch): the seed fixes every
    weight, so every prefill and decode process of a run builds the same model."""

    seed: int = Field(0, ge=0, lt=2**63)
    dtype: Literal["float32", "float64"] = "float32"


class DeploymentConfig(StrictModel):
    """Clusters and the link between them.

    - prfaas-pd: a prefill-only `prfaas` cluster plus a `local` PD cluster (split into PD-P and
      PD-D); long uncached prefills go to PrfaaS.
    - homogeneous: one `local` PD cluster, no link.
    - naive: all prefill on `prfaas`, all decode on `local`, no length routing.
    """

    kind: DeploymentKind
    model: Annotated[str, AfterValidator(_known_model)] = "internal-1t-hybrid"
    prfaas: ClusterConfig | None = None
    local: ClusterConfig
    link: LinkConfig = Field(default_factory=LinkConfig)
    engine: Literal["emulated", "torch"] = "emulated"
    """emulated: cost-model timed, scaled bytes; torch: the tiny real model (docs/model.md),
    whose steps are padded to `model`'s profile and whose real KV tensors cross the link."""
    tiny_model: TinyModelConfig = Field(default_factory=lambda: TinyModelConfig())

    @model_validator(mode="after")
    def _clusters_match_kind(self) -> DeploymentConfig:
        if self.kind in ("prfaas-pd", "naive") and self.prfaas is None:
            raise ValueError(f"a {self.kind} deployment needs a 'prfaas' cluster")
        if self.kind == "homogeneous" and self.prfaas is not None:
            raise ValueError("a homogeneous deployment has no 'prfaas' cluster")
        # Compared with the defaults, not `model_fields_set`, so a dumped config validates again.
        if self.kind == "homogeneous" and self.link != LinkConfig():
            raise ValueError("link: a homogeneous deployment has no link between datacenters")
        if self.engine != "torch" and self.tiny_model != TinyModelConfig():
            raise ValueError("tiny_model: applies to engine: torch only")
        # A split nothing reads would be a silent no-op: refuse it where it cannot apply.
        for name, cluster, why in (
            ("prfaas", self.prfaas, "the PrfaaS cluster is prefill-only"),
            ("local", self.local if self.kind == "naive" else None, "naive decodes on all of it"),
        ):
            for role in ("prefill", "decode"):
                if cluster is not None and getattr(cluster, role) is not None:
                    raise ValueError(f"{name}.{role}: {why}; only a PD cluster is split")
        decode_hw = HARDWARE[self.local.hardware]
        if MODELS[self.model].decode.get(decode_hw.name) is None:
            raise ValueError(
                f"model {self.model!r} has no decode profile on {decode_hw.name!r} (local.hardware)"
            )
        for name, cluster in (("prfaas", self.prfaas), ("local", self.local)):
            if cluster is not None and cluster.hardware not in MODELS[self.model].prefill:
                raise ValueError(
                    f"model {self.model!r} has no prefill profile on {cluster.hardware!r} "
                    f"({name}.hardware)"
                )
        return self
