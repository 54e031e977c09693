"""`testbed verify-model`: the KV path is lossless, shown with a real model and real tensors.

For each random prompt, single-process greedy generation is the reference, and the remote path
must reproduce it token for token:

- token_exact: prefill ("PrfaaS") -> KV serialized per layer -> KVSender -> link emulator proxy
  (latency + jitter + a shared bandwidth cap) -> KVReceiver(keep_payload) -> decode ("PD-D").
- prefix_hit_exact: the next turn (the first prompt plus more tokens); the prefill finds the
  first prompt's whole blocks in its HybridPrefixPool (real latents, and the linear states at
  that boundary), computes only the rest, and the decoded tokens equal a cold single-process
  generation of the longer prompt.
- reset_retried_exact: the transfer cache of the first prefill is re-sent through a second proxy
  whose connection is cut (limit_data) half-way; the sender retries on a new connection
  (max_retries) and the decode is exact again.
- corrupt_detected / corrupt_retried_exact: the same KV through a proxy that flips one byte of
  a frame; the receiver's checksum must catch it, the request must fail with a reason and never
  be decoded; the prefill then re-sends it over the clean link and the decode is exact.

Everything runs in one event loop on 127.0.0.1; prompts run a few at a time so network waits of
one overlap with the compute of another.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from testbed.clock import LiveClock
from testbed.engine.torch.config import TinyConfig
from testbed.engine.torch.engine import PrefillResult, TorchDecodeEngine, TorchPrefillEngine
from testbed.engine.torch.model import TinyHybridLM, generate
from testbed.engine.torch.pacing import CpuPacer, ProfileBudget
from testbed.engine.torch.prefix import TorchPrefixCache
from testbed.link.client import LinkClient
from testbed.link.server import start_link_server
from testbed.profiles import MODELS
from testbed.transfer.errors import TransferError
from testbed.transfer.fault_proxy import FaultProxy
from testbed.transfer.receiver import KVReceiver
from testbed.transfer.sender import KVSender
from testbed.units import format_bandwidth

__all__ = ["VerifyOptions", "run_verify"]

_TIMEOUT = 30.0  # wall seconds for any one transfer or wait
_HEADER_AND_ID_MAX = 48 + 64  # a DATA frame's header plus the longest request id


@dataclass(frozen=True)
class VerifyOptions:
    """What to verify and how hostile the link is. Bandwidth in bytes/s, latency in ms."""

    prompts: int = 50
    seed: int = 0
    max_new_tokens: int = 8
    min_prompt_tokens: int = 32
    max_prompt_tokens: int = 96
    block_tokens: int = 16
    latency_ms: int = 5
    jitter_ms: int = 2
    bandwidth: float = 20e6
    chunk_size: int = 8 << 10
    connections: int = 4
    concurrency: int = 4
    time_scale: float = 10.0
    """Pad steps to the paper profile's time / time_scale; 0 disables pacing."""
    model: TinyConfig = field(default_factory=TinyConfig)

    def __post_init__(self) -> None:
        if self.prompts < 1 or self.max_new_tokens < 1 or self.concurrency < 1:
            raise ValueError("prompts, max_new_tokens and concurrency must be >= 1")
        if not 2 * self.block_tokens <= self.min_prompt_tokens <= self.max_prompt_tokens:
            raise ValueError("need 2 x block_tokens <= min_prompt_tokens <= max_prompt_tokens")
        if self.max_prompt_tokens + 2 * self.block_tokens + self.max_new_tokens > (
            self.model.max_positions
        ):
            raise ValueError("prompts plus output exceed the model's max_positions")


@dataclass
class _Counts:
    token_exact: int = 0
    prefix_hit_exact: int = 0
    reset_retried_exact: int = 0
    corrupt_detected: int = 0
    corrupt_retried_exact: int = 0
    prefix_hit_tokens: int = 0
    resets_injected: int = 0
    transfer_retries: int = 0
    kv_bytes: int = 0
    failures: list[str] = field(default_factory=list)

    def fail(self, what: str) -> None:
        if len(self.failures) < 20:
            self.failures.append(what)


