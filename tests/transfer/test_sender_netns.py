"""KV senders behind a kernel-shaped link (`shaper: tc`, testbed.transfer.netns): a sender given
a network namespace opens its connections there, so its KV crosses the veth to the emulator's
proxy listening on the other side (`listen_netns`), and the qdisc on the veth counts it. A
sender without it cannot even reach that address. Needs root (marker tc)."""

from __future__ import annotations

import asyncio
import os

import pytest

from testbed.link import tc
from testbed.link.server import start_link_server
from testbed.transfer import KVReceiver, KVSender
from testbed.transfer.sender import pooled_sender

pytestmark = [pytest.mark.tc, pytest.mark.timeout(60)]


async def test_a_sender_with_netns_connects_from_that_namespace() -> None:
    layers = [os.urandom(100_000) for _ in range(4)]
    with tc.pair(f"s{os.getpid()}", rate=50e6, both=False) as p:
        async with (
            KVReceiver(port=0) as rx,
            await start_link_server("127.0.0.1", 0, listen_netns=p.ns_b) as link,
        ):
            proxy = await link.emulator.create_proxy(
                {"name": "xdc", "upstream": f"127.0.0.1:{rx.port}", "listen": f"{p.addr_b}:0"}
            )
            port = int(proxy["listen"].rsplit(":", 1)[1])
            before = p.counters("a")["bytes"]
            senders: dict[tuple[str, int], KVSender] = {}
            tx = await pooled_sender(senders, (p.addr_b, port), 2, netns=p.ns_a)
            try:
                rx.expect("req-1")
                async with tx.open("req-1", [len(x) for x in layers]) as t:
                    for i, layer in enumerate(layers):
                        await t.send_layer(i, layer)
                manifest = await rx.wait("req-1", timeout=20)
                assert manifest.verified and manifest.total_bytes == sum(map(len, layers))
            finally:
                await tx.aclose()
            assert p.counters("a")["bytes"] - before > sum(map(len, layers))
            # Without the namespace the PrfaaS side's address is not reachable from here.
            async with KVSender(
                p.addr_b, port, connections=1, reconnect_attempts=1, connect_timeout=1
            ) as plain:
                for _ in range(50):  # bounded: one failed connect marks it unreachable
                    if plain.unreachable is not None:
                        break
                    await asyncio.sleep(0.1)
                assert plain.unreachable is not None
