"""The prefill worker with the tiny real model (`engine: torch`): same HTTP API and statistics as
services/prefill.py, but the KV it streams is the model's real tensors, layer by layer.

`POST /prefill` takes the prompt's token ids (`tokens`, sent by the router) besides the usual
id and KV address. The transfer is sized with the real layer sizes (TinyConfig.layer_sizes, 1:1
bytes, no byte_scale), `TorchPrefillEngine.run` computes each layer on a one-thread executor (so
the event loop keeps streaming the layers already done, and serving /stats) and hands each
serialized layer to the transfer as soon as it is final. The answer, sent once the KV is
acknowledged, carries `first_token_id`: the first output token, computed here from the last
prompt position, travels on the control path (router -> decode), never inside the KV.

Kept apart from prefill.py so the emulated worker (and the features being added to it) stay
untouched; torch is imported only in `create_app`, so importing this module needs no torch.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from aiohttp import web

from testbed.clock import LiveClock
from testbed.engine.torch.live import tiny_config
from testbed.engine.torch.pacing import CpuPacer, ProfileBudget
from testbed.profiles import MODELS
from testbed.services.kv_targets import targets_handler
from testbed.services.prefill_queue import PrefillQueue
from testbed.services.spec import ServiceSpec
from testbed.services.validate import (
    BadRequest,
    health,
    int_field,
    json_body,
    json_errors,
    str_field,
)
from testbed.transfer.errors import TransferError

if TYPE_CHECKING:
    from testbed.engine.torch.engine import TorchPrefillEngine

__all__ = ["create_app"]

MAX_PROMPT_TOKENS = 1 << 16
"""Refused before torch sees it; the model's own context (4096) is checked by the engine."""


@dataclass
class TorchPrefillJob:
    id: str
    tokens: list[int]
    target: tuple[str, int]
    result: asyncio.Future[dict[str, Any]]
    times: dict[str, float] = field(default_factory=dict)
    first_token: int | None = None


class TorchPrefillState(PrefillQueue[TorchPrefillJob]):
    """One instance: a FIFO of prefills on one model, KV senders per decode address."""

    def __init__(self, spec: ServiceSpec, engine: TorchPrefillEngine) -> None:
        super().__init__(spec)
        self.engine = engine
        self.config = engine.model.config

    def job_tokens(self, job: TorchPrefillJob) -> int:
        return len(job.tokens)

    async def prefill(self, job: TorchPrefillJob) -> None:
        sizes = self.config.layer_sizes(0, len(job.tokens))
        layers: asyncio.Queue[tuple[int, bytes] | None] = asyncio.Queue()
        job.times["prefill_start"] = self.clock.now()
        self.track(job, self._transfer(job, sizes, layers))

        async def on_layer(layer: int, data: bytes) -> None:
            layers.put_nowait((layer, data))

        try:
            result = await self.engine.run(job.tokens, on_layer)
            job.first_token = result.first_token
            job.times["prefill_end"] = self.clock.now()
        finally:
            layers.put_nowait(None)  # after first_token: the transfer reads it at the sentinel

    async def _transfer(
        self,
        job: TorchPrefillJob,
        sizes: list[int],
        layers: asyncio.Queue[tuple[int, bytes] | None],
    ) -> None:
        sent = 0
        try:
            sender = await self.sender(job.target)
            async with sender.open(job.id, sizes) as tx:
                while (item := await layers.get()) is not None:
                    layer, data = item
                    if "transfer_start" not in job.times:
                        job.times["transfer_start"] = self.clock.now()
                    await tx.send_layer(layer, data)
                    sent += len(data)
                if job.first_token is None:  # the prefill broke: abort, never half a KV
                    raise RuntimeError("prefill did not finish")
            job.times["transfer_end"] = self.clock.now()
            self._complete(job, kv_wire_bytes_sent=sent, first_token_id=job.first_token)
        except (TransferError, OSError, TimeoutError, RuntimeError) as exc:  # others: track()
            reason = exc.reason if isinstance(exc, TransferError) else repr(exc)
            self._fail(job, f"kv transfer: {reason}", kv_wire_bytes_sent=sent)


STATE = web.AppKey("state", TorchPrefillState)


def _token_ids(body: dict[str, Any], vocab: int) -> list[int]:
    tokens = body.get("tokens")
    if not isinstance(tokens, list) or not 1 <= len(tokens) <= MAX_PROMPT_TOKENS:
        raise BadRequest("tokens must be a non-empty list of token ids (engine: torch)")
    if not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab for t in tokens):
        raise BadRequest(f"token ids must be integers in 0..{vocab - 1}")
    return tokens


async def _prefill(request: web.Request) -> web.Response:
    state = request.app[STATE]
    body = await json_body(request)
    rid = str_field(body, "id", 64)
    tokens = _token_ids(body, state.config.vocab_size)
    target = (str_field(body, "kv_host", 255), int_field(body, "kv_port", 1, 65535))
    state.targets.check(target)
    job = TorchPrefillJob(rid, tokens, target, asyncio.get_running_loop().create_future())
    result = await state.run_job(job)
    return web.json_response(result, status=200 if "error" not in result else 502)


async def _stats(request: web.Request) -> web.Response:
    state = request.app[STATE]
    pacer = state.engine.pacer
    return web.json_response(
        {
            **state.queue_stats(),
            "engine_kind": "torch",
            "engine": pacer.stats() if pacer is not None else {},
        }
    )


def build_engine(spec: ServiceSpec, executor: ThreadPoolExecutor) -> TorchPrefillEngine:
    """The instance's model, paced to the spec's profile on its hardware / time_scale."""
    import torch

    from testbed.engine.torch.engine import TorchPrefillEngine
    from testbed.engine.torch.model import TinyHybridLM

    # The tiny model is per-op overhead: extra intra-op threads only spin against the event
    # loop for the same cores. This process is ours, so it is set here, never at import.
    torch.set_num_threads(1)
    model = TinyHybridLM(tiny_config(spec.model_seed, spec.model_dtype))
    budget = ProfileBudget(MODELS[spec.model], spec.hardware, spec.hardware, model.config.n_layers)
    return TorchPrefillEngine(
        model, pacer=CpuPacer(LiveClock.of(spec)), budget=budget, executor=executor
    )


async def create_app(spec: ServiceSpec) -> tuple[web.Application, dict[str, int]]:
    executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"torch-{spec.id}")
    state = TorchPrefillState(spec, build_engine(spec, executor))
    app = web.Application(client_max_size=4 << 20, middlewares=[json_errors])
    app[STATE] = state
    app.router.add_post("/prefill", _prefill)
    app.router.add_post("/targets", targets_handler(STATE))
    app.router.add_get("/stats", _stats)
    app.router.add_get("/health", health)
    worker = asyncio.get_running_loop().create_task(state.worker())

    async def _shutdown(_app: web.Application) -> None:
        await state.aclose(worker)
        executor.shutdown(wait=False, cancel_futures=True)

    app.on_cleanup.append(_shutdown)
    return app, {}
