"""latency: hold each chunk until read time + latency +/- jitter (Toxiproxy's LatencyToxic).

The delay counts from when the chunk was read, not from when this stage got to it, so chunks
queue up behind each other and the link stays pipelined: latency adds delay, not a throughput
cap. Jitter is drawn per chunk, uniformly in [latency - jitter, latency + jitter] (continuous,
where Toxiproxy draws whole milliseconds), from the stage's random source, so a server seed
makes it reproducible. A chunk never overtakes the one before it, as on a TCP stream.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from testbed.link.pipeline import End
from testbed.link.toxics.base import Attr, Toxic

if TYPE_CHECKING:
    import random

    from testbed.link.pipeline import Stub


class LatencyToxic(Toxic):
    type_name: ClassVar[str] = "latency"
    attrs: ClassVar[tuple[Attr, ...]] = (
        Attr("latency", "float", 0, "delay in milliseconds (fractions allowed)", minimum=0),
        Attr("jitter", "float", 0, "+/- milliseconds, uniform per chunk", minimum=0),
    )

    def configure(self) -> None:
        self.latency_s = self.values["latency"] / 1000.0
        self.jitter_s = self.values["jitter"] / 1000.0

    def delay(self, rng: random.Random) -> float:
        d = self.latency_s
        if self.jitter_s > 0:
            d += rng.uniform(-self.jitter_s, self.jitter_s)
        return max(0.0, d)

    async def pipe(self, stub: Stub) -> None:
        rng = stub.rng
        while True:
            item = await stub.recv()
            if isinstance(item, End):
                await stub.send(item)
                return
            release = item.ts + self.delay(rng)
            await stub.sleep_until(release)
            item.ts = release
            await stub.send(item)
