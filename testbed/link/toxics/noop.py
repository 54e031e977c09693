"""noop: passes data through unchanged (Toxiproxy's NoopToxic; also what a toxic does to the
connections its toxicity did not pick)."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from testbed.link.pipeline import End
from testbed.link.toxics.base import Attr, Toxic

if TYPE_CHECKING:
    from testbed.link.pipeline import Stub


class NoopToxic(Toxic):
    type_name: ClassVar[str] = "noop"
    attrs: ClassVar[tuple[Attr, ...]] = ()

    async def pipe(self, stub: Stub) -> None:
        while True:
            item = await stub.recv()
            await stub.send(item)
            if isinstance(item, End):
                return
