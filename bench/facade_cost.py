"""The façade's added cost per request (issue #32): our own router's path against each external
router's path through the router-facing API (testbed/services/facade), on the same fleet, with
the load generator's hash-id shortcut (`input_tokens` and `hash_ids` in the body) and with
text-only bodies (each half then sizes the prompt with the shipped tokenizer).

The fleet is small so nothing queues: a `naive` deployment of one PrfaaS prefill (h200x8) and
one local decode (h20x8), link 100 Gbps with no RTT, time_scale 1, byte_scale 2000, local
substrate, emulated engine, started twice as an external-router run (scenario.external_run):
once with sglang-router 0.3.2 in front (the `sglang` flavour: both halves at once, bootstrap
room), once with vllm-router 0.1.17 (the `vllm` flavour: sequential, held KV pulled), both with
round_robin (no render calls). Our own router runs in both fleets, as in every external-router
run, and is sent the same OpenAI bodies: its front hands them to the dispatch the runner's
`/generate` uses (client -> our router -> `/decode` + `/prefill`).

Per fleet, path, body and prompt length (1K, 8K, 30K tokens): N requests one at a time, the
same prompts (seeded) on every path, 4 output tokens, streamed. Measured:

- TTFT at the client, and its part outside the prefill's compute: TTFT - (prefill_end -
  prefill_start), the prefill's own times (our router's records, or the decode half's journal);
  split into before the prefill starts (router, handshake, the prefill half's tokenizing, queue)
  and after it ends (the rest of the KV, vllm-router's round trip and the decode's pull, the
  decode half's registration and verification, the first decode step, the stream back);
- CPU per request of the prefill and the decode worker processes (with their tokenizer pool
  processes) and of the router on the path: each thread's run time (/proc/PID/task/*/schedstat)
  plus the children each process reaped (/proc/PID/stat), summed over each process tree,
  before and after the batch, less the idle rate measured for 4 s before the fleet's batches;
- in this process, the CPU time of sizing each text prompt (tokenize and hash its blocks,
  services.tokenizer.measure_text), which a text body costs each façade half.

    flock /tmp/prfaas-live.lock .venv/bin/python bench/facade_cost.py \
        [--n 10] [--report bench/reports/facade_cost.md]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import math
import os
import random
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from provenance import provenance  # bench/provenance.py: the script's directory is on sys.path

from testbed.kvcache import BLOCK_TOKENS
from testbed.scenario.external_run import ExternalRun
from testbed.scenario.openai_load import PromptText, request_body, submit
from testbed.scenario.plan import RunOptions, prepare_run
from testbed.scenario.schema import scenario_from_data
from testbed.services.openai_request import MAX_PROMPT_TOKENS
from testbed.services.tokenizer import measure_text
from testbed.workload.generate import RequestSpec

ROOT = Path(__file__).resolve().parents[1]
REPORT = ROOT / "bench" / "reports" / "facade_cost.md"
SEED = 17
LENGTHS = (1024, 8192, 30720)
OUTPUT_TOKENS = 4
WARMUP = 2
"""Unmeasured 1K requests per path and body before a fleet's batches."""
IDLE_S = 4.0
SETTLE_S = 0.3
"""Wall seconds after a batch's last answer before its CPU is read (trailing work)."""
TICK = os.sysconf("SC_CLK_TCK")
SCENARIO: dict[str, Any] = {
    "name": "facade-cost",
    "seed": SEED,
    "duration": "10s",
    "scale": {"time_scale": 1, "byte_scale": 2000},
    "deployments": {
        "naive": {
            "kind": "naive",
            "prfaas": {"hardware": "h200x8", "instances": 1},
            "local": {"hardware": "h20x8", "instances": 1},
            "link": {"bandwidth": "100Gbps", "connections": 2},
        }
    },
    "workload": {
        "lengths": {"kind": "fixed", "tokens": 1024},
        "output_tokens": OUTPUT_TOKENS,
        "arrivals": {"process": "uniform", "rate": 0.5},
    },
    "policy": {"name": "naive"},
}
FLEETS = {"sglang-router": "sglang-router 0.3.2", "vllm-router": "vllm-router 0.1.17"}


