"""The decode side of a KV transfer: a TCP server that reassembles and verifies requests.

A decode instance runs one `KVReceiver`. Senders (PrfaaS prefill across the link, PD-P prefill
inside the cluster) open several connections to it and stripe each request's frames across them;
the rules for when a request is complete or failed live in `reassembly/`, this package is the
network side.

Speed matters here (hundreds of MB/s on a 2-core machine shared with other processes), so each
connection is an `asyncio.BufferedProtocol`: the kernel copies bytes straight into one reusable
buffer, frames are parsed and checksummed in place through memoryviews, and payload bytes are
never copied again unless `keep_payload=True`. Deadlines are enforced by one watchdog task per
connection that wakes every `check_interval` seconds (idle connection, frame stalled halfway, ACKs
not draining), instead of arming timers per frame.

Backpressure: if the sender stops reading ACKs, the transport pauses writing and the connection
stops reading frames until it resumes, so nothing grows without bound.

Hostile peers: any local process can connect. What it can make the receiver hold is bounded:
frames for ids the owner did not `expect` create no state (reassembly/); a connection's buffer
grows only with bytes that really arrived, all buffers share one BufferBudget (buffers.py), the
number of connections is capped (more are refused at once), and expected requests past their
deadline are failed and freed by the supervisor every `check_interval`.

The package: protocol.py (one connection: buffer, parsing, ACKs), server.py (KVReceiver).
"""

from __future__ import annotations

from testbed.transfer.reassembly import KVManifest, ReceiverFull
from testbed.transfer.receiver.server import KVReceiver, ReceiverStats

__all__ = ["KVManifest", "KVReceiver", "ReceiverFull", "ReceiverStats"]
