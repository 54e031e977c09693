"""The router's retries without live processes: its calls to the instances are a fake
(services.router.workers.Workers) that fails on cue. What is checked is the dispatcher's
reaction: which instance it marks down, what the next attempt avoids, that tokens are not
streamed twice, and how long it waits when nothing can take a request."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Iterable
from typing import Any

import pytest

from testbed.services.router.dispatch import MAX_ATTEMPTS, RouterState
from testbed.services.router.errors import AttemptError
from testbed.services.spec import InstanceInfo, ServiceSpec

T = 1000.0
"""The static threshold: longer prompts go to PrfaaS."""


def _instances() -> list[InstanceInfo]:
    pre = [("px", "prfaas"), ("pl0", "local"), ("pl1", "local")]
    return [
        *(InstanceInfo(id=i, cluster=c, role="prefill", url=f"http://{i}") for i, c in pre),  # type: ignore[arg-type]
        *(
            InstanceInfo(
                id=d,
                cluster="local",
                role="decode",
                url=f"http://{d}",
                kv_host="127.0.0.1",
                kv_port=7000 + n,
                kv_link_host="127.0.0.2",
                kv_link_port=7100 + n,
            )
            for n, d in enumerate(("d0", "d1"))
        ),
    ]


class FakeWorkers:
    """Instances that behave as told: per instance, a list of outcomes used one per call
    ("ok" when the list runs out)."""

    def __init__(self) -> None:
        self.prefill_plan: dict[str, list[str]] = {}
        self.decode_plan: dict[str, list[str]] = {}
        self.prefills: list[str] = []
        self.decodes: list[str] = []
        self.cancelled: list[str] = []
        self.back: set[str] = set()
        """Instances whose /health answers."""
        self._kv: dict[str, asyncio.Event] = {}

    def _next(self, plan: dict[str, list[str]], iid: str) -> str:
        todo = plan.get(iid, [])
        return todo.pop(0) if todo else "ok"

    def _sent(self, wire_id: str) -> asyncio.Event:
        return self._kv.setdefault(wire_id, asyncio.Event())

    async def prefill(
        self, inst: InstanceInfo, body: dict[str, Any], instances: Iterable[InstanceInfo]
    ) -> tuple[int, dict[str, Any]]:
        self.prefills.append(inst.id)
        how = self._next(self.prefill_plan, inst.id)
        if how == "unreachable":
            raise AttemptError(f"prefill on {inst.id} unreachable (ClientError)", dead=inst.id)
        if how == "error":
            return 502, {"error": "kv transfer: boom", "kv_wire_bytes_sent": 7}
        self._sent(body["id"]).set()
        return 200, {"prefill_start": 1.0, "prefill_end": 2.0, "kv_wire_bytes_sent": 10}

    async def decode(
        self, inst: InstanceInfo, body: dict[str, Any]
    ) -> AsyncGenerator[dict[str, Any], None]:
        self.decodes.append(inst.id)
        how = self._next(self.decode_plan, inst.id)
        if how == "dead":  # refused before registering: as a connection error would be
            raise AttemptError(f"decode on {inst.id} lost (ClientConnectorError)", dead=inst.id)
        yield {"expecting": True}
        await self._sent(body["id"]).wait()
        yield {"admitted": True, "kv_verified": True, "kv_wire_bytes": 10}
        n = body["output_tokens"]
        if how == "lost":  # three tokens, then the stream breaks
            yield {"tokens": 3}
            raise AttemptError(f"decode on {inst.id} lost (ServerDisconnectedError)", dead=inst.id)
        yield {"tokens": n}
        yield {
            "done": True,
            "tokens": n,
            "first_token": 3.0,
            "last_token": 4.0,
            "kv_wire_bytes": 10,
            "kv_verified": True,
        }

    async def first_token(self, inst: InstanceInfo, wire_id: str, token: Any) -> bool:
        return True

    async def cancel_decode(self, inst: InstanceInfo, wire_id: str) -> None:
        self.cancelled.append(inst.id)

    async def pull_prefix(self, **kw: Any) -> Any:
        raise AssertionError("no prefix cache in these tests")

    async def stats(self, inst: InstanceInfo) -> dict[str, Any] | None:
        return None

    async def healthy(self, inst: InstanceInfo) -> bool:
        return inst.id in self.back

    async def post_role(self, base_url: str, role: str, wait_s: float) -> dict[str, Any] | None:
        return None


@pytest.fixture
async def router() -> tuple[RouterState, FakeWorkers]:
    spec = ServiceSpec(
        role="router", id="r", policy="prfaas-static", threshold_tokens=T, instances=_instances()
    )
    workers = FakeWorkers()
    state = RouterState(spec, workers)
    await state.open()
    return state, workers


class Sink:
    def __init__(self) -> None:
        self.tokens: list[int] = []

    async def __call__(self, n: int) -> None:
        self.tokens.append(n)


async def _handle(state: RouterState, input_tokens: int, output: int = 8) -> tuple[Any, Sink]:
    sink = Sink()
    async with asyncio.timeout(30):  # a hang is the bug: bounded, not a speed claim
        rec = await state.handle(f"r{len(state.records)}", input_tokens, output, sink)
    return rec, sink


async def test_an_unreachable_prefill_is_marked_down_and_avoided(
    router: tuple[RouterState, FakeWorkers],
) -> None:
    state, workers = router
    workers.prefill_plan["pl0"] = ["unreachable"]
    rec, sink = await _handle(state, 500)
    assert rec.status == "completed", rec.failure_reason
    assert workers.prefills == ["pl0", "pl1"]
    assert rec.retries == 1 and rec.prefill_instance == "pl1"
    assert state.healthy["pl0"] is False and state.healthy["pl1"] is True
    assert workers.cancelled == ["d0"]  # the first attempt's decode stream was withdrawn
    assert sum(sink.tokens) == 8
    assert all(v == 0 for v in state.outstanding.values())  # the accounting came back to 0
    assert all(v == 0 for v in state.work.values())


async def test_a_broken_cross_datacenter_transfer_retries_locally_and_blames_no_one(
    router: tuple[RouterState, FakeWorkers],
) -> None:
    state, workers = router
    workers.prefill_plan["px"] = ["error"]
    rec, _ = await _handle(state, 5000)
    assert rec.status == "completed", rec.failure_reason
    assert workers.prefills == ["px", "pl0"]
    assert rec.route == "local" and not rec.cross_dc and rec.retries == 1
    assert all(state.healthy.values())  # a link failure takes no instance out of rotation


async def test_a_local_prefill_error_avoids_that_decode_on_the_next_attempt(
    router: tuple[RouterState, FakeWorkers],
) -> None:
    state, workers = router
    workers.prefill_plan["pl0"] = ["error"]
    rec, _ = await _handle(state, 500)
    assert rec.status == "completed", rec.failure_reason
    assert workers.decodes == ["d0", "d1"]  # the decode was the suspect: the next one is used
    assert workers.prefills == ["pl0", "pl0"]  # the prefill was not blamed
    assert all(state.healthy.values())


async def test_tokens_are_not_streamed_twice_when_a_decode_dies_midway(
    router: tuple[RouterState, FakeWorkers],
) -> None:
    state, workers = router
    workers.decode_plan["d0"] = ["lost"]
    rec, sink = await _handle(state, 500, output=8)
    assert rec.status == "completed", rec.failure_reason
    assert sink.tokens == [3, 5]  # 3 from the first decode, the rest from the second
    assert rec.tokens_out == 8 and rec.decode_instance == "d1"
    assert state.healthy["d0"] is False


async def test_after_max_attempts_the_request_fails_with_every_reason(
    router: tuple[RouterState, FakeWorkers],
) -> None:
    state, workers = router
    for p in ("px", "pl0", "pl1"):
        workers.prefill_plan[p] = ["unreachable"]
    rec, sink = await _handle(state, 500)
    assert rec.status == "failed" and rec.retries == MAX_ATTEMPTS
    reasons = rec.failure_reason.split("; then ")
    assert reasons == [f"prefill on {p} unreachable (ClientError)" for p in ("pl0", "pl1", "px")]
    assert not any(state.healthy[p] for p in ("px", "pl0", "pl1"))
    assert sink.tokens == []


async def test_with_no_instance_left_the_request_waits_then_fails(
    router: tuple[RouterState, FakeWorkers],
) -> None:
    state, workers = router
    state.no_route_wait_s, state.health_interval_s = 0.2, 0.05
    state.mark_down("d0")
    state.mark_down("d1")
    rec, _ = await _handle(state, 500)
    assert rec.status == "failed"
    assert rec.failure_reason == "no route: no decode instance in cluster 'local'"
    assert workers.prefills == [] and workers.decodes == []


async def test_an_instance_back_in_rotation_is_no_longer_avoided(
    router: tuple[RouterState, FakeWorkers],
) -> None:
    state, workers = router
    state.no_route_wait_s, state.health_interval_s = 5.0, 0.05
    state.mark_down("d1")
    workers.decode_plan["d0"] = ["dead"]
    workers.back.add("d0")  # it answers /health again (a restarted worker)
    watcher = asyncio.create_task(state.watch_health())
    try:
        rec, _ = await _handle(state, 500)
    finally:
        watcher.cancel()
    assert rec.status == "completed", rec.failure_reason
    # d0 failed the first attempt (marked down, excluded), came back while the second attempt
    # waited for a route, and took it: the exclusion ends once the instance is healthy again
    assert workers.decodes == ["d0", "d0"]
    assert rec.retries == 1 and state.healthy["d0"] is True and state.healthy["d1"] is False