def proc_table() -> dict[int, tuple[int, int]]:
    """pid -> (parent pid, CPU ticks of its reaped children: cutime + cstime)."""
    out = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            rest = (d / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        out[int(d.name)] = (int(rest[1]), int(rest[13]) + int(rest[14]))
    return out


def own_cpu_s(pid: int) -> float:
    """CPU seconds a live process's threads ran (schedstat: nanoseconds, not 10 ms ticks)."""
    total = 0
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError, ValueError, IndexError):
                total += int((task / "schedstat").read_text().split()[0])
    return total / 1e9


def tree_cpu_s(table: dict[int, tuple[int, int]], root: int) -> float:
    """CPU seconds of `root` and its live descendants (a tokenizer pool's fork server and
    workers), with the children they reaped (a retired pool worker's, to the tick)."""
    kids: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        kids.setdefault(ppid, []).append(pid)
    total, todo = 0.0, [root]
    while todo:
        pid = todo.pop()
        total += own_cpu_s(pid) + table.get(pid, (0, 0))[1] / TICK
        todo += kids.get(pid, [])
    return total


@dataclass
class Batch:
    fleet: str
    path: str
    body: str
    length: int
    ttft: list[float] = field(default_factory=list)
    outside: list[float] = field(default_factory=list)
    before: list[float] = field(default_factory=list)
    after: list[float] = field(default_factory=list)
    prefill: list[float] = field(default_factory=list)
    cpu: dict[str, float] = field(default_factory=dict)
    """CPU seconds per request: prefill, decode, router."""
    errors: list[str] = field(default_factory=list)
    idle: dict[str, float] = field(default_factory=dict)
    """The fleet's idle CPU rates (CPU seconds per second) subtracted, by process."""


