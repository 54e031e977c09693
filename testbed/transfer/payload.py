"""Cheap, deterministic KV bytes for the emulated engine.

The emulated engine has no tensors, yet the transfer path must move real bytes at hundreds of MB/s
on a 2-core machine. Generating random bytes per request would cost more CPU than sending them, so
`PayloadSource` draws one random buffer up front and hands out zero-copy memoryview slices of it.
Offsets depend only on (request id, layer), so a receiver that keeps payloads can check them
against the same source built with the same seed.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

import numpy as np

__all__ = ["PayloadSource", "split_layers"]


class PayloadSource:
    """Slices of one pre-generated random buffer (`size` bytes from a seeded generator)."""

    def __init__(self, size: int = 32 << 20, seed: int = 0) -> None:
        if size <= 0:
            raise ValueError("payload source size must be positive")
        self._buf = np.random.default_rng(seed).bytes(size)
        self._view = memoryview(self._buf)
        self.size = size
        self.seed = seed

    def layer(self, request_id: str, layer: int, nbytes: int) -> memoryview:
        """`nbytes` deterministic bytes for one layer of one request, without copying."""
        if nbytes < 0:
            raise ValueError("nbytes must be >= 0")
        if nbytes > self.size:
            raise ValueError(
                f"layer of {nbytes} bytes exceeds the payload source ({self.size} bytes); "
                "build a larger PayloadSource"
            )
        span = self.size - nbytes + 1
        start = zlib.crc32(f"{request_id}/{layer}".encode()) % span
        return self._view[start : start + nbytes]

    def layers(self, request_id: str, layer_sizes: Sequence[int]) -> list[memoryview]:
        """One slice per layer, as `layer` would return them."""
        return [self.layer(request_id, i, n) for i, n in enumerate(layer_sizes)]


def split_layers(total_bytes: int, n_layers: int) -> tuple[int, ...]:
    """Split `total_bytes` into `n_layers` near-equal layer sizes (the remainder goes first)."""
    if n_layers <= 0 or total_bytes < 0:
        raise ValueError("need n_layers > 0 and total_bytes >= 0")
    base, extra = divmod(total_bytes, n_layers)
    return tuple(base + (1 if i < extra else 0) for i in range(n_layers))
