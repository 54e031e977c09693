"""The router-facing API's routes on a prefill or a decode worker's app, by flavour
(ServiceSpec.facade): the halves (`POST /v1/completions`, `/v1/chat/completions`), the bootstrap
route on a prefill (facade.rooms), the journal (`GET /facade/attempts`) and the registration,
load and render routes (facade.info). Only the prefill half and the meeting differ between the
flavours; the rest is one code path.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import aiohttp
from aiohttp import web

from testbed.services.decoding import DecodeState
from testbed.services.facade.decode_half import FACADE as DECODE_FACADE
from testbed.services.facade.decode_half import DecodeFacade, decode_half
from testbed.services.facade.info import Load, add_info_routes
from testbed.services.facade.journal import AttemptJournal, attempts_handler
from testbed.services.facade.openai import sglang_meeting, vllm_decode_meeting
from testbed.services.facade.rooms import FACADE, PrefillFacade, Rooms, bootstrap
from testbed.services.facade.sglang_prefill import prefill_half as sglang_prefill_half
from testbed.services.facade.text import check_engine, codec
from testbed.services.facade.vllm_prefill import prefill_half as vllm_prefill_half
from testbed.services.kv_expect import EXPECT_GRACE_S
from testbed.services.prefilling import PrefillState

__all__ = ["add_decode_routes", "add_prefill_routes"]

Half = Callable[[web.Request, bool], Awaitable[web.StreamResponse]]


def _halves(app: web.Application, half: Half) -> None:
    async def completions(request: web.Request) -> web.StreamResponse:
        return await half(request, False)

    async def chat(request: web.Request) -> web.StreamResponse:
        return await half(request, True)

    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", chat)


def _common(
    app: web.Application, journal: AttemptJournal, mode: str, model: str, load: Load, flavour: str
) -> None:
    app.router.add_get("/facade/attempts", attempts_handler(journal))
    add_info_routes(app, mode=mode, model=model, load=load, flavour=flavour)
    codec()  # load the tokenizer now, not on the first request


def add_prefill_routes(app: web.Application, state: PrefillState) -> PrefillFacade:
    """The flavour's routes on a prefill worker's app."""
    spec = state.spec
    check_engine(spec)
    assert spec.facade is not None
    vllm = spec.facade == "vllm"
    fac = PrefillFacade(
        state,
        Rooms(spec.kv_timeout_s + EXPECT_GRACE_S),
        {d.id: d for d in spec.facade_decodes},
        opens_rooms=not vllm,
    )
    app[FACADE] = fac

    def load() -> tuple[int, int, int]:
        return (1 if state.running else 0), state.queue.qsize(), state.queued_tokens

    _halves(app, vllm_prefill_half if vllm else sglang_prefill_half)
    app.router.add_post("/bootstrap/{room}", bootstrap)
    _common(app, fac.journal, "prefill", spec.model, load, spec.facade)
    return fac


async def add_decode_routes(app: web.Application, state: DecodeState) -> DecodeFacade:
    """The flavour's routes on a decode worker's app."""
    spec = state.spec
    check_engine(spec)
    assert spec.facade is not None
    meeting = vllm_decode_meeting if spec.facade == "vllm" else sglang_meeting
    connector = aiohttp.TCPConnector(limit=0)
    fac = DecodeFacade(state, aiohttp.ClientSession(connector=connector), meeting)
    app[DECODE_FACADE] = fac

    def load() -> tuple[int, int, int]:
        return state.engine.active(), state.engine.waiting() + state.waiting_kv, 0

    async def close(_app: web.Application) -> None:
        await fac.session.close()

    app.on_cleanup.append(close)
    _halves(app, decode_half)
    _common(app, fac.journal, "decode", spec.model, load, spec.facade)
    return fac
