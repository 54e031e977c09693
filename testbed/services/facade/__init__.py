"""The router-facing worker API: the PD handshake an external router (SGLang's gateway, and to
come vllm-router) speaks, served as extra routes on a prefill or decode worker's own app, so the
router runs unchanged in front of the emulated fleet (docs/real-routers.md).

Only the `sglang` flavour exists so far (ServiceSpec.facade): the gateway sends the same
OpenAI request to a prefill and a decode worker at once, adding `bootstrap_host`,
`bootstrap_port` and `bootstrap_room`; the two halves meet through the prefill's bootstrap route
by room. The decode half (facade.decode_half) registers the KV under a fresh wire id, tells the
prefill's bootstrap route (facade.rooms) who it is, waits for the KV, verifies it, then streams;
the prefill half queues at once and sends layer by layer once the room's decode registered.
Both halves prefill and decode by the rules our own router's requests follow
(services.prefilling, services.decoding), and journal every attempt (facade.journal) for the
run's records.

- openai:      the request fields both halves read, and the response shapes
- info:        /server_info, /model_info, /v1/models, /get_load (the gateway's registration)
- rooms:       the prefill half and the bootstrap route
- decode_half: the decode half
- journal:     the attempts each half saw, for the runner (`GET /facade/attempts`)
"""

from __future__ import annotations

from testbed.services.facade.decode_half import add_decode_routes
from testbed.services.facade.rooms import add_prefill_routes

__all__ = ["add_decode_routes", "add_prefill_routes"]