def prompts(n: int, salt: int) -> dict[int, list[RequestSpec]]:
    """n requests per length, each prompt its own (no prefix shared), the same for every path."""
    rng = random.Random(SEED * 1000 + salt)
    return {
        length: [
            RequestSpec(
                id=f"s{salt}-{length}-{i}",
                arrival=0.0,
                input_tokens=length,
                output_tokens=OUTPUT_TOKENS,
                hash_ids=tuple(rng.getrandbits(62) for _ in range(-(-length // BLOCK_TOKENS))),
            )
            for i in range(n)
        ]
        for length in LENGTHS
    }


class Fleet:
    """One external-router run's fleet, started and not driven: the bench sends the requests."""

    def __init__(self, preset: str, out: Path) -> None:
        data = {**SCENARIO, "router": {"kind": "external", "preset": preset,
                                       "policy": "round_robin"}}  # fmt: skip
        sc = scenario_from_data(data, out / "facade-cost.yaml")
        self.opts = RunOptions(out_dir=out / preset, progress=False, timeline=False)
        self.run = ExternalRun(prepare_run(sc, self.opts), self.opts)
        self.preset = preset
        self.idle: dict[str, float] = {}
        self.tags = itertools.count(1)  # a request id the fleet has not seen

    async def start(self) -> None:
        await self.run.start()
        self.model = self.run.rp.deployment.model
        roles = {h.spec.role: h for h in self.run.services.values()}
        assert self.run.router is not None and self.run.process is not None
        self.pids = {
            "prefill": roles["prefill"].ref.pid,  # type: ignore[attr-defined]
            "decode": roles["decode"].ref.pid,  # type: ignore[attr-defined]
            "ours": self.run.router.ref.pid,  # type: ignore[attr-defined]
            self.preset: self.run.process.proc.pid,
        }
        self.decode_url = roles["decode"].url
        self.urls = {"ours": self.run.router.url, self.preset: self.run.process.url}

    def cpu(self) -> dict[str, float]:
        table = proc_table()
        return {k: tree_cpu_s(table, pid) for k, pid in self.pids.items()}

    async def measure_idle(self) -> None:
        a, t = self.cpu(), time.monotonic()
        await asyncio.sleep(IDLE_S)
        b, wall = self.cpu(), time.monotonic() - t
        self.idle = {k: (b[k] - a[k]) / wall for k in a}

    async def _mark(self, session: aiohttp.ClientSession, path: str) -> int:
        if path == "ours":
            async with session.get(f"{self.urls['ours']}/stats") as r:
                return int((await r.json())["recorded"])
        async with session.get(f"{self.decode_url}/facade/attempts", params={"after": 0}) as r:
            return int((await r.json())["seq"])

    async def _prefill_times(
        self, session: aiohttp.ClientSession, path: str, mark: int, labels: list[str]
    ) -> list[tuple[float, float] | None]:
        """Each request's (prefill_start, prefill_end) on the services' clock."""
        if path == "ours":  # one at a time: our router's records end in the order sent
            url = f"{self.urls['ours']}/history"
            async with session.get(url, params={"after": mark, "limit": len(labels)}) as r:
                recs = await r.json()
            return [(float(x["prefill_start"]), float(x["prefill_end"]))
                    if x.get("status") == "completed" else None for x in recs]  # fmt: skip
        async with session.get(f"{self.decode_url}/facade/attempts", params={"after": mark}) as r:
            done = {a["request"]: a for a in (await r.json())["attempts"]
                    if a["outcome"] == "completed" and a.get("kv_verified")}  # fmt: skip
        return [(float(done[x]["prefill_start"]), float(done[x]["prefill_end"]))
                if x in done else None for x in labels]  # fmt: skip

    def body(self, req: RequestSpec, text: str, path: str, kind: str) -> dict[str, Any]:
        body = request_body(req, text, self.model)
        body["testbed_request_id"] = f"{path[:6]}-{kind}-{req.id}-{next(self.tags)}"
        if kind == "text":
            del body["input_tokens"], body["hash_ids"]
        return body

    async def batch(
        self,
        session: aiohttp.ClientSession,
        path: str,
        kind: str,
        reqs: list[RequestSpec],
        texts: dict[str, str],
        warm: RequestSpec | None = None,
    ) -> Batch:
        """`reqs` one at a time through `path` ("ours" or the preset) with `kind` bodies."""
        out = Batch(self.preset, path, kind, reqs[0].input_tokens)
        if warm is not None:  # unmeasured: a tokenizer pool idle for 5 s stopped its workers
            body = self.body(warm, texts[warm.id], path, kind)
            await submit(session, self.urls[path], warm, body, self.run.service_clock)
        mark = await self._mark(session, path)
        bodies = [self.body(r, texts[r.id], path, kind) for r in reqs]
        cpu0, t0 = self.cpu(), time.monotonic()
        views = []
        for req, body in zip(reqs, bodies, strict=True):
            views.append(await submit(session, self.urls[path], req, body,
                                      self.run.service_clock))  # fmt: skip
        await asyncio.sleep(SETTLE_S)
        cpu1, wall = self.cpu(), time.monotonic() - t0
        n = len(reqs)
        for role, key in (("prefill", "prefill"), ("decode", "decode"), ("router", path)):
            out.cpu[role] = (cpu1[key] - cpu0[key] - self.idle.get(key, 0.0) * wall) / n
        labels = [str(b["testbed_request_id"]) for b in bodies]
        times = await self._prefill_times(session, path, mark, labels)
        for view, pf in zip(views, times + [None] * (n - len(times)), strict=False):
            if view.error is not None or view.first_token is None or pf is None:
                out.errors.append(view.error or "no prefill times on record")
                continue
            ttft = view.first_token - view.sent
            out.ttft.append(ttft)
            out.prefill.append(pf[1] - pf[0])
            out.outside.append(ttft - (pf[1] - pf[0]))
            out.before.append(pf[0] - view.sent)
            out.after.append(view.first_token - pf[1])
        return out


def q(xs: list[float], p: float) -> float:
    """The median (p 0.5) or the p-quantile by nearest rank of xs; NaN for none."""
    if p == 0.5:
        return statistics.median(xs) if xs else math.nan
    ranked = sorted(xs) or [math.nan]
    return ranked[max(0, math.ceil(p * len(xs)) - 1)]


async def one_fleet(
    preset: str, n: int, reqs: dict[int, list[RequestSpec]], warm: list[RequestSpec],
    texts: dict[str, str], out: Path,
) -> list[Batch]:  # fmt: skip
    """Every path and body on one fleet, the paths interleaved per prompt length."""
    fleet = Fleet(preset, out)
    combos = [("ours", "ids"), ("ours", "text"), (preset, "ids"), (preset, "text")]
    if preset != "sglang-router":  # our router's text front was measured on the first fleet
        combos.remove(("ours", "text"))
    batches = []
    try:
        await fleet.start()
        timeout = aiohttp.ClientTimeout(total=120, sock_connect=10)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            for path, kind in combos:  # warm: connections, tokenizer pools, first-call costs
                await fleet.batch(session, path, kind, warm, texts)
            await fleet.measure_idle()
            for length in LENGTHS:
                for path, kind in combos:
                    b = await fleet.batch(session, path, kind, reqs[length], texts, warm[0])
                    batches.append(b)
                    print(f"  {preset:14} {path:14} {kind:4} {length:6}: TTFT p50 "
                          f"{q(b.ttft, 0.5) * 1e3:7.1f} ms, outside prefill p50 "
                          f"{q(b.outside, 0.5) * 1e3:6.1f} ms, errors {len(b.errors)}",
                          file=sys.stderr, flush=True)  # fmt: skip
    finally:
        await fleet.run.shutdown()
    for b in batches:
        b.idle = fleet.idle
    return batches


def tokenize_cost(texts: dict[str, str], reqs: dict[int, list[RequestSpec]]) -> dict[int, Any]:
    """CPU seconds to size each length's text prompts in this process (median of them)."""
    measure_text("warm up the tokenizer", MAX_PROMPT_TOKENS)
    out = {}
    for length, rs in reqs.items():
        cpu = []
        for r in rs[:5]:
            t = time.process_time()
            tokens, _ = measure_text(texts[r.id], MAX_PROMPT_TOKENS)
            cpu.append(time.process_time() - t)
        out[length] = {"cpu_s": statistics.median(cpu), "tokens": tokens,
                       "chars": len(texts[rs[0].id])}  # fmt: skip
    return out


def ms(x: float) -> str:
    return "-" if x != x else f"{x * 1e3:.1f}"


def _row(b: Batch) -> str:
    cpu = " / ".join(ms(b.cpu[k]) for k in ("prefill", "decode", "router"))
    return (f"| {b.fleet} | {'ours' if b.path == 'ours' else b.path} | {b.body} | "
            f"{b.length // 1024}K | {len(b.ttft)} | {ms(q(b.ttft, 0.5))} / {ms(q(b.ttft, 0.9))} | "
            f"{ms(q(b.prefill, 0.5))} | {ms(q(b.outside, 0.5))} / {ms(q(b.outside, 0.9))} | "
            f"{ms(q(b.before, 0.5))} | {ms(q(b.after, 0.5))} | {cpu} |\n")  # fmt: skip


def _added(batches: list[Batch]) -> str:
    """Each external path against ours with shortcut bodies on the same fleet and prompt."""
    ours = {(b.fleet, b.length): b for b in batches if b.path == "ours" and b.body == "ids"}
    rows = []
    for b in batches:
        if b.path == "ours":
            continue
        o = ours[(b.fleet, b.length)]
        d_p50 = q(b.outside, 0.5) - q(o.outside, 0.5)
        d_p90 = q(b.outside, 0.9) - q(o.outside, 0.9)
        w_o, w_b = o.cpu["prefill"] + o.cpu["decode"], b.cpu["prefill"] + b.cpu["decode"]
        rows.append(f"| {b.path} | {b.body} | {b.length // 1024}K | {ms(d_p50)} | {ms(d_p90)} | "
                    f"{ms(w_o)} -> {ms(w_b)} ({ms(w_b - w_o)}) | {ms(o.cpu['router'])} -> "
                    f"{ms(b.cpu['router'])} |\n")  # fmt: skip
    return "".join(rows)


def report(batches: list[Batch], tok: dict[int, Any], n: int, wall_s: float) -> str:
    head = ("| fleet | path | body | prompt | ok | TTFT p50 / p90 | prefill compute p50 | "
            "outside prefill p50 / p90 | before prefill p50 | after prefill p50 | "
            "CPU per request: prefill / decode / router |\n"
            "|---|---|---|---|---|---|---|---|---|---|---|\n")  # fmt: skip
    added = ("| router | body | prompt | outside prefill, added p50 | added p90 | "
             "worker CPU per request (prefill + decode), ours -> theirs (added) | "
             "router CPU per request, ours -> theirs |\n"
             "|---|---|---|---|---|---|---|\n")  # fmt: skip
    tokens = ("| prompt | characters | tokens | CPU to size it (tokenize + hash blocks) | "
              "per request through the façade (both halves) |\n"
              "|---|---|---|---|---|\n")  # fmt: skip
    tokens += "".join(
        f"| {length // 1024}K | {t['chars']:,} | {t['tokens']:,} | {ms(t['cpu_s'])} | "
        f"{ms(2 * t['cpu_s'])} |\n"
        for length, t in tok.items()
    )
    errors = sorted({e for b in batches for e in b.errors})
    idle = "; ".join(
        f"{b.fleet}: " + ", ".join(f"{k} {v * 1e3:.1f}" for k, v in b.idle.items())
        for b in {b.fleet: b for b in batches}.values()
    )
    return (
        f"{n} requests per fleet, path, body and prompt length, one at a time; all times in "
        f"ms, wall (time_scale 1). The whole bench took {wall_s:.0f} s of wall.\n\n"
        "## Per request\n\n"
        "*outside prefill*: the client's TTFT less the prefill's own compute (prefill_end - "
        "prefill_start, from our router's records or the decode half's journal); *before "
        "prefill*: from the client's send to the prefill's start (the router, the handshake, "
        "the prefill half's tokenizing, the queue); *after prefill*: from the prefill's end to "
        "the client's first token (the KV's last layers or, with vllm-router, its round trip, "
        "the decode half's registration and the whole KV pulled; verification; the first "
        "decode step; the stream back). CPU per request in ms: the prefill and the decode "
        "worker (each with its tokenizer pool's processes) and the router on the path (ours: "
        "the router service; theirs: the Rust router's process), from /proc (threads' run "
        "time, reaped children's) over the batch, "
        f"less the idle rate (CPU ms per s: {idle}).\n\n"
        + head
        + "".join(_row(b) for b in batches)
        + "\n## Added by the façade\n\n"
        "Each external router's path against our router's with shortcut bodies (`ids`: "
        "`input_tokens` and `hash_ids`, the testbed's normal run) on the same fleet and "
        "prompts. A negative figure is within the noise.\n\n"
        + added
        + _added(batches)
        + "\n## Sizing a text prompt\n\n"
        "In the bench's process, the median over 5 prompts of each length (the load "
        "generator's text: one-token words, 512 per block). A text body is sized by each "
        "façade half (the prefill's and the decode's), by our router's front once; a body "
        "with `input_tokens` by none. In the services it runs in a tokenizer pool process "
        "(niced) whose workers stop after 5 s idle (each batch above is preceded by an "
        "unmeasured request, so it measures the pool warm).\n\n"
        + tokens
        + (f"\nFailed or unjoined requests: {'; '.join(errors)}\n" if errors else "")
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=10, help="requests per path, body and length")
    ap.add_argument("--report", type=Path, help="write the tables as markdown here")
    args = ap.parse_args()
    load_before = os.getloadavg()
    begun = time.monotonic()
    n = max(1, min(args.n, 50))
    reqs = prompts(n, 1)
    warm = prompts(WARMUP, 2)[LENGTHS[0]]
    text = PromptText()
    texts = {r.id: text.prompt(r) for rs in reqs.values() for r in rs}
    texts.update({r.id: text.prompt(r) for r in warm})
    tok = tokenize_cost(texts, reqs)
    batches = []
    with tempfile.TemporaryDirectory(prefix="facade-cost-") as tmp:
        for preset in FLEETS:
            batches += asyncio.run(one_fleet(preset, n, reqs, warm, texts, Path(tmp)))
    text_md = report(batches, tok, n, time.monotonic() - begun)
    print(text_md)
    if args.report is not None:
        setup = (f"local, emulated engine, naive deployment: 1 PrfaaS prefill (h200x8) + 1 local "
                 f"decode (h20x8), link 100 Gbps / 0 ms; time_scale 1, byte_scale 2000; seed "
                 f"{SEED}; {OUTPUT_TOKENS} output tokens; sglang-router 0.3.2 and vllm-router "
                 f"0.1.17, round_robin")  # fmt: skip
        args.report.write_text(
            "# The façade's added cost per request (bench/facade_cost.py)\n\n"
            + provenance("bench/facade_cost.py", sys.argv[1:], load_before, setup)
            + "\n"
            + text_md
        )
    return 1 if any(b.errors for b in batches) else 0


if __name__ == "__main__":
    raise SystemExit(main())
