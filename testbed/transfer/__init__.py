"""KV transfer path: wire format, layer-wise multi-connection sender, reassembling receiver.

A prefill instance streams each request's KVCache, layer by layer, as checksummed frames over N
persistent TCP connections (`KVSender`), either straight to a decode instance (in-cluster) or to
the link emulator's proxy port (cross-datacenter). The decode instance's `KVReceiver` admits a
request only once every byte of every layer arrived verified. See wire/ for the frame layout.

    async with KVReceiver(port=0) as rx, KVSender("127.0.0.1", rx.port) as tx:
        rx.expect("req-1")                        # frames for ids not expected are refused
        async with tx.open("req-1", layer_sizes) as t:
            for i, layer in enumerate(layers):
                await t.send_layer(i, layer)      # returns once queued: overlaps compute
        manifest = await rx.wait("req-1", timeout=10)
"""

from testbed.transfer.checksum import ChecksumAlgo, preferred_algo
from testbed.transfer.errors import TransferError
from testbed.transfer.payload import PayloadSource, split_layers
from testbed.transfer.reassembly import KVManifest
from testbed.transfer.receiver import KVReceiver, ReceiverFull, ReceiverStats
from testbed.transfer.sender import KVSender, KVTransmission, SenderStats, TransferResult
from testbed.transfer.wire import WireError

__all__ = [
    "ChecksumAlgo",
    "KVManifest",
    "KVReceiver",
    "KVSender",
    "KVTransmission",
    "PayloadSource",
    "ReceiverFull",
    "ReceiverStats",
    "SenderStats",
    "TransferError",
    "TransferResult",
    "WireError",
    "preferred_algo",
    "split_layers",
]
