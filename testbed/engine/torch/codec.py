"""KV <-> bytes, one self-describing record per layer, so real tensors ride the KV transfer path.

Each layer is a 32-byte little-endian header followed by the raw tensor bytes:

    off size field
    0   4    magic        b"TKV1"
    4   1    kind         1 linear (recurrent state), 2 full (latent rows)
    5   1    dtype        config.DTYPE_CODES
    6   2    layer        layer index
    8   4    start        first token whose latent rows follow (full layers)
    12  4    end          tokens covered: the state is after `end` tokens, rows are [start, end)
    16  8    fingerprint  TinyConfig.fingerprint(): KV from another model or seed is refused
    24  8    reserved     0

The transfer layer already checksums every frame; the header is here so a decode instance can
refuse KV that is intact but wrong (another model, a layer out of place, a short layer) with a
reason instead of decoding garbage. Bytes are copied into fresh tensors on the way in: the
receiver's buffers stay the receiver's, and fresh allocations keep the arithmetic bit-identical
(see kvstate.py).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

import torch

from testbed.engine.torch.config import DTYPE_CODES, LAYER_HEADER_BYTES, TinyConfig
from testbed.engine.torch.kvstate import KVState

__all__ = ["KVFormatError", "decode_layers", "encode_layer"]

MAGIC = b"TKV1"
_HEADER = struct.Struct("<4sBBHII8s8x")
assert _HEADER.size == LAYER_HEADER_BYTES
_KIND_CODES = {"linear": 1, "full": 2}

Buffer = bytes | bytearray | memoryview


class KVFormatError(ValueError):
    """Received KV that does not fit this model: never decoded, the reason says why."""


def encode_layer(
    config: TinyConfig, state: KVState, layer: int, start: int = 0, end: int | None = None
) -> bytes:
    """Layer `layer` of `state` as bytes; full layers carry latent rows [start, end).

    `end` defaults to state.n_tokens; a prefill in progress passes its prompt length, since a
    finished layer already covers every prompt token while later layers are still computing.
    """
    kind = config.layer_kinds[layer]
    end = state.n_tokens if end is None else end
    tensor = state.linear[layer] if kind == "linear" else state.latent_rows(layer)[start:end]
    header = _HEADER.pack(
        MAGIC,
        _KIND_CODES[kind],
        DTYPE_CODES[config.dtype][0],
        layer,
        start,
        end,
        config.fingerprint(),
    )
    body = tensor.contiguous().numpy().tobytes()
    return header + body


def decode_layers(
    config: TinyConfig, layers: Sequence[Buffer], prefix: KVState | None = None
) -> KVState:
    """Rebuild a KVState from one record per layer (in layer order).

    If the records carry latent rows from `start` > 0, `prefix` must hold rows [0, start) (a
    decode-side prefix cache); its linear states are ignored, the received ones are complete.
    Raises KVFormatError naming the first problem.
    """
    kinds = config.layer_kinds
    if len(layers) != len(kinds):
        raise KVFormatError(f"got {len(layers)} layers, the model has {len(kinds)}")
    fp = config.fingerprint()
    dtype = getattr(torch, config.dtype)
    span: tuple[int, int] | None = None
    state = KVState()
    for i, raw in enumerate(layers):
        view = memoryview(raw).cast("B")
        if len(view) < LAYER_HEADER_BYTES:
            raise KVFormatError(f"layer {i}: {len(view)} bytes, shorter than its header")
        magic, kind, dt, index, start, end, got_fp = _HEADER.unpack_from(view)
        if magic != MAGIC:
            raise KVFormatError(f"layer {i}: bad magic {magic!r}")
        if index != i or kind != _KIND_CODES[kinds[i]]:
            raise KVFormatError(f"layer {i}: header says layer {index} kind {kind}")
        if dt != DTYPE_CODES[config.dtype][0] or got_fp != fp:
            raise KVFormatError(f"layer {i}: KV is from another model config (dtype/fingerprint)")
        if span is None:
            span = (start, end)
        elif (start, end) != span and kinds[i] == "full":
            raise KVFormatError(f"layer {i}: token range [{start}, {end}) differs from {span}")
        want = config.layer_sizes(start, end)[i]
        if len(view) != want:
            raise KVFormatError(f"layer {i}: {len(view)} bytes, expected {want}")
        body = view[LAYER_HEADER_BYTES:]
        tensor = torch.frombuffer(bytearray(body), dtype=dtype) if len(body) else None
        if kinds[i] == "linear":
            assert tensor is not None
            h, d = config.linear_heads, config.linear_head_dim
            state.linear[i] = tensor.view(h, d, d).clone()
            continue
        rows: list[torch.Tensor] = []
        if start > 0:
            if prefix is None or prefix.n_tokens != start:
                have = None if prefix is None else prefix.n_tokens
                raise KVFormatError(
                    f"layer {i}: rows start at token {start}, decode holds a prefix of {have}"
                )
            rows.extend(prefix.latents[i])
        if tensor is not None:
            rows.append(tensor.view(end - start, config.latent_width).clone())
        state.latents[i] = rows
    assert span is not None
    state.n_tokens = span[1]
    return state
