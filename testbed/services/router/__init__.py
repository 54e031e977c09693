"""The router: the frontend that asks the policy for a route, dispatches prefill and decode,
streams tokens back and records every request's lifecycle.

- dispatch: RouterState: routes, attempts and retries, cache-pull planning, load accounting,
  the scheduler state and loops (testbed.scheduler) it runs
- steps:    the prefill call and the decode stream of one attempt
- workers:  the HTTP calls to the instances (`Workers`; tests pass a fake)
- engines:  what a request is for the engine kind (prompt, KV size, first-token relay)
- api:      the aiohttp app: /generate, /history, /stats, /metrics, /health
- openai:   /v1/completions, /v1/chat/completions, /v1/models
- text:     the shipped tokenizer, prompt block hashes, the emulated output text
- follow:   /events, the scheduler's event stream
- intake:   request bodies, ids and token sinks shared by the endpoints
- errors:   how a request or an attempt fails
- lag:      how late the event loop wakes (a policy deadline is no sharper), for /stats
"""

from __future__ import annotations

from testbed.services.router.api import create_app

__all__ = ["create_app"]
