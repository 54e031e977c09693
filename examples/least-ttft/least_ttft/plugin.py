"""The Python plugin form: `--policy least-ttft` (entry point) or
`--policy least_ttft.plugin:LeastTTFT`."""

from __future__ import annotations

from typing import ClassVar

from least_ttft.core import choose
from testbed.policy.base import RequestView, Route, Snapshot


class LeastTTFT:
    name: ClassVar[str] = "least-ttft"
    deployment_kind: ClassVar[str] = "prfaas-pd"
    needs_threshold: ClassVar[bool] = True
    """It ignores the threshold, but its fallback (prfaas-static) routes by it."""
    replans: ClassVar[bool] = True
    """The short-term loop runs: it is what estimates the link's bandwidth in the snapshot."""
    long_term: ClassVar[bool] = False
    cache_aware: ClassVar[bool] = True

    def decide(self, request: RequestView, snapshot: Snapshot) -> Route:
        c = choose(
            request,
            snapshot.instances,
            getattr(snapshot, "link", None),
            getattr(snapshot, "costs", None),
        )
        if c is None:
            raise LookupError("no usable prefill or decode instance")
        return Route(
            prefill_cluster=c.prefill.cluster,
            prefill_instance=c.prefill.id,
            decode_instance=c.decode.id,
            uncached_tokens=c.uncached_tokens,
            threshold_tokens=snapshot.threshold_tokens,
        )
