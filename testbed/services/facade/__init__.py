"""The router-facing worker API: the PD handshake an external router (SGLang's gateway,
vllm-router) speaks, served as extra routes on a prefill or decode worker's own app, so the
router runs unchanged in front of the emulated fleet (docs/real-routers.md).

Two flavours (ServiceSpec.facade). `sglang`: the gateway sends the same OpenAI request to a
prefill and a decode worker at once, adding `bootstrap_host`, `bootstrap_port` and
`bootstrap_room`; the decode half registers the KV under a fresh wire id with the prefill's
bootstrap route, and the prefill half sends layer by layer as it computes. `vllm`: vllm-router
asks the prefill first; its half prefills, holds the KV under a handle and answers one token
with `kv_transfer_params` naming itself and the handle; the router hands those to a decode,
whose half pulls the held KV through the same bootstrap route. Both halves prefill and decode
by the rules our own router's requests follow (services.prefilling, services.decoding), and
journal every attempt (facade.journal) for the run's records.

- openai:         the request fields both halves read, where they meet, the response shapes
- info, render:   registration, load, /metrics' companions, /render and /tokenize
- rooms:          the rooms (or KV handles) and the bootstrap route where the halves meet
- sglang_prefill: the `sglang` prefill half
- vllm_prefill:   the `vllm` prefill half
- decode_half:    the decode half (both flavours)
- routes:         the routes of each flavour on a worker's app
- journal:        the attempts each half saw, for the runner (`GET /facade/attempts`)
"""

from __future__ import annotations

from testbed.services.facade.routes import add_decode_routes, add_prefill_routes

__all__ = ["add_decode_routes", "add_prefill_routes"]
