"""Long text prompts against the router (issue #33, defect 4): six ~1 MiB prompts at once at
time_scale 1 on the tiny deployment, while another client streams 600 tokens and a poller calls
`/v1/models` every 0.1 s. The prompts are tokenized in the router's worker pool
(testbed/services/tokenize_pool.py), so the router's event loop should not notice them.

    python bench/long_prompts.py [--runs 3] [--report bench/reports/long_prompts.md]

Per run: the streaming client's largest inter-token gap before and during the burst (its own
token interval is ~62 ms), `/v1/models`' slowest answer during the burst, the router's RSS at
the start, at its peak and 10 s after, and the largest event-loop lag the router measured. The
report carries its provenance (command, commit, date, cores, load before and after). The
client encodes the bodies before the burst, so its own event loop stays free.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from provenance import provenance  # bench/provenance.py: the script's directory is on sys.path

from testbed.scenario.plan import RunOptions, prepare_run
from testbed.scenario.runner import _Run
from testbed.scenario.schema import load_scenario
from testbed.transfer.flood import MIB, rss_bytes

ROOT = Path(__file__).resolve().parent.parent
BIG_CHARS = 1_000_000
N_BIG = 6
WORDS = ["the", "link", "is", "slow", "prefill", "decode", "cache", "router", "token",
         "cluster", "bandwidth", "model", "request", "stream", "queue", "transfer"]  # fmt: skip


def big_prompt(seed: int) -> str:
    rng = random.Random(seed)
    parts, n = [], 0
    while n < BIG_CHARS:
        w = rng.choice(WORDS) + (" " if rng.random() < 0.9 else ". ")
        parts.append(w)
        n += len(w)
    return "".join(parts)[:BIG_CHARS]


async def one_run() -> dict[str, Any]:
    sc = yaml.safe_load((ROOT / "tests/data/tiny.yaml").read_text())
    sc["scale"] = {"time_scale": 1, "byte_scale": 2000}
    tmp = Path(tempfile.mkdtemp(prefix="long-prompts-"))
    (tmp / "tiny1.yaml").write_text(yaml.safe_dump(sc))
    opts = RunOptions(out_dir=tmp, progress=False)
    run = _Run(prepare_run(load_scenario(tmp / "tiny1.yaml"), opts), opts)
    await run.start()
    try:
        assert run.router is not None
        url, pid = run.router.url, run.router.ref.pid  # type: ignore[attr-defined]
        model = run.rp.deployment.model
        datas = [
            json.dumps({"model": model, "prompt": big_prompt(i), "max_tokens": 2}).encode()
            for i in range(N_BIG)
        ]
        timeout = aiohttp.ClientTimeout(total=300)
        async with aiohttp.ClientSession(timeout=timeout) as s:
            warm = {"model": model, "prompt": "warm up", "max_tokens": 2}
            async with s.post(f"{url}/v1/completions", json=warm) as r:
                await r.read()
            await asyncio.sleep(1.0)
            rss = {"start": rss_bytes(pid) / MIB, "peak": 0.0}
            stop = asyncio.Event()
            gaps: list[tuple[float, float]] = []
            models: list[tuple[float, float]] = []

            async def sample() -> None:
                while not stop.is_set():
                    rss["peak"] = max(rss["peak"], rss_bytes(pid) / MIB)
                    await asyncio.sleep(0.05)

            async def stream() -> None:
                body = {"model": model, "prompt": "the link is slow", "max_tokens": 600,
                        "stream": True}  # fmt: skip
                last = None
                async with s.post(f"{url}/v1/completions", json=body) as r:
                    async for line in r.content:
                        if line.startswith(b"data:"):
                            now = time.perf_counter()
                            if last is not None:
                                gaps.append((now, now - last))
                            last = now

            async def poll_models() -> None:
                while not stop.is_set():
                    t = time.perf_counter()
                    async with s.get(f"{url}/v1/models") as r:
                        await r.read()
                    models.append((t, time.perf_counter() - t))
                    await asyncio.sleep(0.1)

            async def big(data: bytes) -> None:
                headers = {"Content-Type": "application/json"}
                async with s.post(f"{url}/v1/completions", data=data, headers=headers) as r:
                    await r.read()

            tasks = [asyncio.create_task(sample()), asyncio.create_task(poll_models())]
            streamer = asyncio.create_task(stream())
            await asyncio.sleep(2.0)
            t0 = time.perf_counter()
            bigs = [asyncio.create_task(big(d)) for d in datas]
            await streamer
            for b in bigs:
                b.cancel()
            stop.set()
            await asyncio.gather(*bigs, *tasks, return_exceptions=True)
            await asyncio.sleep(10.0)
            async with s.get(f"{url}/stats") as r:
                lag = (await r.json())["decisions"]["loop_lag_ms"]
            rss["after_10s"] = rss_bytes(pid) / MIB
    finally:
        await run.shutdown()
    ms = 1e3
    return {
        "gap_before_ms": max((g for t, g in gaps if t < t0), default=0.0) * ms,
        "gap_during_ms": max((g for t, g in gaps if t >= t0), default=0.0) * ms,
        "models_during_ms": max((x for t, x in models if t >= t0), default=0.0) * ms,
        "rss_start": rss["start"],
        "rss_peak": rss["peak"],
        "rss_after": rss["after_10s"],
        "loop_lag_max_ms": float(lag["max"]),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3, help="runs (default 3)")
    ap.add_argument("--report", type=Path, help="write the table as markdown here")
    args = ap.parse_args()
    load_before = os.getloadavg()
    rows = [asyncio.run(one_run()) for _ in range(max(1, args.runs))]
    head = ("| run | stream gap before (ms) | during (ms) | /v1/models during (ms) | "
            "router RSS start / peak / 10 s after (MiB) | loop lag max (ms) |\n"
            "|---|---|---|---|---|---|\n")  # fmt: skip
    table = head + "".join(
        f"| {i + 1} | {r['gap_before_ms']:.1f} | {r['gap_during_ms']:.1f} | "
        f"{r['models_during_ms']:.1f} | {r['rss_start']:.1f} / {r['rss_peak']:.1f} / "
        f"{r['rss_after']:.1f} | {r['loop_lag_max_ms']:.0f} |\n"
        for i, r in enumerate(rows)
    )
    print(table, end="")
    if args.report is not None:
        args.report.write_text(
            "# Long text prompts against the router (bench/long_prompts.py)\n\n"
            + provenance(
                "bench/long_prompts.py",
                sys.argv[1:],
                load_before,
                f"local, tests/data/tiny.yaml at time_scale 1, {N_BIG} prompts of "
                f"{BIG_CHARS:,} characters",
            )
            + "\nTargets (issue #33): another client's stream gap and `/v1/models` at most "
            "100 ms during the burst, the router's RSS back within 100 MiB of its start 10 s "
            "after. The stream's own token interval is about 62 ms.\n\n" + table
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
