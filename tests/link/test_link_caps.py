"""Caps on proxies and toxics, and the descriptor limit (issue 33, defect 7).

Before: the emulator took proxies and toxics without end; out of file descriptors, creating a
proxy was a 500 with a traceback, and the default asyncio loop logged a traceback for every
accept it could not make. Now: a create past a cap is a 409 naming it; a listen the process has
no descriptors for is a 503 with the reason; a proxy's accept loop waits out the shortage and
its open connections keep carrying data."""

from __future__ import annotations

import errno
import subprocess
import sys
import textwrap
from typing import Any

import pytest
from annotated_types import Le

from testbed.config.deployment import ClusterConfig
from testbed.link import collection, emulator, proxy
from testbed.link.client import LinkApiError, LinkClient

pytestmark = pytest.mark.timeout(120)


def test_caps_leave_room_for_the_largest_deployment() -> None:
    """One proxy per decode instance: the proxy cap is above the config's instance cap."""
    instances_cap = next(
        m.le for m in ClusterConfig.model_fields["instances"].metadata if isinstance(m, Le)
    )
    assert instances_cap <= emulator.MAX_PROXIES
    assert collection.MAX_TOXICS >= 8  # a deployment's three plus the nemeses'


async def test_proxies_beyond_the_cap_are_a_409(
    client: LinkClient, echo: tuple[str, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(emulator, "MAX_PROXIES", 3)
    up = f"{echo[0]}:{echo[1]}"
    for i in range(3):
        await client.create_proxy(f"p{i}", upstream=up)
    with pytest.raises(LinkApiError) as info:
        await client.create_proxy("p3", upstream=up)
    assert info.value.status == 409 and "at most 3" in info.value.message
    with pytest.raises(LinkApiError) as info:  # populate: all or nothing
        await client.populate([{"name": n, "upstream": up} for n in ("p0", "q1")])
    assert info.value.status == 409
    assert sorted(await client.proxies()) == ["p0", "p1", "p2"]
    await client.populate([{"name": "p0", "upstream": up}])  # replacing one stays within
    await client.delete_proxy("p1")
    await client.create_proxy("p3", upstream=up)  # a freed slot is usable again


async def test_toxics_beyond_the_cap_are_a_409(
    client: LinkClient, echo: tuple[str, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(collection, "MAX_TOXICS", 2)
    await client.create_proxy("p", upstream=f"{echo[0]}:{echo[1]}")
    for i in range(2):
        await client.add_toxic("p", "latency", name=f"t{i}", attributes={"latency": 1})
    with pytest.raises(LinkApiError) as info:
        await client.add_toxic("p", "latency", name="t2", attributes={"latency": 1})
    assert info.value.status == 409 and "toxics" in info.value.message
    await client.remove_toxic("p", "t0")
    await client.add_toxic("p", "latency", name="t2", attributes={"latency": 1})


async def test_a_listen_without_descriptors_is_a_503(
    client: LinkClient,
    echo: tuple[str, int],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    up = f"{echo[0]}:{echo[1]}"
    monkeypatch.setattr(proxy, "descriptor_room", lambda: "out of file descriptors (test)")
    with pytest.raises(LinkApiError) as info:
        await client.create_proxy("p", upstream=up)
    assert info.value.status == 503 and "out of file descriptors" in info.value.message

    def no_socket(*args: Any, **kwargs: Any) -> Any:
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(proxy, "descriptor_room", lambda: None)
    monkeypatch.setattr(proxy.socket, "socket", no_socket)
    with pytest.raises(LinkApiError) as info:
        await client.create_proxy("p", upstream=up)
    assert info.value.status == 503 and "Too many open files" in info.value.message
    assert not [r for r in caplog.records if r.exc_info]


# A child process (its own descriptor limit) on one loop: a proxy carrying a connection, then
# every descriptor taken; the API refuses a new proxy with a 503, the open connection keeps
# echoing, a new client waits in the backlog and is served once descriptors are freed.
CHILD = textwrap.dedent(
    """
    import asyncio, logging, resource, socket, sys, threading
    logging.basicConfig(level=logging.INFO)
    from testbed.link.client import LinkApiError, LinkClient
    from testbed.link.server import start_link_server

    async def echo(r, w):
        while data := await r.read(65536):
            w.write(data)
            await w.drain()
        w.close()

    async def main():
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
        srv = await asyncio.start_server(echo, "127.0.0.1", 0)
        up = "127.0.0.1:%d" % srv.sockets[0].getsockname()[1]
        link = await start_link_server("127.0.0.1", 0)
        async with LinkClient(link.url, timeout=5) as c:
            host, port = (await c.create_proxy("a", upstream=up))["listen"].rsplit(":", 1)
            r, w = await asyncio.open_connection(host, int(port))
            w.write(b"one")
            assert await asyncio.wait_for(r.readexactly(3), 5) == b"one"
            waiting = socket.socket()
            waiting.settimeout(20)
            files = []
            try:
                for _ in range(1000):
                    files.append(open("/dev/null"))
            except OSError:
                pass
            try:
                await c.create_proxy("b", upstream=up)
                print("created b", flush=True)
            except LinkApiError as e:
                print("create b:", e.status, e.message, flush=True)
            w.write(b"two")
            print("open connection:", await asyncio.wait_for(r.readexactly(3), 5), flush=True)
            got = []

            def connect():
                waiting.connect((host, int(port)))
                waiting.sendall(b"new")
                got.append(waiting.recv(3))

            t = threading.Thread(target=connect)
            t.start()
            await asyncio.sleep(1.5)  # the proxy cannot accept it now: no descriptors
            for f in files:
                f.close()
            await asyncio.to_thread(t.join, 20)
            print("waiting client:", got, flush=True)
            waiting.close()
            w.close()
        await link.close()

    if sys.argv[1] == "uvloop":
        import uvloop
        uvloop.run(main())
    else:
        asyncio.run(main())
    """
)


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_out_of_descriptors_the_proxy_keeps_carrying(loop: str) -> None:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, loop], capture_output=True, text=True, timeout=90
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "create b: 503 listen tcp" in out.stdout, out.stdout
    assert "open connection: b'two'" in out.stdout, out.stdout
    assert "waiting client: [b'new']" in out.stdout, out.stdout
    assert "Traceback" not in out.stderr, out.stderr[-3000:]
    # one line when the shortage starts and one when it ends, not one per failed accept
    assert out.stderr.count("accept out of descriptors") <= 1, out.stderr[-3000:]
