"""One direction of one proxied connection: source socket -> chain of toxic stages -> sink socket.

This mirrors Toxiproxy's ToxicLink. Each toxic on the direction runs as a stage (an asyncio task)
that reads chunks from its input queue and passes them to whatever follows it now, the next stage
or the sink. Chunks are stamped with the time they were read, so a latency toxic holds each chunk
until read time + delay and pipelines instead of capping throughput. Queues are bounded in bytes;
when the first one fills the source socket stops being read, which pushes back on the sender
through TCP's own flow control.

With no stages the direction takes the fast path: each socket read is written straight to the
sink transport, and reading pauses while the sink's write buffer is full. No queue, task or
timestamp is involved, which is what keeps an unshaped link close to raw loopback speed.

Toxics come and go while connections are open. A new stage is appended at the end (as Toxiproxy
does). A removed stage is interrupted: whatever it holds is passed on at once, its queue is
drained in order, and only when it is empty does the stage unlink itself, so no byte is reordered
or lost. An updated toxic is swapped in place; stages are interrupted and restarted (re-drawing
toxicity) unless the toxic applies updates live.

The package: chunks.py (what flows, and the bounded queues), sink.py (the destination socket),
stage.py (a toxic running on a direction, and its Stub), link.py (ToxicLink, the direction).
"""

from testbed.link.pipeline.chunks import CLOSE, EOF, Chunk, ChunkQueue, End, Item
from testbed.link.pipeline.link import ConnectionControl, ToxicLink
from testbed.link.pipeline.sink import LinkStats, Sink
from testbed.link.pipeline.stage import Interrupted, Stage, Stub

__all__ = [
    "CLOSE",
    "EOF",
    "Chunk",
    "ChunkQueue",
    "ConnectionControl",
    "End",
    "Interrupted",
    "Item",
    "LinkStats",
    "Sink",
    "Stage",
    "Stub",
    "ToxicLink",
]
