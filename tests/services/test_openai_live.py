"""The OpenAI surface and /metrics against a live tiny deployment (issue #17 items 2 and 3):
the openai package's client on completions and chat, streaming and not, with usage counted by
the shipped tokenizer; every service's /metrics parses with prometheus-client's parser, carries
vLLM's names, and its counters move when requests run."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from openai import AsyncOpenAI
from prometheus_client.parser import text_string_to_metric_families

from testbed.scenario.plan import RunOptions, prepare_run
from testbed.scenario.runner import _Run
from testbed.scenario.schema import load_scenario
from testbed.services.router.text import TextCodec, block_hashes

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "tests" / "data" / "tiny.yaml"
MODEL = "internal-1t-hybrid"
"""The tiny deployment's model: a request naming another is a 404, as vLLM answers."""
PROMPT = "The scheduler moves work to the local cluster when the link is slow."

pytestmark = pytest.mark.slow


@pytest.fixture
async def deployment(tmp_path: Path) -> AsyncIterator[_Run]:
    opts = RunOptions(out_dir=tmp_path, progress=False)
    run = _Run(prepare_run(load_scenario(TINY), opts), opts)
    await run.start()
    try:
        yield run
    finally:
        await run.shutdown()


def _client(run: _Run) -> AsyncOpenAI:
    assert run.router is not None
    return AsyncOpenAI(base_url=f"{run.router.url}/v1", api_key="none", timeout=120)


async def test_openai_client_completions_and_chat_with_usage(deployment: _Run) -> None:
    codec = TextCodec()
    n_prompt = len(codec.encode(PROMPT))
    client = _client(deployment)
    try:
        models = await client.models.list()
        assert [m.id for m in models.data] == [deployment.rp.deployment.model] == [MODEL]

        done = await client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=7)
        assert done.usage is not None
        assert (done.usage.prompt_tokens, done.usage.completion_tokens) == (n_prompt, 7)
        assert done.choices[0].finish_reason == "length"
        assert len(codec.encode(done.choices[0].text)) == 7  # the text re-counts the same

        chat = await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": PROMPT}], max_completion_tokens=5
        )
        assert chat.usage is not None and chat.usage.prompt_tokens == n_prompt
        assert chat.usage.completion_tokens == 5
        assert chat.choices[0].message.role == "assistant"
        assert len(codec.encode(chat.choices[0].message.content or "")) == 5

        stream = await client.completions.create(
            model=MODEL,
            prompt=PROMPT,
            max_tokens=6,
            stream=True,
            stream_options={"include_usage": True},
        )
        texts, usage = [], None
        async for chunk in stream:
            texts += [c.text for c in chunk.choices]
            usage = chunk.usage or usage
        assert usage is not None and usage.completion_tokens == 6
        assert usage.prompt_tokens == n_prompt
        assert len(codec.encode("".join(texts))) == 6

        chat_stream = await client.chat.completions.create(
            model=MODEL,
            messages=[
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Hi"},
            ],
            max_tokens=4,
            stream=True,
            stream_options={"include_usage": True},
        )
        parts, chat_usage, finish = [], None, None
        async for chunk in chat_stream:
            for c in chunk.choices:
                parts.append(c.delta.content or "")
                finish = c.finish_reason or finish
            chat_usage = chunk.usage or chat_usage
        assert chat_usage is not None and chat_usage.completion_tokens == 4
        assert chat_usage.prompt_tokens == len(codec.encode("Be brief.\nHi"))
        assert finish == "length" and len(codec.encode("".join(parts))) == 4

        # without include_usage a stream carries no usage chunk
        plain = await client.completions.create(model=MODEL, prompt="x", max_tokens=2, stream=True)
        usages = [chunk.usage async for chunk in plain]
        assert len(usages) >= 2 and all(u is None for u in usages)  # tokens, then the end
    finally:
        await client.close()


