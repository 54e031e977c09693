"""The serving processes: router, prefill worker and decode worker, each an aiohttp app."""
