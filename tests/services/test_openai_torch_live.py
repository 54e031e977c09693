"""The OpenAI surface on `engine: torch` (issue #17 item 2): the text is the tiny model's real
output decoded with the shipped tokenizer, streamed as it is generated and whole when not."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from openai import AsyncOpenAI

from testbed.engine.torch import live
from testbed.scenario.plan import RunOptions, prepare_run
from testbed.scenario.runner import _Run
from testbed.scenario.schema import load_scenario
from testbed.services.router.text import TextCodec

pytestmark = pytest.mark.model

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
async def deployment(tmp_path: Path) -> AsyncIterator[_Run]:
    live.require_torch()
    opts = RunOptions(out_dir=tmp_path, progress=False)
    run = _Run(prepare_run(load_scenario(ROOT / "scenarios" / "real-model.yaml"), opts), opts)
    await run.start()
    try:
        yield run
    finally:
        await run.shutdown()


async def test_torch_text_is_the_models_output_streamed_or_not(deployment: _Run) -> None:
    assert deployment.router is not None
    url = deployment.router.url
    codec = TextCodec()
    client = AsyncOpenAI(base_url=f"{url}/v1", api_key="none", timeout=120)
    try:
        whole = await client.completions.create(
            model=deployment.rp.deployment.model, prompt="the link", max_tokens=8
        )
        stream = await client.completions.create(
            model=deployment.rp.deployment.model,
            prompt="the link is slow",
            max_tokens=8,
            stream=True,
        )
        pieces = [c.text async for chunk in stream for c in chunk.choices]
    finally:
        await client.close()
    async with aiohttp.ClientSession() as session, session.get(f"{url}/history") as resp:
        recs = {r["id"]: r for r in await resp.json()}
    first, second = sorted(recs.values(), key=lambda r: r["arrival"])
    assert len(first["output_ids"]) == len(second["output_ids"]) == 8
    assert whole.choices[0].text == codec.decode(first["output_ids"])
    # streamed: each chunk is its own ids decoded, in order (however the tokens were chunked)
    assert "".join(pieces) in _joins(codec, second["output_ids"])
    assert "".join(pieces) != codec.filler_text(0, 8)


def _joins(codec: TextCodec, ids: list[int]) -> set[str]:
    """The texts of `ids` streamed in every possible chunking."""
    out = set()
    for mask in range(2 ** (len(ids) - 1)):
        parts, cur = [], [ids[0]]
        for i in range(1, len(ids)):
            if mask >> (i - 1) & 1:
                parts.append(cur)
                cur = []
            cur.append(ids[i])
        parts.append(cur)
        out.add("".join(codec.decode(p) for p in parts))
    return out
