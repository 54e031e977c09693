"""burst: extra arrivals during [at, at + for). Nothing to do live: they are generated when the
run is prepared (`extra_requests`); the player only records the window."""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
from pydantic import Field

from testbed.config import PositiveDuration
from testbed.nemesis.event import BaseLoad, NemesisEvent
from testbed.nemesis.fault import ACTIONS, Fault, NemesisContext
from testbed.workload.build import length_distribution
from testbed.workload.generate import RequestSpec


class BurstAction(NemesisEvent):
    action: Literal["burst"] = "burst"
    for_: PositiveDuration = Field(alias="for")
    multiplier: float = Field(gt=1, le=100)

    def extra_requests(self, index: int, load: BaseLoad) -> list[RequestSpec] | None:
        """A Poisson stream at (multiplier - 1) x the base rate during [at, at + for) (cut at
        the run's duration), lengths from the workload's length distribution and its output
        length; ids are "b<fault index>-<n>". Everything is drawn from generators seeded with
        (seed, fault index), so the same seed gives the same extra requests."""
        start, end = self.at, min(self.at + self.for_, load.duration_s)
        rate = load.rate_rps * (self.multiplier - 1.0)
        if end <= start or rate <= 0:
            return []
        arrivals_ss, lengths_ss = np.random.SeedSequence([load.seed, index]).spawn(2)
        rng = np.random.default_rng(arrivals_ss)
        n = int(rng.poisson(rate * (end - start)))
        times = np.sort(rng.uniform(start, end, size=n))
        dist = length_distribution(load.workload.lengths)
        lengths = dist.sample(np.random.default_rng(lengths_ss), n) if n else np.empty(0)
        n_out = max(1, round(load.workload.output_tokens))
        return [
            RequestSpec(f"b{index}-{j + 1:05d}", float(t), max(1, round(float(ln))), n_out)
            for j, (t, ln) in enumerate(zip(times, lengths, strict=True))
        ]


@ACTIONS.register
class BurstFault(Fault[BurstAction]):
    config = BurstAction

    async def start(self, ctx: NemesisContext) -> dict[str, Any]:
        return {"multiplier": self.event.multiplier}
