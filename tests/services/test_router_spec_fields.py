"""What the router does with its ServiceSpec and InstanceInfo fields, in process: the policy and
the threshold pick the route, the instance table says where prefill and decode run and which
KV address (direct or through the link) a prefill is told, a switchable instance is reached at
its active role's mount, the scheduler and the prefix cache exist only when configured, and an
instance that never answers is given up on after `request_timeout_s`."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import AsyncGenerator, Iterable
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from testbed.config import DeploymentConfig, FixedLengths
from testbed.scheduler.spec import SchedulerSpec
from testbed.services.pd import DECODE_PREFIX
from testbed.services.router.dispatch import RouterState
from testbed.services.router.errors import AttemptError
from testbed.services.spec import InstanceInfo, ServiceSpec

pytestmark = pytest.mark.timeout(60)

INSTANCES = [
    InstanceInfo(id="px", cluster="prfaas", role="prefill", url="http://px"),
    InstanceInfo(id="pl", cluster="local", role="prefill", url="http://pl"),
    InstanceInfo(
        id="d0", cluster="local", role="decode", url="http://d0",
        kv_host="127.0.0.1", kv_port=7000, kv_link_host="127.0.0.2", kv_link_port=7100,
    ),
]  # fmt: skip


class Workers:
    """Instances that always succeed; records which prefill got which body."""

    def __init__(self) -> None:
        self.prefills: list[tuple[str, dict[str, Any]]] = []
        self.sent: defaultdict[str, asyncio.Event] = defaultdict(asyncio.Event)

    async def prefill(
        self, inst: InstanceInfo, body: dict[str, Any], instances: Iterable[InstanceInfo]
    ) -> tuple[int, dict[str, Any]]:
        self.prefills.append((inst.id, body))
        self.sent[body["id"]].set()
        return 200, {"prefill_start": 1.0, "prefill_end": 2.0, "kv_wire_bytes_sent": 10}

    async def decode(
        self, inst: InstanceInfo, body: dict[str, Any]
    ) -> AsyncGenerator[dict[str, Any], None]:
        yield {"expecting": True}
        await self.sent[body["id"]].wait()
        yield {"admitted": True, "kv_verified": True, "kv_wire_bytes": 10}
        n = body["output_tokens"]
        yield {"tokens": n}
        yield {"done": True, "tokens": n, "first_token": 3.0, "last_token": 4.0,
               "kv_wire_bytes": 10, "kv_verified": True}  # fmt: skip

    async def first_token(self, inst: InstanceInfo, wire_id: str, token: Any) -> bool:
        return True

    async def cancel_decode(self, inst: InstanceInfo, wire_id: str) -> None:
        return None

    async def pull_prefix(self, **kw: Any) -> Any:
        raise AssertionError("no prefix cache here")

    async def stats(self, inst: InstanceInfo) -> dict[str, Any] | None:
        return None

    async def healthy(self, inst: InstanceInfo) -> bool:
        return True

    async def post_role(self, base_url: str, role: str, wait_s: float) -> dict[str, Any] | None:
        return None


async def routes(policy: str, threshold: float | None, *lengths: int) -> list[tuple[str, Any]]:
    """(prefill instance, KV address it was told) of one request per prompt length."""
    spec = ServiceSpec(
        role="router", id="r", policy=policy, threshold_tokens=threshold, instances=INSTANCES
    )
    workers = Workers()
    state = RouterState(spec, workers)
    await state.open()

    async def sink(n: int) -> None:
        return None

    async with asyncio.timeout(30):  # a hang is the bug: bounded, not a speed claim
        for i, n in enumerate(lengths):
            rec = await state.handle(f"r{i}", n, 4, sink)
            assert rec.status == "completed", rec.failure_reason
            assert rec.decode_instance == "d0"
    return [(iid, (body["kv_host"], body["kv_port"])) for iid, body in workers.prefills]


LINK, DIRECT = ("127.0.0.2", 7100), ("127.0.0.1", 7000)


async def test_threshold_and_instance_table_pick_prefill_and_kv_address() -> None:
    assert await routes("prfaas-static", 1000, 5000, 500) == [("px", LINK), ("pl", DIRECT)]
    assert await routes("prfaas-static", 10_000, 5000) == [("pl", DIRECT)]


async def test_the_policy_name_picks_the_policy() -> None:
    assert await routes("naive", None, 500) == [("px", LINK)]
    assert await routes("homogeneous", None, 50_000) == [("pl", DIRECT)]


def test_a_switchable_instance_is_reached_at_its_roles_mount() -> None:
    pd = InstanceInfo(id="d1", cluster="local", role="decode", url="http://d1", switchable=True)
    state = RouterState(ServiceSpec(role="router", id="r", instances=[*INSTANCES, pd]))
    assert state.instances["d1"].url == "http://d1" + DECODE_PREFIX
    assert state.instances["d0"].url == "http://d0"


def test_scheduler_and_prefix_cache_exist_only_when_configured() -> None:
    plain = RouterState(ServiceSpec(role="router", id="r", instances=INSTANCES))
    assert plain.control is None and plain.cache is None
    dep = DeploymentConfig.model_validate(
        {"kind": "prfaas-pd", "prfaas": {"hardware": "h200x8", "instances": 1},
         "local": {"hardware": "h20x8", "instances": 2, "prefill": 1}}
    )  # fmt: skip
    sch = SchedulerSpec(
        deployment=dep, lengths=FixedLengths(tokens=1000), output_tokens=8, tpot_slo_s=0.025,
        threshold_step=100, n_prefill=1,
    )  # fmt: skip
    full = RouterState(
        ServiceSpec(
            role="router",
            id="r",
            instances=INSTANCES,
            scheduler=sch,
            prefix_cache_bytes={"prfaas": 2.0**40, "local": 2.0**41},
        )
    )
    assert full.control is not None and full.control.sch == sch
    assert full.cache is not None


async def test_an_instance_that_never_answers_is_given_up_on_after_request_timeout_s() -> None:
    async def hang(request: web.Request) -> web.Response:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    app = web.Application()
    app.router.add_post("/prefill", hang)
    server = TestServer(app)
    await server.start_server()
    inst = InstanceInfo(id="p", cluster="local", role="prefill", url=str(server.make_url("")))
    state = RouterState(ServiceSpec(role="router", id="r", request_timeout_s=0.2))
    await state.open()
    try:
        async with asyncio.timeout(20):  # the bound under test is 0.2 s; this guards a hang
            with pytest.raises(AttemptError, match="unreachable"):
                await state.workers.prefill(inst, {"id": "x"}, [])
    finally:
        await state.aclose()
        await server.close()
