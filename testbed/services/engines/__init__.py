"""The engines behind the prefill and decode services, as adapters (see `base`): pick one for a
service spec. The torch adapter module imports torch only when it builds an instance."""

from __future__ import annotations

from typing import Any

from testbed.clock import Clock
from testbed.services.engines.base import DecodeAdapter, PrefillAdapter
from testbed.services.spec import ServiceSpec

__all__ = ["decode_adapter", "prefill_adapter"]


def prefill_adapter(spec: ServiceSpec, clock: Clock) -> PrefillAdapter[Any]:
    if spec.engine == "torch":
        from testbed.services.engines.torch import TorchPrefill

        return TorchPrefill.build(spec, clock)
    from testbed.services.engines.emulated import EmulatedPrefill

    return EmulatedPrefill(spec, clock)


def decode_adapter(spec: ServiceSpec, clock: Clock, bs_max: int) -> DecodeAdapter[Any]:
    if spec.engine == "torch":
        from testbed.services.engines.torch import TorchDecode

        return TorchDecode.build(spec, clock, bs_max)
    from testbed.services.engines.emulated import EmulatedDecode

    return EmulatedDecode(spec, clock, bs_max)
