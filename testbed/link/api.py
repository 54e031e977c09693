"""The Toxiproxy 2.x HTTP API over a LinkEmulator (aiohttp).

Routes, methods, status codes and error bodies follow Toxiproxy's api.go: JSON everywhere,
`{"error": msg, "status": code}` on failure, 201 for a created proxy, 200 for a created toxic,
204 for deletes and reset, POST and PATCH both update. Handlers only decode and render; the
emulator does the work and raises ApiError for anything the caller got wrong.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from testbed import __version__
from testbed.link.emulator import TOXIPROXY_VERSION, LinkEmulator
from testbed.link.errors import ApiError, bad_request
from testbed.link.jsonbody import JsonBodyError, decode
from testbed.serving import REFUSE_BROWSERS
from testbed.serving.bad_requests import parse_error

__all__ = ["build_app"]

_log = logging.getLogger(__name__)
EMULATOR_KEY = web.AppKey("emulator", LinkEmulator)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _json(data: Any, status: int = 200) -> web.Response:
    return web.Response(
        text=json.dumps(data), status=status, content_type="application/json", charset="utf-8"
    )


def _error(err: ApiError) -> web.Response:
    return _json(err.to_json(), err.status)


async def _body(request: web.Request, *, optional: bool = False) -> Any:
    raw = await request.read()
    if not raw.strip():
        if optional:
            return None
        raise bad_request("EOF")
    try:
        return decode(raw)
    except JsonBodyError as exc:
        raise bad_request(str(exc)) from None


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except ApiError as err:
        return _error(err)
    except web.HTTPException as exc:
        if exc.status >= 400:
            return _error(ApiError(exc.reason, exc.status))
        raise
    except ConnectionError:
        t = request.transport
        if t is None or t.is_closing():
            raise  # the client went away mid-request: testbed.serving notes it in one line
        _log.exception("link API: %s %s failed", request.method, request.path)
        return _error(ApiError("internal error", 500))
    except Exception as exc:
        if parse_error(exc) is not None:
            raise  # a malformed body: testbed.serving answers it 400 in one line
        _log.exception("link API: %s %s failed", request.method, request.path)
        return _error(ApiError("internal error", 500))


def build_app(emulator: LinkEmulator) -> web.Application:
    """The aiohttp application serving the Toxiproxy API for `emulator`."""
    app = web.Application(middlewares=[_errors])
    app[EMULATOR_KEY] = emulator
    # Toxiproxy refuses any browser (User-Agent "Mozilla/..."), so a web page cannot drive the
    # API; testbed.serving applies that rule, with its cross-site guard, before any handler.
    app[REFUSE_BROWSERS] = True
    em = emulator

    async def proxy_index(request: web.Request) -> web.Response:
        return _json(em.list_json())

    async def proxy_create(request: web.Request) -> web.Response:
        return _json(await em.create_proxy(await _body(request)), 201)

    async def populate(request: web.Request) -> web.Response:
        try:
            proxies = await em.populate(await _body(request))
        except ApiError as err:
            return _json({**err.to_json(), "proxies": None}, err.status)
        return _json({"proxies": proxies}, 201)

    async def proxy_show(request: web.Request) -> web.Response:
        return _json(em.get_proxy(request.match_info["proxy"]).to_json())

    async def proxy_update(request: web.Request) -> web.Response:
        name = request.match_info["proxy"]
        em.get_proxy(name)  # 404 before 400, as Toxiproxy
        return _json(await em.update_proxy(name, await _body(request)))

    async def proxy_delete(request: web.Request) -> web.Response:
        await em.delete_proxy(request.match_info["proxy"])
        return web.Response(status=204)

    async def toxic_index(request: web.Request) -> web.Response:
        return _json(em.toxics_json(request.match_info["proxy"]))

    async def toxic_create(request: web.Request) -> web.Response:
        name = request.match_info["proxy"]
        em.get_proxy(name)
        return _json(await em.add_toxic(name, await _body(request)))

    async def toxic_show(request: web.Request) -> web.Response:
        m = request.match_info
        return _json(em.get_toxic(m["proxy"], m["toxic"]).to_json())

    async def toxic_update(request: web.Request) -> web.Response:
        m = request.match_info
        em.get_toxic(m["proxy"], m["toxic"])
        return _json(await em.update_toxic(m["proxy"], m["toxic"], await _body(request)))

    async def toxic_delete(request: web.Request) -> web.Response:
        m = request.match_info
        await em.remove_toxic(m["proxy"], m["toxic"])
        return web.Response(status=204)

    async def reset(request: web.Request) -> web.Response:
        await em.reset(await _body(request, optional=True))
        return web.Response(status=204)

    async def version(request: web.Request) -> web.Response:
        body = json.dumps({"version": TOXIPROXY_VERSION, "testbed": __version__}) + "\n"
        return web.Response(text=body, content_type="application/json", charset="utf-8", status=200)

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(
            text=em.metrics_text(), content_type="text/plain", charset="utf-8", status=200
        )

    r = app.router
    r.add_post("/reset", reset)
    r.add_get("/proxies", proxy_index)
    r.add_post("/proxies", proxy_create)
    r.add_post("/populate", populate)
    r.add_get("/proxies/{proxy}", proxy_show)
    r.add_post("/proxies/{proxy}", proxy_update)
    r.add_patch("/proxies/{proxy}", proxy_update)
    r.add_delete("/proxies/{proxy}", proxy_delete)
    r.add_get("/proxies/{proxy}/toxics", toxic_index)
    r.add_post("/proxies/{proxy}/toxics", toxic_create)
    r.add_get("/proxies/{proxy}/toxics/{toxic}", toxic_show)
    r.add_post("/proxies/{proxy}/toxics/{toxic}", toxic_update)
    r.add_patch("/proxies/{proxy}/toxics/{toxic}", toxic_update)
    r.add_delete("/proxies/{proxy}/toxics/{toxic}", toxic_delete)
    r.add_get("/version", version)
    r.add_get("/metrics", metrics)
    return app
