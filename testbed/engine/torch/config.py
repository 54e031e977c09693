"""Shape of the tiny hybrid model, and the byte sizes that follow from it (no torch needed).

The layout mirrors the paper's model family (its internal 1T model and Kimi Linear): linear-
attention layers with a fixed-size recurrent state (KDA, a gated delta rule), interleaved with
full-attention layers that cache a low-rank MLA latent per token, 3 linear : 1 full by default.
Everything is tiny so 50 prompts generate in seconds on one CPU core.

Byte sizes live here, torch-free, because the KV layout must be known *before* a prefill starts
(a transfer announces its layer sizes when it opens) and services that only route or size KV
should not have to import torch.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass
from typing import Literal

__all__ = ["DTYPE_CODES", "LAYER_HEADER_BYTES", "TinyConfig"]

LayerKind = Literal["linear", "full"]

# Wire codes of the supported float types (see codec.py) and their sizes in bytes.
DTYPE_CODES: dict[str, tuple[int, int]] = {"float32": (1, 4), "float64": (2, 8)}

LAYER_HEADER_BYTES = 32
"""Every serialized layer starts with this fixed header (see codec.py)."""


@dataclass(frozen=True)
class TinyConfig:
    """Hyper-parameters of the tiny hybrid decoder; the seed fixes every weight.

    `full_every`: every full_every-th layer (1-based) is full attention, the rest linear, so 4
    gives the paper's KDA:MLA = 3:1. `chunk_tokens` is the prefill chunk; prefix-cache blocks
    must be a multiple of it so a prefill resumed from a cached block boundary runs exactly the
    same arithmetic as a cold one (that is what makes cache hits token-exact, not just close).
    """

    vocab_size: int = 512
    d_model: int = 64
    n_layers: int = 8
    full_every: int = 4
    # linear attention (gated delta rule with a per-channel decay, KDA style)
    linear_heads: int = 2
    linear_head_dim: int = 32
    # full attention (MLA style): per token only [latent, rope key] is cached
    full_heads: int = 4
    d_nope: int = 16
    d_rope: int = 16
    d_v: int = 16
    d_latent: int = 32
    d_ff: int = 128
    chunk_tokens: int = 16
    max_positions: int = 4096
    dtype: Literal["float32", "float64"] = "float32"
    seed: int = 0

    def __post_init__(self) -> None:
        if self.n_layers < 1 or self.full_every < 1:
            raise ValueError("n_layers and full_every must be >= 1")
        if "full" not in self.layer_kinds:
            raise ValueError("the model needs at least one full-attention layer")
        if self.d_rope % 2:
            raise ValueError("d_rope must be even (rotary pairs)")
        if self.dtype not in DTYPE_CODES:
            raise ValueError(f"dtype must be one of {sorted(DTYPE_CODES)}")
        if min(self.vocab_size, self.d_model, self.chunk_tokens, self.max_positions) < 1:
            raise ValueError("sizes must be positive")

    @property
    def layer_kinds(self) -> tuple[LayerKind, ...]:
        """'linear' or 'full' per layer, in order (same convention as the paper profiles)."""
        return tuple(
            "full" if (i % self.full_every) == self.full_every - 1 else "linear"
            for i in range(self.n_layers)
        )

    @property
    def itemsize(self) -> int:
        return DTYPE_CODES[self.dtype][1]

    @property
    def state_numel(self) -> int:
        """Values in one linear layer's recurrent state: heads x d_v x d_k."""
        return self.linear_heads * self.linear_head_dim * self.linear_head_dim

    @property
    def latent_width(self) -> int:
        """Values cached per token per full layer: the KV latent plus the shared rope key."""
        return self.d_latent + self.d_rope

    def state_bytes(self) -> int:
        """Bytes of all linear layers' states: fixed, whatever the length (the paper's point)."""
        return self.layer_kinds.count("linear") * self.state_numel * self.itemsize

    def block_bytes(self, block_tokens: int) -> int:
        """Bytes of one prefix-cache block: every full layer's latents for block_tokens tokens."""
        return self.layer_kinds.count("full") * block_tokens * self.latent_width * self.itemsize

    def layer_sizes(self, start: int, end: int) -> list[int]:
        """Wire bytes per layer of a KV transfer carrying latents of tokens [start, end).

        Linear layers always carry their whole state (it summarises every token); full layers
        carry only the latent rows the receiver does not hold already.
        """
        if not 0 <= start <= end:
            raise ValueError(f"bad token range [{start}, {end})")
        state = self.state_numel * self.itemsize
        row = self.latent_width * self.itemsize
        return [
            LAYER_HEADER_BYTES + (state if kind == "linear" else (end - start) * row)
            for kind in self.layer_kinds
        ]

    def fingerprint(self) -> bytes:
        """8 bytes that differ between configs (and seeds): KV from another model is refused."""
        text = repr(sorted(asdict(self).items())).encode()
        return hashlib.blake2b(text, digest_size=8).digest()
