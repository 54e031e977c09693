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
import logging
import resource
import signal
import socket
from pathlib import Path
from types import TracebackType

from testbed.errors import UserError
from testbed.link.api import build_app
from testbed.link.emulator import LinkEmulator
from testbed.link.errors import ApiError
from testbed.link.jsonbody import JsonBodyError, decode
from testbed.serving import DEFAULT_LIMITS, HttpServer, ServingLimits, start_http

__all__ = ["LinkServer", "serve", "start_link_server"]

_log = logging.getLogger(__name__)
DEFAULT_PORT = 8474


class LinkServer:
    """A running emulator: its API address, its state, and `close()`."""

    def __init__(self, emulator: LinkEmulator, http: HttpServer, host: str, port: int):
        self.emulator = emulator
        self.http = http  # the API's HTTP server: its connection counts
        self.host = host
        self.port = port

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    async def close(self) -> None:
        """Stop the API and every proxy (open connections are closed)."""
        await self.http.close()
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
        data = decode(Path(path).read_bytes())
    except OSError as exc:
        raise UserError(f"cannot read link config {path}: {exc.strerror or exc}") from None
    except JsonBodyError as exc:
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
    limits: ServingLimits = DEFAULT_LIMITS,
    listen_netns: str | None = None,
) -> LinkServer:
    """Start the emulator's API (port 0 picks a free port) in the running event loop.

    `limits` bounds how the API's clients may read it (testbed.serving): connections, and
    deadlines for a request's head and body. `listen_netns`: every proxy listens inside that
    network namespace (testbed.link.emulator.LinkEmulator).
    """
    emulator = LinkEmulator(seed=seed, listen_netns=listen_netns)
    if config:
        try:
            await emulator.populate(config)
        except ApiError as err:
            await emulator.close()
            raise UserError(f"link config: {err.message}") from None
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        await emulator.close()
        raise UserError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    try:
        http = await start_http(build_app(emulator), sock=sock, limits=limits, name="link API")
    except BaseException:
        sock.close()
        await emulator.close()
        raise
    emulator.start_sampling()
    return LinkServer(emulator, http, host, sock.getsockname()[1])


async def serve(
    host: str,
    port: int,
    *,
    seed: int | None,
    config: str | None,
    ready_file: str | None = None,
    limits: ServingLimits = DEFAULT_LIMITS,
    listen_netns: str | None = None,
) -> None:
    """Run until SIGINT/SIGTERM (the `testbed link serve` command).

    The process's soft descriptor limit is raised to its hard limit first, as the Go runtime
    does for Toxiproxy: a soft limit of 1024 is a few hundred connections."""
    _raise_descriptor_limit()
    proxies = load_config(config) if config else None
    server = await start_link_server(
        host, port, seed=seed, config=proxies, limits=limits, listen_netns=listen_netns
    )
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


def _raise_descriptor_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
