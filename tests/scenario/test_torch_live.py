"""`engine: torch` live: the tiny real model in the services, on loopback, with real processes.

A short run of scenarios/real-model.yaml must give every completed request exactly the tokens a
single process generates for the same prompt, with some prompts prefilled on PrfaaS (KV across
the link). A KV frame flipped on the wire must be caught and never decoded; KV from another
model must be refused with its reason. Assertions are about tokens and counts, never wall time.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

try:
    import torch  # noqa: F401  (fail loudly here if the model extra is missing)
except ImportError as exc:
    raise ImportError(
        "the torch tests need torch: pip install -e '.[dev,model]' (or `make test`)"
    ) from exc

from testbed.engine.torch import live
from testbed.engine.torch.model import TinyHybridLM, generate
from testbed.scenario.plan import RunOptions, prepare_run
from testbed.scenario.runner import run_scenario
from testbed.scenario.schema import load_scenario
from testbed.services.spec import InstanceInfo, ServiceSpec
from testbed.substrate.local import LocalService, start_service, stop_services
from testbed.transfer.fault_proxy import FaultProxy

pytestmark = pytest.mark.model

ROOT = Path(__file__).resolve().parents[2]


async def test_real_model_scenario_is_token_exact_with_remote_prefill(tmp_path: Path) -> None:
    scenario = load_scenario(ROOT / "scenarios" / "real-model.yaml")
    opts = RunOptions(out_dir=tmp_path, progress=False, duration_s=8.0, timeline=False)
    rp = prepare_run(scenario, opts)
    assert rp.deployment.engine == "torch" and len(rp.requests) >= 4
    result = await run_scenario(rp, opts)
    checks = {c.name: c for c in result.checks}
    assert all(c.ok for c in result.checks), [(c.name, c.detail) for c in result.checks]
    assert "token_exact" in checks and "failures" in checks
    invariants = {"nothing_lost", "kv_accounted", "no_unverified_decode", "generator_count"}
    assert invariants <= set(checks)
    req = result.summary["requests"]
    assert req["submitted"] == req["completed"] + req["failed"] == len(result.records) > 0
    completed = [r for r in result.records if r.status == "completed"]
    assert len(completed) == len(rp.requests)
    # independent of the checker: recompute each reference here
    model = TinyHybridLM(live.tiny_config(0))
    for r in completed:
        prompt = live.prompt_ids(scenario.seed, r.id, r.input_tokens, model.config.vocab_size)
        assert r.prompt_digest == live.ids_digest(prompt)
        assert r.output_ids == generate(model, prompt, r.output_tokens), r.id
        assert r.tokens_out == r.output_tokens and r.kv_verified
        assert r.kv_wire_bytes_received == sum(model.config.layer_sizes(0, r.input_tokens))
    remote = [r for r in completed if r.route == "prfaas"]
    assert remote and all(r.cross_dc for r in remote), "no request used remote prefill"
    assert any(r.route == "local" for r in completed)
    engine = json.loads((tmp_path / "summary.json").read_text())["engine"]["instances"]
    assert "decode_step" in engine["local-decode-0"]["real_model"]
    assert "prefill_layer" in engine["prfaas-prefill-0"]["real_model"]


def _spec(role: str, sid: str, **kw: Any) -> ServiceSpec:
    return ServiceSpec(role=role, id=sid, engine="torch", time_scale=10.0, **kw)  # type: ignore[arg-type]


@contextlib.asynccontextmanager
async def _services(
    tmp_path: Path, *, decode_seed: int, connections: int = 4
) -> AsyncIterator[tuple[LocalService, LocalService]]:
    """A torch prefill and a torch decode process (the router is started by each test)."""
    started: list[LocalService] = []
    try:
        started.append(
            await start_service(
                _spec("prefill", "local-prefill-0", connections=connections), tmp_path
            )
        )
        started.append(
            await start_service(
                _spec("decode", "local-decode-0", model_seed=decode_seed, kv_timeout_s=20),
                tmp_path,
            )
        )
        yield started[0], started[1]
    finally:
        await stop_services(started)


async def _router(
    tmp_path: Path, prefill: LocalService, decode: LocalService, kv_port: int
) -> LocalService:
    instances = [
        InstanceInfo(id=prefill.spec.id, cluster="local", role="prefill", url=prefill.url),
        InstanceInfo(
            id=decode.spec.id,
            cluster="local",
            role="decode",
            url=decode.url,
            kv_host="127.0.0.1",
            kv_port=kv_port,
            kv_link_host="127.0.0.1",
            kv_link_port=kv_port,
        ),
    ]
    spec = _spec("router", "router", instances=instances, threshold_tokens=1e9)
    return await start_service(spec, tmp_path)


async def _generate(router: LocalService, rid: str, n_in: int, n_out: int) -> dict[str, Any]:
    body = {"id": rid, "input_tokens": n_in, "output_tokens": n_out}
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=90)) as session,
        session.post(f"{router.url}/generate", json=body) as resp,
    ):
        lines = [json.loads(line) async for line in resp.content if line.strip()]
    return next(doc["record"] for doc in lines if "record" in doc)


async def _stats(svc: LocalService) -> dict[str, Any]:
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session,
        session.get(f"{svc.url}/stats") as resp,
    ):
        doc: dict[str, Any] = await resp.json()
        return doc


async def test_flipped_kv_byte_is_caught_and_never_decoded(tmp_path: Path) -> None:
    """One byte of the first KV connection is flipped: the receiver's checksum fails that
    transfer; the request still ends token-exact (re-sent), so nothing corrupt was decoded."""
    async with _services(tmp_path, decode_seed=0, connections=1) as (prefill, decode):
        rid, n_in, n_out = "q-flip", 80, 8
        # the stream of the one connection: OPEN frame, then layer 0's first DATA frame
        async with FaultProxy(decode.ports["kv"], flip_at=48 + len(rid) + 100) as flip:
            router = await _router(tmp_path, prefill, decode, flip.port)
            try:
                rec = await _generate(router, rid, n_in, n_out)
            finally:
                await stop_services([router])
            assert flip.flips_done == 1
        stats = await _stats(decode)
        assert stats["kv_checksum_failures"] >= 1
        assert rec["status"] == "completed", rec["failure_reason"]
        model = TinyHybridLM(live.tiny_config(0))
        prompt = live.prompt_ids(0, rid, n_in, model.config.vocab_size)
        assert rec["output_ids"] == generate(model, prompt, n_out)
        assert rec["tokens_out"] == n_out and rec["kv_verified"]
        assert stats["completed"] == 1 and stats["kv_rejected"] == 0


async def test_kv_from_another_model_is_refused_with_its_reason(tmp_path: Path) -> None:
    """Intact KV whose header fingerprint is another seed's: KVFormatError, never decoded."""
    async with _services(tmp_path, decode_seed=1) as (prefill, decode):
        assert decode.spec.model_seed != prefill.spec.model_seed
        router = await _router(tmp_path, prefill, decode, decode.ports["kv"])
        try:
            rec = await _generate(router, "q-alien", 40, 4)
        finally:
            await stop_services([router])
        assert rec["status"] == "failed"
        assert "kv rejected" in rec["failure_reason"]
        assert "another model config" in rec["failure_reason"]
        assert rec["tokens_out"] == 0 and not rec["output_ids"]
        stats = await _stats(decode)
        # every attempt (the router retries) was refused; none reached the batch
        assert stats["kv_rejected"] == rec["retries"] >= 1 and stats["completed"] == 0