class _Harness:
    """The deployment of one verify run: engines, receiver, link proxies and senders."""

    def __init__(self, opts: VerifyOptions, rx: KVReceiver, link: LinkClient) -> None:
        self.opts = opts
        self.rx = rx
        self.link = link
        self.model = TinyHybridLM(opts.model)
        budget = ProfileBudget(MODELS["internal-1t-hybrid"], "h200x8", "h20x8", opts.model.n_layers)
        paced = opts.time_scale > 0
        self.pacer = CpuPacer(LiveClock(time_scale=opts.time_scale)) if paced else None
        b = budget if self.pacer is not None else None
        cache = TorchPrefixCache(opts.model, capacity_bytes=1 << 30, block_tokens=opts.block_tokens)
        self.cache = cache
        self.prefill = TorchPrefillEngine(
            self.model, prefix_cache=cache, pacer=self.pacer, budget=b
        )
        self.decode = TorchDecodeEngine(self.model, pacer=self.pacer, budget=b)
        self.counts = _Counts()
        self.reset_lock = asyncio.Lock()
        self.main_port = 0
        self.reset_port = 0
        self.sender: KVSender | None = None
        self.reset_sender: KVSender | None = None

    # ------------------------------------------------------------------ setup

    async def make_proxy(self, name: str) -> int:
        """A proxy to the receiver with the hostile link's latency, jitter and bandwidth cap."""
        o = self.opts
        p = await self.link.create_proxy(name, upstream=f"127.0.0.1:{self.rx.port}")
        await self.link.add_toxic(
            name,
            "latency",
            attributes={"latency": o.latency_ms, "jitter": o.jitter_ms},
            stream="both",
            name="rtt",
        )
        await self.link.set_link_bandwidth(name, o.bandwidth)
        return int(str(p["listen"]).rsplit(":", 1)[1])

    # ------------------------------------------------------------------ one prompt

    async def prompt(self, i: int, tokens: list[int], rng: random.Random) -> None:
        o, c = self.opts, self.counts
        want = generate(self.model, tokens, o.max_new_tokens)
        # 1. cold remote prefill; it also fills the prefix cache with this prompt's blocks
        rid = f"p{i}"
        got, res = await self.remote(rid, tokens)
        if got == want:
            c.token_exact += 1
        else:
            c.fail(f"{rid}: remote {got} != local {want}")
        if res is None:
            return
        # 2. the next turn of the conversation: this prompt plus more. The pool keeps the linear
        # states only at the end of each cached request (exact-length reuse), so the reusable
        # prefix is this prompt's whole blocks; the prefill must compute only the rest.
        bt = o.block_tokens
        k = len(tokens) // bt
        suffix = [rng.randrange(o.model.vocab_size) for _ in range(rng.randint(1, 2 * bt))]
        other = tokens + suffix
        want2 = generate(self.model, other, o.max_new_tokens)
        got2, res2 = await self.remote(f"{rid}-hit", other)
        hit = res2.cached_tokens if res2 is not None else 0
        c.prefix_hit_tokens += hit
        if hit == k * bt and got2 == want2:
            c.prefix_hit_exact += 1
        else:
            c.fail(f"{rid}-hit: cached {hit} of {k * bt} tokens, tokens {got2} vs {want2}")
        # 3. the same KV (transfer cache) through a link that is cut half-way, then retried
        async with self.reset_lock:
            got3, retries = await self.resend_with_reset(f"{rid}-reset", res)
        if got3 == want and retries >= 1:
            c.reset_retried_exact += 1
        else:
            c.fail(f"{rid}-reset: retries {retries}, tokens {got3} vs {want}")
        # 4. a flipped byte: detected, failed with a reason, never decoded; then re-sent
        detected = await self.send_corrupted(f"{rid}-flip", res, rng)
        if detected:
            c.corrupt_detected += 1
        got4 = await self.resend(f"{rid}-flip-retry", res)
        if got4 == want:
            c.corrupt_retried_exact += 1
        else:
            c.fail(f"{rid}-flip-retry: tokens {got4} vs {want}")

    # ------------------------------------------------------------------ transfer paths

    async def remote(
        self, rid: str, tokens: Sequence[int]
    ) -> tuple[list[int] | None, PrefillResult | None]:
        """Prefill streaming layer by layer through the link, then decode from the bytes."""
        assert self.sender is not None
        sizes = self.prefill.layer_sizes(len(tokens))
        self.rx.expect(rid)  # the receiver accepts frames only for ids it expects
        try:
            async with self.sender.open(rid, sizes) as tx:
                res = await self.prefill.run(tokens, tx.send_layer)
                await tx.finish(timeout=_TIMEOUT)
        except TransferError as exc:
            self.counts.fail(f"{rid}: transfer failed: {exc.reason}")
            return None, None
        self.counts.kv_bytes += sum(sizes)
        return await self.decode_received(rid, res.first_token), res

    async def resend(self, rid: str, res: PrefillResult) -> list[int] | None:
        assert self.sender is not None
        try:
            await self.send(self.sender, rid, res)
        except TransferError as exc:
            self.counts.fail(f"{rid}: transfer failed: {exc.reason}")
            return None
        return await self.decode_received(rid, res.first_token)

    async def send(self, sender: KVSender, rid: str, res: PrefillResult) -> int:
        """Send a finished prefill's layers; returns how many retries the transfer needed."""
        self.rx.expect(rid)
        async with sender.open(rid, res.layer_sizes) as tx:
            for layer, data in enumerate(res.layers):
                await tx.send_layer(layer, data)
            result = await tx.finish(timeout=_TIMEOUT)
        self.counts.kv_bytes += sum(res.layer_sizes)
        self.counts.transfer_retries += result.retries
        return result.retries

    async def decode_received(self, rid: str, first_token: int) -> list[int] | None:
        try:
            manifest = await self.rx.wait(rid, _TIMEOUT)
            if not manifest.verified:
                self.counts.fail(f"{rid}: KV complete but not verified")
                return None
            payload = self.rx.take_payload(rid)
        except (TransferError, TimeoutError, KeyError) as exc:
            self.counts.fail(f"{rid}: receiver: {exc!r}")
            return None
        finally:
            self.rx.discard(rid)
        state = self.decode.restore(payload)
        return await self.decode.generate(state, first_token, self.opts.max_new_tokens)

    async def resend_with_reset(self, rid: str, res: PrefillResult) -> tuple[list[int] | None, int]:
        """Cut the connection after about half the KV (limit_data), lift the cut once the
        sender has noticed, and let its retry finish the transfer."""
        sender = self.reset_sender
        assert sender is not None
        name = "cut"
        cut_at = sum(res.layer_sizes) // 2
        await self.link.add_toxic(
            "xdc-reset", "limit_data", attributes={"bytes": cut_at}, stream="upstream", name=name
        )
        self.counts.resets_injected += 1
        losses = sender.stats().connection_losses

        async def lift() -> None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(_TIMEOUT):
                    while sender.stats().connection_losses == losses:
                        await asyncio.sleep(0.002)
            await self.link.remove_toxic("xdc-reset", name)

        lifter = asyncio.get_running_loop().create_task(lift())
        try:
            retries = await self.send(sender, rid, res)
        except TransferError as exc:
            self.counts.fail(f"{rid}: transfer failed: {exc.reason}")
            return None, 0
        finally:
            await lifter
        return await self.decode_received(rid, res.first_token), retries

    async def send_corrupted(self, rid: str, res: PrefillResult, rng: random.Random) -> bool:
        """True if the flipped byte was caught: the transfer failed citing the checksum, the
        receiver failed the request, and its payload cannot be taken for decoding."""
        first_payload = min(res.layer_sizes[0], self.opts.chunk_size)
        flip_at = 48 + len(rid.encode()) + rng.randrange(first_payload)
        async with (
            FaultProxy(self.main_port, flip_at=flip_at) as flip,
            KVSender(
                "127.0.0.1", flip.port, connections=1, chunk_size=self.opts.chunk_size,
                max_retries=0, ack_timeout=5.0,
            ) as sender,
        ):  # fmt: skip
            try:
                await self.send(sender, rid, res)
            except TransferError as exc:
                reason = exc.reason
            else:
                self.counts.fail(f"{rid}: corrupted transfer reported success")
                self.rx.discard(rid)
                return False
        caught = "checksum" in reason.lower() and flip.flips_done == 1
        caught = caught and self.rx.status(rid) == "failed"
        try:
            self.rx.take_payload(rid)
            caught = False  # a failed request must never hand out bytes
        except KeyError:
            pass
        self.rx.discard(rid)
        if not caught:
            self.counts.fail(f"{rid}: corruption not attributed to the checksum: {reason}")
        return caught


