"""The global KVCache manager: one hybrid prefix pool per cluster, and the byte model of a request.

The router owns one manager. It knows which cluster holds which prefix because every prefill
that succeeds is inserted into the pool of the cluster that computed it, and every prefix pulled
across the link is inserted into the pool of the cluster it arrived in. Nothing else moves a
prefix between clusters: the KV a PrfaaS prefill sends to a PD-D instance is transfer cache (the
paper: freed once sent), not prefix cache of the local cluster.

Byte model of one request with l input tokens (`plan_request`):

- The prefill reuses the longest prefix its own cluster holds (block-level KV plus, for a hybrid
  model, the linear-attention state at exactly that length; `HybridPrefixPool.match`) and
  computes the rest. This holds for every policy: a cache-blind policy only routes without
  looking at the cache, the engine it lands on still uses its cluster's cache.
- If the route asks for a pull, the other cluster's longer prefix is moved first; when it
  arrives, the prefill reuses it. A pull that fails or cannot be made leaves the prefill
  computing from its own cluster's prefix.
- The KV sent to the decode instance (always in the local cluster) is S_kv(l - h): the
  linear-attention state at l plus the full-attention KV of the tokens after the h leading
  tokens whose blocks the local cluster already holds (`with_state=False`: the state arrives
  with the KV anyway). A PD-P request's KV stays inside the datacenter; a PrfaaS request's KV
  crosses the link, so a local prefix also shrinks what crosses.
- A pull of p tokens moves S_kv(p): the state at the pulled length plus p tokens of blocks.

The manager does no I/O and reads no clock, so its decisions are unit-testable.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from testbed.frozen import quick_init
from testbed.kvcache.pool import BLOCK_TOKENS, ChainKeys, HybridPrefixPool
from testbed.policy.base import Cluster
from testbed.profiles.base import ModelProfile

if TYPE_CHECKING:
    from testbed.config import DeploymentConfig

__all__ = [
    "CLUSTERS",
    "HOST_DRAM_BYTES",
    "POOL_DRAM_FRACTION",
    "CacheLookup",
    "CachePlan",
    "KVCacheManager",
    "cluster_capacities",
    "default_capacity",
    "plan_request",
]

CLUSTERS: tuple[Cluster, Cluster] = ("prfaas", "local")
TIB = 2**40

HOST_DRAM_BYTES: dict[str, float] = {"h200x8": 2 * TIB, "h20x8": 2 * TIB}
"""Host memory of one 8-GPU instance. The pool lives in host DRAM, as Mooncake's KVCache pool
does (the paper's system is built on it): HBM holds the weights of a 1T model and the running
batch, not a cluster-wide prefix cache. 2 TiB is the usual memory of an 8-GPU HGX server; the
paper gives no figure, so this is our assumption."""
POOL_DRAM_FRACTION = 0.5
"""Share of host memory given to the prefix pool; the rest is the OS, the serving process and
staging buffers. With both: 1 TiB per instance, 4 TiB for 4 PrfaaS instances, 8 TiB for 8 PD
instances. Caching every prompt of the Mooncake synthetic trace takes about 0.26 TB for its
first 1,000 requests and 0.64 TB for all 3,993 with the internal 1T model, so the default never
evicts there; set `prefix_cache` on a cluster to study eviction."""


def default_capacity(hardware: str, instances: int) -> float:
    """Bytes of prefix cache a cluster of `instances` x `hardware` holds by default."""
    return HOST_DRAM_BYTES.get(hardware, 2 * TIB) * POOL_DRAM_FRACTION * instances


def cluster_capacities(dep: DeploymentConfig) -> dict[Cluster, float]:
    """Prefix cache bytes per cluster of a deployment: `prefix_cache` when set, else the
    default from its hardware and instance count."""
    out: dict[Cluster, float] = {}
    for name in CLUSTERS:
        cluster = dep.prfaas if name == "prfaas" else dep.local
        if cluster is not None:
            out[name] = (
                cluster.prefix_cache
                if cluster.prefix_cache is not None
                else default_capacity(cluster.hardware, cluster.instances)
            )
    return out


@quick_init
@dataclass(frozen=True)
class CacheLookup:
    """What each cluster holds of one prompt, in tokens."""

    local: int = 0
    """Longest reusable prefix in the local PD cluster (blocks and state)."""
    prfaas: int = 0
    local_kv: int = 0
    """Leading tokens whose full-attention blocks the local cluster holds (no state needed)."""

    def of(self, cluster: Cluster) -> int:
        return self.local if cluster == "local" else self.prfaas


@quick_init
@dataclass(frozen=True)
class CachePlan:
    """How one request uses the cache once routed (see the module docstring)."""

    prefill_tokens: int
    """Tokens the prefill computes."""
    reused_tokens: int
    """Prefix the prefill reuses from its cluster's pool (after the pull, if any)."""
    kv_tokens: int
    """Tokens whose KV the decode instance receives: S_kv(kv_tokens) goes on the wire."""
    pull_tokens: int = 0
    pull_from: Cluster | None = None


def _other(cluster: Cluster) -> Cluster:
    return "local" if cluster == "prfaas" else "prfaas"


def plan_request(
    input_tokens: int, look: CacheLookup, cluster: Cluster, pull_tokens: int = 0
) -> CachePlan:
    """The byte model for a request prefilled in `cluster`, assuming a pull of `pull_tokens`
    from the other cluster succeeds (pass 0 for no pull or after a failed pull)."""
    here = min(look.of(cluster), max(input_tokens - 1, 0))
    pull = 0
    if pull_tokens > 0:
        best = min(here + pull_tokens, look.of(_other(cluster)), max(input_tokens - 1, 0))
        pull = max(best - here, 0)
    reused = here + pull
    held_by_decode = look.local_kv
    if cluster == "local" and pull:
        held_by_decode = max(held_by_decode, reused)
    held_by_decode = min(held_by_decode, max(input_tokens - 1, 0))
    return CachePlan(
        prefill_tokens=max(input_tokens - reused, 1),
        reused_tokens=reused,
        kv_tokens=max(input_tokens - held_by_decode, 1),
        pull_tokens=pull,
        pull_from=_other(cluster) if pull else None,
    )


@dataclass
class _Counters:
    prefills: int = 0
    reused_tokens: int = 0
    computed_tokens: int = 0
    inserts: int = 0
    pulls_in: int = 0
    pulled_tokens: int = 0


@dataclass
class KVCacheManager:
    """One `HybridPrefixPool` per cluster, sized from the model's KV layout."""

    pools: dict[Cluster, HybridPrefixPool]
    counters: dict[Cluster, _Counters] = field(
        default_factory=lambda: {c: _Counters() for c in CLUSTERS}
    )

    @classmethod
    def for_model(
        cls,
        model: ModelProfile,
        capacity: Mapping[Cluster, float],
        *,
        block_tokens: int = BLOCK_TOKENS,
    ) -> KVCacheManager:
        """Pools of `capacity[cluster]` bytes; block and state sizes from the model profile:
        a block is `block_tokens` of full-attention KV (S_kv's length-dependent part), the state
        is its fixed part (zero for a dense model, whose pool then matches block by block)."""
        span = 64 * block_tokens
        per_block = (model.kv_bytes(span) - model.state_bytes) / 64
        pools: dict[Cluster, HybridPrefixPool] = {}
        for cluster in CLUSTERS:
            if cluster in capacity:
                pools[cluster] = HybridPrefixPool(
                    capacity[cluster],
                    block_bytes=max(per_block, 0.0),
                    state_bytes=model.state_bytes,
                    block_tokens=block_tokens,
                )
        return cls(pools)

    def lookup(self, hash_ids: Sequence[int] | ChainKeys, input_tokens: int) -> CacheLookup:
        """Cached prefix of a prompt in each cluster (the local pool's blocks found move to its
        LRU end: the decode side will use them). Pass the request's ChainKeys (the same one to
        its inserts) to hash each block once."""
        if not len(hash_ids):
            return CacheLookup()
        hash_ids = hash_ids if isinstance(hash_ids, ChainKeys) else ChainKeys(hash_ids)
        found: dict[str, int] = {}
        local_kv = 0  # the local pool's blocks alone: what the decode side holds
        for cluster, pool in self.pools.items():
            if cluster == "local":
                found[cluster], local_kv = pool.lookup(hash_ids, input_tokens)
            else:
                found[cluster] = pool.match(hash_ids, input_tokens, record=False)
        return CacheLookup(found.get("local", 0), found.get("prfaas", 0), local_kv)

    def insert(self, cluster: Cluster, hash_ids: Sequence[int] | ChainKeys, tokens: int) -> int:
        """Cache a prefix computed in (or pulled into) `cluster`; returns blocks kept."""
        pool = self.pools.get(cluster)
        if pool is None or not len(hash_ids) or tokens <= 0:
            return 0
        self.counters[cluster].inserts += 1
        return pool.insert(hash_ids, tokens)

    def record_prefill(self, cluster: Cluster, plan: CachePlan) -> None:
        """Count a prefill that ran: what it reused and what it computed."""
        c = self.counters[cluster]
        c.prefills += 1
        c.reused_tokens += plan.reused_tokens
        c.computed_tokens += plan.prefill_tokens
        if plan.pull_tokens:
            c.pulls_in += 1
            c.pulled_tokens += plan.pull_tokens

    def stats(self) -> dict[str, Any]:
        """Per cluster: pool occupancy and the counters, JSON-ready."""
        out: dict[str, Any] = {}
        for cluster, pool in self.pools.items():
            s = pool.stats()
            c = self.counters[cluster]
            out[cluster] = {
                "capacity_bytes": s.capacity_bytes,
                "used_bytes": s.used_bytes,
                "blocks": s.blocks,
                "states": s.states,
                "evictions": s.evictions,
                "prefills": c.prefills,
                "reused_tokens": c.reused_tokens,
                "computed_tokens": c.computed_tokens,
                "inserts": c.inserts,
                "pulls_in": c.pulls_in,
                "pulled_tokens": c.pulled_tokens,
            }
        return out
