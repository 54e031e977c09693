"""What a router asks a worker when it registers it, and the load it polls.

sglang-router 0.3.2 asks `GET /health`, `/server_info` and `/model_info` of every worker
(tests/services/facade/fixtures/sglang-router-0.3.2/round_robin.json) and loads its tokenizer
from `model_path`: ours point at the shipped tokenizer. vllm-router 0.1.17 asks `GET /health`,
then `GET /metrics` once, counting the `engine` labels of its `vllm:` lines (the workers'
/metrics, services.exposition, carry `engine="0"`: one engine), and its cache_aware policy
renders every request on every worker (facade.render; the routes are served in both flavours).
`GET /get_load` is in the shape each flavour's power_of_two load monitor reads: SGLang's a
list with one entry per data-parallel rank, `num_tokens` the load; vllm-router's `{"load": N}`,
polled every second, N the requests running and waiting. Ours count the instance's outstanding
work. /v1/models is answered too (smg asks it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from aiohttp import web

from testbed.services.facade.render import add_render_routes
from testbed.services.facade.text import tokenizer_dir

__all__ = ["Load", "add_info_routes"]

Load = Callable[[], tuple[int, int, int]]
"""(requests running, requests waiting, tokens outstanding) of the instance now."""


def add_info_routes(
    app: web.Application, *, mode: str, model: str, load: Load, flavour: str
) -> None:
    """The registration routes of a `mode` ("prefill" or "decode") worker of a `flavour`."""
    path = str(tokenizer_dir())
    info = {
        "model_path": path,
        "tokenizer_path": path,
        "served_model_name": model,
        "disaggregation_mode": mode,
        "dp_size": 1,
        "is_generation": True,
        "version": "prfaas-testbed",
    }

    async def server_info(_request: web.Request) -> web.Response:
        return web.json_response(info)

    async def model_info(_request: web.Request) -> web.Response:
        return web.json_response(
            {"model_path": path, "tokenizer_path": path, "is_generation": True}
        )

    async def models(_request: web.Request) -> web.Response:
        card = {"id": model, "object": "model", "created": 0, "owned_by": "prfaas-testbed"}
        return web.json_response({"object": "list", "data": [card]})

    async def get_load(_request: web.Request) -> web.Response:
        running, waiting, tokens = load()
        if flavour == "vllm":
            return web.json_response({"load": running + waiting})
        doc: dict[str, Any] = {
            "dp_rank": 0,
            "num_reqs": running + waiting,
            "num_waiting_reqs": waiting,
            "num_tokens": tokens,
        }
        return web.json_response([doc])

    for route, handler in (
        ("/server_info", server_info),
        ("/get_server_info", server_info),
        ("/model_info", model_info),
        ("/get_model_info", model_info),
        ("/v1/models", models),
        ("/get_load", get_load),
    ):
        app.router.add_get(route, handler)
    add_render_routes(app, model)