@contextlib.asynccontextmanager
async def _deployment(opts: VerifyOptions) -> AsyncIterator[_Harness]:
    async with (
        KVReceiver(keep_payload=True, frame_timeout=10.0) as rx,
        await start_link_server(host="127.0.0.1", port=0, seed=opts.seed) as server,
        LinkClient(server.url) as link,
    ):
        h = _Harness(opts, rx, link)
        h.main_port = await h.make_proxy("xdc")
        h.reset_port = await h.make_proxy("xdc-reset")
        async with (
            KVSender(
                "127.0.0.1", h.main_port, connections=opts.connections,
                chunk_size=opts.chunk_size, max_retries=2,
            ) as sender,
            KVSender(
                "127.0.0.1", h.reset_port, connections=1, chunk_size=opts.chunk_size,
                max_retries=3, ack_timeout=5.0,
            ) as reset_sender,
        ):  # fmt: skip
            h.sender, h.reset_sender = sender, reset_sender
            yield h


def random_prompts(opts: VerifyOptions) -> list[list[int]]:
    rng = random.Random(opts.seed)
    return [
        [
            rng.randrange(opts.model.vocab_size)
            for _ in range(rng.randint(opts.min_prompt_tokens, opts.max_prompt_tokens))
        ]
        for _ in range(opts.prompts)
    ]


