"""least-ttft: an example outside scheduler for prfaas-testbed.

Each prefill goes to the instance with the least predicted time to first token: the queue
ahead of it, its own prefill on that instance's hardware, and (for PrfaaS) the KV's trip over
the link at the link's estimated bandwidth behind the bytes already in flight. Decode goes to
the least-loaded local decode instance. The same prediction (`core`) serves both forms:
`least_ttft.plugin:LeastTTFT` (a Python plugin, entry point `least-ttft`) and
`python -m least_ttft.server --port N` (the HTTP decision protocol, prfaas-policy/1).
"""
