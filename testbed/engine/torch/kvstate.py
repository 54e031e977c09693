"""The KV a request carries between prefill and decode: what is real about "KVCache" here.

Per linear layer: one fixed-size recurrent state tensor (heads x d_v x d_k), whatever the length.
Per full layer: the cached rows [latent, rotated rope key] of every token so far, kept as a list
of chunks so appending a decode step never copies the past. Tensors are never modified in place,
so a state can share tensors with a prefix cache or a snapshot without defensive copies.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

__all__ = ["KVState"]


@dataclass
class KVState:
    """Everything a decoder needs to continue after `n_tokens` tokens."""

    n_tokens: int = 0
    linear: dict[int, torch.Tensor] = field(default_factory=dict)
    """Layer index -> recurrent state (heads, d_v, d_k)."""
    latents: dict[int, list[torch.Tensor]] = field(default_factory=dict)
    """Layer index -> chunks of (tokens, latent_width) rows covering [0, n_tokens)."""

    def latent_rows(self, layer: int) -> torch.Tensor:
        """All cached rows of a full layer as one freshly allocated tensor.

        Always a new allocation (even for one chunk), so the attention arithmetic sees the same
        memory alignment whether the rows were computed here, came from a prefix cache or off
        the wire: float results cannot depend on where the bytes came from.
        """
        return torch.cat(self.latents[layer], dim=0)

    def copy(self) -> KVState:
        """A state that can advance independently (tensors are shared: they are immutable)."""
        return KVState(
            self.n_tokens,
            dict(self.linear),
            {k: list(v) for k, v in self.latents.items()},
        )