async def run_verify(opts: VerifyOptions) -> dict[str, Any]:
    """Run every check for every prompt; the report's `ok` is True only if all were exact."""
    t0 = time.monotonic()
    prompts = random_prompts(opts)
    async with _deployment(opts) as h:
        gate = asyncio.Semaphore(opts.concurrency)

        async def one(i: int, tokens: list[int]) -> None:
            async with gate:
                await h.prompt(i, tokens, random.Random(opts.seed * 1_000_003 + i))

        async with asyncio.TaskGroup() as tg:
            for i, tokens in enumerate(prompts):
                tg.create_task(one(i, tokens))
        rx_stats = h.rx.stats()
    c, n, cfg = h.counts, opts.prompts, opts.model
    checks = (
        c.token_exact,
        c.prefix_hit_exact,
        c.reset_retried_exact,
        c.corrupt_detected,
        c.corrupt_retried_exact,
    )
    return {
        "prompts": n,
        "token_exact": c.token_exact,
        "prefix_hit_exact": c.prefix_hit_exact,
        "reset_retried_exact": c.reset_retried_exact,
        "corrupt_detected": c.corrupt_detected,
        "corrupt_retried_exact": c.corrupt_retried_exact,
        "ok": all(v == n for v in checks),
        "prefix_hit_tokens": c.prefix_hit_tokens,
        "resets_injected": c.resets_injected,
        "transfer_retries": c.transfer_retries,
        "checksum_failures": rx_stats.checksum_failures,
        "kv_bytes_sent": c.kv_bytes,
        "max_new_tokens": opts.max_new_tokens,
        "prompt_tokens": [opts.min_prompt_tokens, opts.max_prompt_tokens],
        "model": {
            "layers": "".join("F" if k == "full" else "L" for k in cfg.layer_kinds),
            "d_model": cfg.d_model,
            "vocab": cfg.vocab_size,
            "dtype": cfg.dtype,
            "linear_state_bytes": cfg.state_bytes(),
            "latent_bytes_per_token": cfg.block_bytes(1),
        },
        "link": {
            "latency": f"{opts.latency_ms}ms",
            "jitter": f"{opts.jitter_ms}ms",
            "bandwidth": format_bandwidth(opts.bandwidth),
            "connections": opts.connections,
        },
        "timing": h.pacer.stats() if h.pacer is not None else None,
        "failures": c.failures,
        "elapsed_s": round(time.monotonic() - t0, 2),
    }
