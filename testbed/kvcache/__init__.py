"""The hybrid prefix cache: per-cluster block pools and the global index of cached prefixes."""

from testbed.kvcache.pool import BLOCK_TOKENS, ChainKeys, HybridPrefixPool, PoolStats, chain_keys

__all__ = ["BLOCK_TOKENS", "ChainKeys", "HybridPrefixPool", "PoolStats", "chain_keys"]
