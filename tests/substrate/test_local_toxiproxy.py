"""`link.toxiproxy`: the local substrate puts the run's link on the Toxiproxy-compatible API the
scenario names, instead of starting its own emulator (in process; nothing is spawned)."""

from __future__ import annotations

from pathlib import Path

from testbed.config import LinkConfig, ScaleConfig
from testbed.link.client import LinkClient
from testbed.link.server import start_link_server
from testbed.substrate.local import LocalSubstrate


async def test_the_link_goes_on_the_named_api_and_no_emulator_is_started(tmp_path: Path) -> None:
    server = await start_link_server("127.0.0.1", 0, seed=1)
    sub = LocalSubstrate(tmp_path)
    try:
        hostport = server.url.removeprefix("http://")
        link = LinkConfig(bandwidth="10Gbps", toxiproxy=hostport)  # type: ignore[arg-type]
        setup = await sub.start_link(
            link, ScaleConfig(), {"local-decode-0": ("127.0.0.1", 9)}, enabled=True, seed=0
        )
        assert sub.link_proc is None  # nothing spawned: the named API carries the link
        async with LinkClient(server.url, timeout=5) as client:
            assert set(await client.proxies()) == {"xdc-local-decode-0"}
        assert setup.routes["local-decode-0"] != ("127.0.0.1", 9)
    finally:
        await sub.stop_all()
        await server.close()
