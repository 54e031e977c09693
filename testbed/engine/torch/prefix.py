"""The hybrid prefix cache holding real tensors, on top of kvcache.pool.HybridPrefixPool.

The pool decides what is reusable (chained block keys; the linear state only at an exact block
boundary); this module decides what the entries hold: per block, every full layer's latent rows
for that block; per boundary, every linear layer's state after exactly that many tokens. A hit
gives a KVState for the cached prefix, from which a prefill computes only the suffix.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from testbed.engine.torch.config import TinyConfig
from testbed.engine.torch.kvstate import KVState
from testbed.kvcache.pool import HybridPrefixPool

__all__ = ["PrefixHit", "TorchPrefixCache", "block_hash_ids"]


def block_hash_ids(tokens: Sequence[int], block_tokens: int) -> list[int]:
    """One id per full block of token ids (the pool chains them into prefix keys)."""
    out = []
    for b in range(len(tokens) // block_tokens):
        block = tokens[b * block_tokens : (b + 1) * block_tokens]
        raw = b"".join(int(t).to_bytes(4, "little") for t in block)
        out.append(int.from_bytes(hashlib.blake2b(raw, digest_size=8).digest(), "little") >> 1)
    return out


@dataclass(frozen=True)
class PrefixHit:
    """What a lookup found: `tokens` cached tokens and their KV (None on a miss)."""

    tokens: int
    state: KVState | None


class TorchPrefixCache:
    """One cluster's prefix cache for the tiny model, sized in the model's real bytes."""

    def __init__(self, config: TinyConfig, capacity_bytes: float, block_tokens: int = 16) -> None:
        if block_tokens % config.chunk_tokens:
            raise ValueError(
                f"block_tokens {block_tokens} must be a multiple of the prefill chunk "
                f"({config.chunk_tokens}) so cached boundaries are chunk boundaries"
            )
        self.config = config
        self.block_tokens = block_tokens
        self.pool = HybridPrefixPool(
            capacity_bytes,
            block_bytes=config.block_bytes(block_tokens),
            state_bytes=config.state_bytes(),
            block_tokens=block_tokens,
        )

    def lookup(self, tokens: Sequence[int]) -> PrefixHit:
        """The longest reusable prefix (always leaving at least one token to prefill)."""
        ids = block_hash_ids(tokens, self.block_tokens)
        cached = self.pool.match(ids, len(tokens))
        if cached == 0:
            return PrefixHit(0, None)
        blocks, linear = self.pool.payloads(ids, cached // self.block_tokens)
        state = KVState(n_tokens=cached, linear=dict(linear))
        for layer, kind in enumerate(self.config.layer_kinds):
            if kind == "full":
                state.latents[layer] = [block[layer] for block in blocks]
        return PrefixHit(cached, state)

    def snapshot_point(self, n_tokens: int) -> int | None:
        """Where a prefill of n_tokens should snapshot its linear states for `store`."""
        at = (n_tokens // self.block_tokens) * self.block_tokens
        return at or None

    def store(
        self, tokens: Sequence[int], state: KVState, snapshot: dict[int, torch.Tensor]
    ) -> int:
        """Cache the full blocks of a finished prefill; returns how many blocks are reusable.

        `state` must cover all of `tokens`; `snapshot` holds the linear states at
        `snapshot_point(len(tokens))` tokens (PrefillRun.snapshot).
        """
        n = len(tokens)
        full = n // self.block_tokens
        if full == 0 or state.n_tokens < full * self.block_tokens:
            return 0
        bt = self.block_tokens
        rows = {layer: state.latent_rows(layer) for layer in state.latents}
        payloads = [
            {layer: r[b * bt : (b + 1) * bt].clone() for layer, r in rows.items()}
            for b in range(full)
        ]
        linear = dict(snapshot) if self.pool.needs_state else None
        if linear is not None and set(linear) != set(state.linear):
            raise ValueError("snapshot does not hold every linear layer's state")
        return self.pool.insert(
            block_hash_ids(tokens, bt), n, block_payloads=payloads, state_payload=linear
        )