async def test_text_prompts_share_prefix_block_hashes(deployment: _Run) -> None:
    """Two prompts with the same first 512-token block reach the router's prefix cache with the
    same first block hash; a different first block does not."""
    codec = TextCodec()
    shared = codec.filler_text(0, 512)
    a, b = codec.encode(shared + " link"), codec.encode(shared + " time")
    assert len(a) == len(b) == 513
    ha, hb = block_hashes(a), block_hashes(b)
    assert ha[0] == hb[0] and ha[1] != hb[1]
    assert block_hashes(codec.encode(codec.filler_text(1, 512)))[0] != ha[0]
    assert deployment.router is not None
    url = deployment.router.url
    async with aiohttp.ClientSession() as session:
        for prompt in (shared + " link", shared + " time"):
            body = {"model": MODEL, "prompt": prompt, "max_tokens": 2}
            async with session.post(f"{url}/v1/completions", json=body) as resp:
                assert resp.status == 200, await resp.text()
        async with session.get(f"{url}/stats") as resp:
            cache = (await resp.json())["prefix_cache"]
    assert cache is not None
    # the second request found the first one's 512-token block cached somewhere
    async with aiohttp.ClientSession() as session, session.get(f"{url}/history") as resp:
        recs = await resp.json()
    second = recs[-1]
    assert second["cached_local"] + second["cached_prfaas"] >= 512


def _families(text: str) -> dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]]:
    out: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(fam.name, {})[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _total(
    fams: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]], sample: str
) -> float:
    return sum(v for fam in fams.values() for (name, _), v in fam.items() if name == sample)


async def test_every_services_metrics_parse_with_vllm_names_and_counters_move(
    deployment: _Run,
) -> None:
    assert deployment.router is not None
    urls = {sid: svc.url for sid, svc in deployment.services.items()}
    async with aiohttp.ClientSession() as session:

        async def scrape() -> dict[
            str, dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]]
        ]:
            out = {}
            for sid, url in urls.items():
                async with session.get(f"{url}/metrics") as resp:
                    assert resp.status == 200
                    assert resp.headers["Content-Type"].startswith("text/plain")
                    out[sid] = _families(await resp.text())
            return out

        before = await scrape()
        client = _client(deployment)
        try:
            for i in range(3):
                await client.completions.create(
                    model=MODEL, prompt=PROMPT * (1 + i), max_tokens=5, stream=True
                )
                stream = await client.completions.create(
                    model=MODEL, prompt=PROMPT, max_tokens=5, stream=True
                )
                async for _ in stream:
                    pass
        finally:
            await client.close()
        after = await scrape()

    router_b, router_a = before["router"], after["router"]
    for name in (
        "vllm:time_to_first_token_seconds",
        "vllm:inter_token_latency_seconds",
        "vllm:e2e_request_latency_seconds",
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:prompt_tokens",
        "vllm:generation_tokens",
        "vllm:request_success",
        "testbed_requests",
        "testbed_threshold_tokens",
        "testbed_kv_transfer_bytes",
    ):
        assert name in router_a, name
    assert (
        _total(router_a, "vllm:generation_tokens_total")
        - _total(router_b, "vllm:generation_tokens_total")
        >= 15
    )  # at least the three streamed requests' tokens
    assert _total(router_a, "vllm:time_to_first_token_seconds_count") >= 3 + _total(
        router_b, "vllm:time_to_first_token_seconds_count"
    )
    assert _total(router_a, "vllm:inter_token_latency_seconds_count") > _total(
        router_b, "vllm:inter_token_latency_seconds_count"
    )
    assert _total(router_a, "vllm:num_requests_running") == 0  # nothing left in flight
    assert _total(router_a, "testbed_threshold_tokens") == pytest.approx(8000.0)
    decoders = [sid for sid in urls if "decode" in sid]
    prefills = [sid for sid in urls if "prefill" in sid]
    assert decoders and prefills
    for sid in decoders:
        assert {"vllm:num_requests_running", "vllm:generation_tokens"} <= set(after[sid])
    for sid in prefills:
        assert {"vllm:num_requests_waiting", "vllm:prompt_tokens"} <= set(after[sid])
    moved_gen = sum(
        _total(after[s], "vllm:generation_tokens_total")
        - _total(before[s], "vllm:generation_tokens_total")
        for s in decoders
    )
    moved_prompt = sum(
        _total(after[s], "vllm:prompt_tokens_total") - _total(before[s], "vllm:prompt_tokens_total")
        for s in prefills
    )
    assert moved_gen >= 30 and moved_prompt > 0
    kv = sum(_total(after[s], "testbed_kv_transfer_bytes_total") for s in decoders)
    assert kv > 0
