"""Per-request reassembly of KV frames: pure state, no sockets.

Frames of one request arrive over several connections in any order, possibly more than once
(a sender that lost a connection resends what it had not seen acknowledged). This module decides,
frame by frame, what a request's state is and what to answer:

- State exists only for requests the owner announced with `expect` (the decode instance does so
  when the router dispatches the request, before the prefill starts). Any local process can
  connect to a KV port, so frames for any other id are refused (a FAILED ACK, an ABORT dropped)
  without creating anything: a flood of made-up ids costs no memory.
- Memory follows bytes that really arrived: a kept layer grows as its frames come in (out-of-order
  chunks wait in a side table), never `bytearray(total)` from a header's claim; an expected size
  (`total_bytes`) bounds what frames may announce.
- Expected requests carry a deadline (`ttl`): one never completed, or never collected by its
  owner, is failed and freed by `expire`. Finished-and-discarded requests are remembered, up to
  `retired_capacity`, only so late duplicates get their final status.

- A request is *complete* only when its END frame has arrived and every byte of every layer it
  announces has arrived in frames whose checksums matched.
- It is *failed*, and never completes, on a checksum mismatch, an inconsistent frame (a layer
  size that disagrees with earlier frames or with END), an ABORT from the sender, or a discard
  by the owner before completion.
- Duplicates are idempotent: per-layer byte ranges count only new bytes, and finished requests
  (even discarded ones, for a while) answer with their final status instead of coming back.

Keeping this apart from the network code makes the rules testable without sockets and lets the
receiver's I/O layer stay a thin, fast loop.

The package: inbound.py (one request's state and its manifest), reassembler.py (the rules).
"""

from __future__ import annotations

from testbed.transfer.reassembly.inbound import KVManifest
from testbed.transfer.reassembly.reassembler import Reassembler, ReceiverFull

__all__ = ["KVManifest", "Reassembler", "ReceiverFull"]
