"""Start the link emulator: in-process (`start_link_server`) or as a process (`serve`).

In-process use shares the caller's event loop, which is what the testbed's own runs do:

    async with await start_link_server(port=0, seed=7) as link:
        client = LinkClient(link.url)

`serve` is what `testbed link serve` runs: uvloop, the API on 127.0.0.1:8474 unless told
otherwise, proxies from a Toxiproxy config file, and a clean shutdown on SIGINT/SIGTERM.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import socket
from pathlib import Path
from types import TracebackType

from aiohttp import web

from testbed.errors import UserError
from testbed.link.api import build_app
from testbed.link.emulator import LinkEmulator
from testbed.link.errors import ApiError

__all__ = ["LinkServer", "serve", "start_link_server"]

_log = logging.getLogger(__name__)
DEFAULT_PORT = 8474


class LinkServer:
    """A running emulator: its API address, its state, and `close()`."""

    def __init__(self, emulator: LinkEmulator, runner: web.AppRunner, host: str, port: int):
        self.emulator = emulator
        self._runner = runner
        self.host = host
        self.port = port

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    async def close(self) -> None:
        """Stop the API and every proxy (open connections are closed)."""
        await self._runner.cleanup()
        await self.emulator.close()

    async def __aenter__(self) -> LinkServer:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


def load_config(path: str) -> list[object]:
    """A Toxiproxy config file: a JSON array of {name, listen, upstream, enabled}."""
    try:
        data = json.loads(Path(path).read_text())
    except OSError as exc:
        raise UserError(f"cannot read link config {path}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise UserError(f"link config {path} is not valid JSON: {exc}") from None
    if not isinstance(data, list):
        raise UserError(f"link config {path}: expected a JSON array of proxies")
    return data


async def start_link_server(
    host: str = "127.0.0.1",
    port: int = DEFAULT_PORT,
    *,
    seed: int | None = None,
    config: list[object] | None = None,
) -> LinkServer:
    """Start the emulator's API (port 0 picks a free port) in the running event loop."""
    emulator = LinkEmulator(seed=seed)
    if config:
        try:
            await emulator.populate(config)
        except ApiError as err:
            await emulator.close()
            raise UserError(f"link config: {err.message}") from None
    runner = web.AppRunner(build_app(emulator), access_log=None, handle_signals=False)
    await runner.setup()
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        await runner.cleanup()
        await emulator.close()
        raise UserError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    site = web.SockSite(runner, sock)
    await site.start()
    emulator.start_sampling()
    return LinkServer(emulator, runner, host, sock.getsockname()[1])


async def serve(
    host: str, port: int, *, seed: int | None, config: str | None, ready_file: str | None = None
) -> None:
    """Run until SIGINT/SIGTERM (the `testbed link serve` command)."""
    proxies = load_config(config) if config else None
    server = await start_link_server(host, port, seed=seed, config=proxies)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    print(f"link emulator API on {server.url}", flush=True)
    if ready_file:
        Path(ready_file).write_text(f"{server.port}\n")
    try:
        await stop.wait()
    finally:
        await server.close()
