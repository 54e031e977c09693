"""The real-model engine: a tiny hybrid-attention decoder (torch, CPU) whose real KV tensors take
the same transfer path as the emulated engine's bytes, to show that path is lossless.

The modules that compute import torch (the optional `model` extra); `config`, `pacing` and
`live` do not, and this package's names load lazily, so sizing KV or pacing steps works
without torch. Nothing outside this package imports torch at import time.

The package is named `torch` after the engine kind (`engine: torch`); every module uses absolute
imports, so `import torch` inside it is the library, never this package.

- config:   TinyConfig, its layer layout (3 linear : 1 full) and KV byte sizes (torch-free)
- model:    TinyHybridLM (gated-delta-rule linear layers, MLA latent full layers), generate()
- kvstate:  KVState, the per-layer recurrent states and latent rows of a request
- codec:    one self-describing byte record per layer, and back
- prefix:   TorchPrefixCache, real tensors in kvcache.pool.HybridPrefixPool
- pacing:   CpuPacer, pads steps to the hardware profile / time_scale, records late steps
- engine:   TorchPrefillEngine / TorchDecodeEngine, async, layer-wise
- verify:   the `testbed verify-model` harness
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # real types for checkers; at run time names load on first use
    from testbed.engine.torch.codec import KVFormatError, decode_layers, encode_layer
    from testbed.engine.torch.config import TinyConfig
    from testbed.engine.torch.engine import PrefillResult, TorchDecodeEngine, TorchPrefillEngine
    from testbed.engine.torch.kvstate import KVState
    from testbed.engine.torch.model import PrefillRun, TinyHybridLM, generate
    from testbed.engine.torch.pacing import CpuPacer, ProfileBudget
    from testbed.engine.torch.prefix import PrefixHit, TorchPrefixCache, block_hash_ids

# Public names -> defining module, resolved on first use (PEP 562), so `config`, `pacing` and
# `live`, which do not need torch, import without it.
_EXPORTS = {
    "CpuPacer": "pacing",
    "KVFormatError": "codec",
    "KVState": "kvstate",
    "PrefillResult": "engine",
    "PrefillRun": "model",
    "PrefixHit": "prefix",
    "ProfileBudget": "pacing",
    "TinyConfig": "config",
    "TinyHybridLM": "model",
    "TorchDecodeEngine": "engine",
    "TorchPrefillEngine": "engine",
    "TorchPrefixCache": "prefix",
    "block_hash_ids": "prefix",
    "decode_layers": "codec",
    "encode_layer": "codec",
    "generate": "model",
}

__all__ = [
    "CpuPacer",
    "KVFormatError",
    "KVState",
    "PrefillResult",
    "PrefillRun",
    "PrefixHit",
    "ProfileBudget",
    "TinyConfig",
    "TinyHybridLM",
    "TorchDecodeEngine",
    "TorchPrefillEngine",
    "TorchPrefixCache",
    "block_hash_ids",
    "decode_layers",
    "encode_layer",
    "generate",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
