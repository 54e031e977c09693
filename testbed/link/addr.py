"""`host:port` strings as Toxiproxy writes them ("127.0.0.1:8474", "[::1]:0", "localhost:22220").

Proxies are configured with these strings and report their real listen address back the same way
(port 0 is replaced by the port the kernel picked), so parsing and formatting live together.
"""

from __future__ import annotations

from testbed.link.errors import ApiError, show

__all__ = ["format_hostport", "parse_hostport"]


def parse_hostport(value: str, field: str, *, default_host: str = "127.0.0.1") -> tuple[str, int]:
    """Split "host:port" (IPv6 in brackets); an empty host becomes `default_host`.

    Raises a 400 ApiError naming `field` when the string cannot be read.
    """
    if not isinstance(value, str) or ":" not in value:
        raise ApiError(f"{field}: expected host:port, got {show(value)}", 400)
    host, _, port_s = value.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ApiError(f"{field}: write IPv6 addresses in brackets, e.g. [::1]:8080", 400)
    # Plain ASCII digits only: int() would also take "+8", " 8", "8_0" and other scripts' digits.
    if not (port_s.isascii() and port_s.isdigit()):
        raise ApiError(f"{field}: port {show(port_s)} is not a number", 400)
    port = int(port_s) if len(port_s) <= 5 else 65536
    if not 0 <= port <= 65535:
        raise ApiError(f"{field}: port {show(port_s)} is out of range", 400)
    return (host or default_host), port


def format_hostport(host: str, port: int) -> str:
    if ":" in host:
        return f"[{host}]:{port}"
    return f"{host}:{port}"
