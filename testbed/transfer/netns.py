"""Sockets inside another network namespace, from a process that stays in its own.

Kernel link shaping (testbed.link.tc, `shaper: tc`) puts the cross-datacenter path on a veth
pair between two namespaces. Rather than moving whole services into a namespace (their HTTP API
would vanish from the host's loopback), only the sockets that cross the link are created there:
a socket belongs to the namespace it was created in, whatever thread uses it afterwards. So a
PrfaaS prefill worker opens its KV connections in the PrfaaS-side namespace and the link
emulator binds its proxies in the local side, each process keeping everything else where it is.

setns() switches only the calling thread, so the socket is made on a short-lived helper thread
that ends right after: nothing else of the process ever runs in the other namespace. Needs
CAP_SYS_ADMIN (root), like the namespaces themselves.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import os
import socket
import threading

__all__ = ["NETNS_DIR", "open_connection_in", "socket_in_namespace"]

NETNS_DIR = "/var/run/netns"
"""Where `ip netns add` pins the namespaces it names."""
CLONE_NEWNET = 0x40000000
HELPER_TIMEOUT_S = 10.0


def socket_in_namespace(
    ns: str, kind: int = socket.SOCK_STREAM, family: int = socket.AF_INET
) -> socket.socket:
    """A new socket that lives in network namespace `ns` (a name under /var/run/netns).

    Raises OSError (with the namespace's name) when the namespace is missing or setns fails.
    """
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    result: list[socket.socket] = []
    errors: list[BaseException] = []

    def work() -> None:
        try:
            target = os.open(os.path.join(NETNS_DIR, ns), os.O_RDONLY)
            try:
                if libc.setns(target, CLONE_NEWNET) != 0:
                    err = ctypes.get_errno()
                    raise OSError(err, f"setns({ns}): {os.strerror(err)}")
                result.append(socket.socket(family, kind))
            finally:
                os.close(target)
        except BaseException as exc:  # handed to the caller's thread
            errors.append(exc)

    t = threading.Thread(target=work, name=f"netns-{ns}", daemon=True)
    t.start()
    t.join(HELPER_TIMEOUT_S)
    if errors:
        err = errors[0]
        if isinstance(err, OSError):
            raise OSError(err.errno, f"cannot open a socket in namespace {ns}: {err}")
        raise OSError(f"cannot open a socket in namespace {ns}: {err!r}")
    if not result:
        raise OSError(f"cannot open a socket in namespace {ns}: timed out")
    return result[0]


async def open_connection_in(
    ns: str, host: str, port: int, *, limit: int = 1 << 16
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """`asyncio.open_connection(host, port)` from a socket in namespace `ns` (IPv4 `host`)."""
    loop = asyncio.get_running_loop()
    sock = await asyncio.to_thread(socket_in_namespace, ns)
    try:
        sock.setblocking(False)
        await loop.sock_connect(sock, (host, port))
    except BaseException:
        sock.close()
        raise
    return await asyncio.open_connection(sock=sock, limit=limit)
