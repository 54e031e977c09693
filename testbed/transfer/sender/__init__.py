"""The prefill side of a KV transfer: layer-wise frames striped over persistent TCP connections.

One `KVSender` talks to one receiver address. Whether that address is the link emulator's proxy
port (cross-datacenter) or the decode instance itself (in-cluster) is the caller's decision; the
sender behaves the same either way, which is what lets the testbed compare the two paths.

How it works:
- A prefill hands over each layer as soon as it is computed (`tx.send_layer`). The layer is cut
  into chunks and queued; `send_layer` returns at once (unless more than `max_queued_bytes` wait),
  so computing layer i+1 overlaps with sending layer i (the paper's layer-wise pipelining).
- N connections each run a writer that takes the next chunk from one shared queue, so whichever
  connection drains first sends next: least-loaded striping without a scheduler.
- The receiver ACKs every frame, echoing its send stamp: the sender knows bytes in flight (sent,
  not yet ACKed) and samples RTT, which includes queueing in socket buffers and the emulated link.
  A window (`max_inflight_bytes`) bounds bytes in flight, like a transport's congestion window.
- A request is done when an ACK says the receiver has it complete and verified; `tx.finish()`
  waits for exactly that, so "sent" never means "maybe arrived".
- When a connection dies (reset, EOF, write timeout, or no ACK for `ack_timeout`), its
  unacknowledged frames are put back at the head of the queue if their request still has retries
  (`max_retries`), and the receiver de-duplicates; otherwise those requests fail with a
  TransferError naming the cause. The connection slot reconnects either way.
- If every slot fails to connect `reconnect_attempts` times in a row, the receiver is deemed
  unreachable: active requests fail and `open()` fails fast until a connection succeeds again.

Time to fail against a dead address is bounded by about
reconnect_attempts x (connect_timeout + backoff); a stuck request by `request_timeout`.

The package:
- outbound:    one request's state, its frames (chunks) and the connection carrying each
- chunk_queue: the one queue all connections take frames from
- outbox:      requests, bytes queued and in flight, outcomes and counters, shared by all
- slots:       the connection slots: connect, write, read ACKs, watchdog, reconnect
- api:         KVSender, KVTransmission, SenderStats, pooled_sender
"""

from __future__ import annotations

from testbed.transfer.sender.api import KVSender, KVTransmission, SenderStats, pooled_sender
from testbed.transfer.sender.outbound import TransferResult

__all__ = ["KVSender", "KVTransmission", "SenderStats", "TransferResult", "pooled_sender"]
