"""slicer: cut each chunk into smaller pieces, optionally `delay` µs apart (Toxiproxy's
SlicerToxic).

Pieces average `average_size` bytes, varying by +/- `size_variation`, split recursively in about
halves as Toxiproxy does so no end of the chunk favours small pieces. `size_variation` must be
smaller than `average_size` (Toxiproxy's README asks for it; here it is enforced, as a larger one
could produce empty or negative pieces).
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, ClassVar

from testbed.link.errors import bad_request
from testbed.link.pipeline import Chunk, End
from testbed.link.toxics.base import Attr, Toxic

if TYPE_CHECKING:
    import random

    from testbed.link.pipeline import Stub


class SlicerToxic(Toxic):
    type_name: ClassVar[str] = "slicer"
    attrs: ClassVar[tuple[Attr, ...]] = (
        Attr("average_size", "int", 0, "average piece size in bytes, > 0", positive=True),
        Attr("size_variation", "int", 0, "+/- bytes, smaller than average_size", minimum=0),
        Attr("delay", "int", 0, "microseconds between pieces", minimum=0),
    )

    def configure(self) -> None:
        avg, var = self.values["average_size"], self.values["size_variation"]
        if avg <= 0:
            raise bad_request("attribute 'average_size' of a slicer toxic must be greater than 0")
        if var >= avg:
            raise bad_request(
                f"attribute 'size_variation' ({var}) of a slicer toxic must be smaller than "
                f"'average_size' ({avg})"
            )

    def cuts(self, size: int, rng: random.Random) -> list[int]:
        """Boundaries [0, ..., size] of the pieces of a chunk of `size` bytes."""
        avg, var = self.values["average_size"], self.values["size_variation"]
        out: list[int] = []
        stack = [(0, size)]
        while stack:
            start, end = stack.pop()
            if (end - start) - avg <= var:
                out.append(end)
                continue
            offset = rng.randint(-var, var - 1) if var > 0 else 0
            mid = start + (end - start) // 2 + offset
            stack.append((mid, end))
            stack.append((start, mid))
        return [0, *out]

    async def pipe(self, stub: Stub) -> None:
        delay = self.values["delay"] / 1e6
        while True:
            item = await stub.recv()
            if isinstance(item, End):
                await stub.send(item)
                return
            mv = memoryview(item.data)
            cuts = self.cuts(len(mv), stub.rng)
            for a, b in itertools.pairwise(cuts):
                if stub.interrupted:
                    await stub.send(Chunk(mv[a:], item.ts))
                    break
                await stub.send(Chunk(mv[a:b], item.ts))
                if delay > 0:
                    await stub.sleep_until(stub.loop.time() + delay)
