"""The browser guard: refuse what a web page could make a browser send to a testbed server.

Any page a developer opens can make their browser POST to 127.0.0.1: an HTML form or a no-cors
`fetch` needs no preflight if its body is text/plain, form-encoded or multipart, so a page could
drive the router or a worker (a `text/plain` body is parsed as JSON all the same). None of the
testbed's servers has a web UI, so the rule (`browser_refusal`, applied by testbed.serving to
every server it starts) refuses what only a browser sends, and never what the testbed's own
clients send: aiohttp, the OpenAI client, AIPerf, the real routers and `curl -d` (form-encoded!)
send neither `Origin` nor `Sec-Fetch-*`. Not covered: a GET, which a page can send but whose
answer it cannot read (no server here answers CORS); a GET with effects is the handler's to
guard.
"""

from __future__ import annotations

import ipaddress

import yarl
from aiohttp import web

__all__ = ["REFUSE_BROWSERS", "browser_refusal"]

REFUSE_BROWSERS = web.AppKey("refuse_browsers", bool)
"""Set True on an app to refuse every request from a browser's User-Agent, any method
(Toxiproxy's own CSRF guard, which the link API keeps for compatibility)."""

_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
# Content types a page may POST cross-site without a CORS preflight (an HTML form, a no-cors
# fetch); any other type is preflighted, and no server here answers a preflight.
_SIMPLE_TYPES = frozenset(
    {"text/plain", "application/x-www-form-urlencoded", "multipart/form-data", ""}
)


def browser_refusal(request: web.BaseRequest, *, strict: bool = False) -> str | None:
    """Why `request` is refused as one a web page could have made a browser send, or None.

    A request whose method is not GET, HEAD or OPTIONS is refused when
    - `Sec-Fetch-Site` is there and is neither `same-origin` nor `none` (every current browser
      sends it; `same-site` is refused too: another port of localhost is the same site); or
    - `Origin` is there and is not this server's own: `http://` + the request's Host, whose
      host is an IP address or `localhost` (a DNS-rebinding page is same-origin to the browser
      but has a name); `Origin: null` is refused; or
    - `Origin` or a `Sec-Fetch-*` header is there and the body is of a type a page may post
      cross-site without a preflight (text/plain, form-urlencoded, multipart, none).
    `strict` (REFUSE_BROWSERS) refuses any request whose User-Agent starts with `Mozilla/`.
    """
    headers = request.headers
    if strict and headers.get("User-Agent", "").startswith("Mozilla/"):
        return "User agent not allowed"
    if request.method in _SAFE_METHODS:
        return None
    site = headers.get("Sec-Fetch-Site")
    if site is not None and site.lower() not in ("same-origin", "none"):
        return f"cross-site request refused (Sec-Fetch-Site: {site[:40]})"
    origin = headers.get("Origin")
    if origin is not None and not _own_origin(origin, request):
        return f"cross-origin request refused (Origin: {origin[:80]})"
    fetched = origin is not None or any(k.lower().startswith("sec-fetch-") for k in headers)
    ctype = headers.get("Content-Type", "").split(";")[0].strip().lower()
    if fetched and ctype in _SIMPLE_TYPES:
        return f"a browser's {ctype or 'untyped'} body is refused; send JSON"
    return None


def _own_origin(origin: str, request: web.BaseRequest) -> bool:
    try:
        theirs, ours = yarl.URL(origin), yarl.URL(f"{request.scheme}://{request.host}")
        if theirs.scheme != request.scheme or theirs.path not in ("", "/") or not ours.host:
            return False
        if (theirs.host or "").lower() != ours.host.lower() or theirs.port != ours.port:
            return False
        return ours.host.lower() == "localhost" or ipaddress.ip_address(ours.host) is not None
    except ValueError:
        return False
