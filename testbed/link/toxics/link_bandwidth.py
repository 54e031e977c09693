"""link_bandwidth (extension): one bandwidth cap shared by all connections of a proxy.

Toxiproxy's `bandwidth` limits each connection separately, so 8 parallel streams through a
"100 Mbit/s" proxy get 800 Mbit/s. A cross-datacenter link is one pipe: this toxic keeps one
token bucket per proxy and direction, and every connection draws from it, so the total is the
cap however many connections there are. With `"stream": "both"` each direction gets its own
bucket at the same rate (a full-duplex link).

The cap can follow a schedule: `schedule` (a list of `[time, rate]` steps) or `schedule_file` (a
file of `time rate` samples on the server) plays out from the moment the toxic is created or
updated, repeating every `period` seconds if `period` > 0. Before the first step, `rate` applies.
Rates are KB/s numbers (1 KB = 1000 bytes, Toxiproxy's unit) or strings such as "100Mbps".

With `group` (extension of the extension), every proxy's link_bandwidth toxic with the same
group name shares one bucket per direction: several proxies (say, one per decode instance)
behind one cross-datacenter link. Changing the rate of any of them changes the group's.

Updates apply live to open connections: the bucket is handed over, not recreated, so a rate
change takes effect on the next piece without a burst. The chunk timestamps leave this toxic at
the moment their last byte left the link, so a `latency` toxic after it adds propagation delay
on top of serialization, as on a real link.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from testbed.link.errors import bad_request
from testbed.link.pacer import Pacer, piece_size
from testbed.link.pipeline import Chunk, End
from testbed.link.schedule import (
    Schedule,
    ScheduleError,
    load_schedule_file,
    parse_rate_kbps,
    parse_steps,
    read_schedule_file,
)
from testbed.link.toxics.base import Attr, Toxic

if TYPE_CHECKING:
    from testbed.link.pipeline import Stub


class LinkBandwidthToxic(Toxic):
    type_name: ClassVar[str] = "link_bandwidth"
    attrs: ClassVar[tuple[Attr, ...]] = (
        Attr("rate", "float", 0, "KB/s shared by all connections (before the first step)"),
        Attr("schedule", "list", [], "[[seconds, rate], ...] steps played from creation"),
        Attr("schedule_file", "str", "", "server-side file of 'time rate' samples"),
        Attr("period", "float", 0, "repeat the schedule every period seconds (0 = once)"),
        Attr("group", "str", "", "share one cap with every proxy's toxic of this group"),
    )
    live_update: ClassVar[bool] = True
    extension: ClassVar[bool] = True

    def __init__(
        self, values: Mapping[str, Any], file_steps: list[tuple[float, float]] | None = None
    ) -> None:
        self._file_steps = file_steps  # schedule_file, already read (see build)
        super().__init__(values)

    @classmethod
    async def build(cls, raw: object, base: Mapping[str, Any] | None = None) -> Toxic:
        """Read `schedule_file` in a thread, bounded in size and time, then configure."""
        values = cls.validate(raw, base)
        steps = None
        if values["schedule_file"] and not values["schedule"]:
            try:
                steps = await read_schedule_file(values["schedule_file"])
            except ScheduleError as exc:
                raise bad_request(str(exc)) from None
        return cls(values, steps)

    def configure(self) -> None:
        v = self.values
        if v["rate"] < 0:
            raise bad_request("attribute 'rate' of a link_bandwidth toxic must be greater than 0")
        if v["period"] < 0:
            raise bad_request("attribute 'period' of a link_bandwidth toxic must be >= 0")
        if v["schedule"] and v["schedule_file"]:
            raise bad_request("give either 'schedule' or 'schedule_file', not both")
        try:
            steps = parse_steps(v["schedule"]) if v["schedule"] else []
            if v["schedule_file"]:
                # Read by build() off the event loop; a direct from_attributes() (Python
                # callers, not the API) reads it here, still bounded in size.
                steps = self._file_steps or load_schedule_file(v["schedule_file"])
            if v["rate"] > 0:
                initial = parse_rate_kbps(v["rate"], "rate")
            elif steps and steps[0][0] == 0:
                initial = steps[0][1]
            else:
                raise bad_request(
                    "a link_bandwidth toxic needs 'rate' > 0 or a schedule starting at time 0"
                )
            self.schedule = Schedule(steps, initial, float(v["period"]))
        except ScheduleError as exc:
            raise bad_request(str(exc)) from None
        self.rate_bps = self.schedule.rate_at(0.0)
        self._pacers: dict[str, Pacer] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._t0 = 0.0

    # -- shared state ----------------------------------------------------------------------
    def activate(self, loop: asyncio.AbstractEventLoop, previous: Toxic | None) -> None:
        self._loop = loop
        self._t0 = loop.time()
        if isinstance(previous, LinkBandwidthToxic):
            previous.deactivate()
            self._pacers = previous._pacers
        group = self.values["group"]
        if group and self.shared is not None:
            # One pipe behind several proxies: every toxic of the group draws on one bucket
            # per direction, and the latest configuration of any of them sets its rate.
            self._pacers = self.shared.setdefault(("link_bandwidth", group), {})
        self._apply(self.schedule.rate_at(0.0))
        self._arm(0.0)

    def deactivate(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def pacer(self, direction: str, now: float) -> Pacer:
        p = self._pacers.get(direction)
        if p is None:
            p = self._pacers[direction] = Pacer(self.rate_bps, now)
        return p

    def _apply(self, rate: float) -> None:
        self.rate_bps = rate
        if self._loop is None:
            return
        now = self._loop.time()
        for p in self._pacers.values():
            p.set_rate(rate, now)

    def _arm(self, elapsed: float) -> None:
        nxt = self.schedule.next_change(elapsed)
        if nxt is None or self._loop is None:
            return
        self._timer = self._loop.call_at(self._t0 + nxt, self._step, nxt)

    def _step(self, elapsed: float) -> None:
        self._timer = None
        self._apply(self.schedule.rate_at(elapsed))
        self._arm(elapsed)

    # -- data path -------------------------------------------------------------------------
    async def pipe(self, stub: Stub) -> None:
        loop = stub.loop
        direction = stub.direction
        while True:
            item = await stub.recv()
            if isinstance(item, End):
                await stub.send(item)
                return
            n = len(item.data)
            mv: memoryview | None = None
            off = 0
            while off < n:
                toxic = stub.wrapper.toxic  # the current configuration (updates are live)
                if not isinstance(toxic, LinkBandwidthToxic):  # pragma: no cover - defensive
                    toxic = self
                now = loop.time()
                pacer = toxic.pacer(direction, now)
                k = min(n - off, piece_size(pacer.rate))
                done_at = pacer.reserve(k, now)
                await stub.sleep_until(done_at)
                if k == n:
                    item.ts = max(item.ts, done_at)
                    await stub.send(item)
                    break
                if mv is None:
                    mv = memoryview(item.data)
                await stub.send(Chunk(mv[off : off + k], max(item.ts, done_at)))
                off += k
