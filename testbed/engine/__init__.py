"""Engines: how long prefill and decode take and what KV they emit (emulated or real model)."""
