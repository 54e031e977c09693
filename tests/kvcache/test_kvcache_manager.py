"""The global KVCache manager and the byte model of a request with a cached prefix."""

from __future__ import annotations

import pytest

from testbed.config import DeploymentConfig
from testbed.kvcache import BLOCK_TOKENS
from testbed.kvcache.manager import (
    CacheLookup,
    KVCacheManager,
    cluster_capacities,
    default_capacity,
    plan_request,
)
from testbed.profiles import MODELS

B = BLOCK_TOKENS
HYBRID = MODELS["internal-1t-hybrid"]


def manager(capacity: float = 1e15) -> KVCacheManager:
    return KVCacheManager.for_model(HYBRID, {"prfaas": capacity, "local": capacity})


def test_pool_sizes_come_from_the_model_profile() -> None:
    pool = manager().pools["local"]
    assert pool.state_bytes == HYBRID.state_bytes  # fixed linear-attention state
    # a block is 512 tokens of full-attention KV: S_kv's length-dependent part
    per_token = (HYBRID.kv_bytes(64 * B) - HYBRID.state_bytes) / (64 * B)
    assert pool.block_bytes == pytest.approx(per_token * B)
    dense = KVCacheManager.for_model(MODELS["minimax-m2.5"], {"local": 1e15}).pools["local"]
    assert not dense.needs_state


def test_lookup_finds_the_prefix_only_where_it_was_inserted() -> None:
    m = manager()
    m.insert("prfaas", [1, 2, 3], 3 * B)
    look = m.lookup([1, 2, 3, 4], 4 * B + 7)
    assert look == CacheLookup(local=0, prfaas=3 * B, local_kv=0)
    m.insert("local", [1, 2], 2 * B + 100)
    look = m.lookup([1, 2, 3, 4], 4 * B + 7)
    assert (look.local, look.prfaas, look.local_kv) == (2 * B, 3 * B, 2 * B)
    assert m.lookup([], 4 * B) == CacheLookup()


def test_local_kv_needs_blocks_only_not_the_state() -> None:
    m = manager()
    m.insert("local", [1, 2, 3, 4], 4 * B)  # state only at 4 blocks
    look = m.lookup([1, 2, 3, 9], 4 * B)
    # exact-length state missing at 3 blocks: no reusable prefix for a prefill ...
    assert look.local == 0
    # ... but a decode instance already holds the 3 blocks' full-attention KV
    assert look.local_kv == 3 * B


def test_lookup_always_leaves_one_token_to_prefill() -> None:
    m = manager()
    m.insert("local", [1, 2], 2 * B)
    m.insert("local", [1], B)
    look = m.lookup([1, 2], 2 * B)
    assert look.local == B and look.local_kv == B


def test_plan_without_cache_is_the_whole_prompt() -> None:
    plan = plan_request(10_000, CacheLookup(), "prfaas")
    assert (plan.prefill_tokens, plan.reused_tokens, plan.kv_tokens) == (10_000, 0, 10_000)
    assert plan.pull_tokens == 0 and plan.pull_from is None


def test_plan_prfaas_sends_what_local_does_not_hold() -> None:
    look = CacheLookup(local=2 * B, prfaas=6 * B, local_kv=3 * B)
    plan = plan_request(10 * B, look, "prfaas")
    assert plan.reused_tokens == 6 * B and plan.prefill_tokens == 4 * B
    assert plan.kv_tokens == 7 * B  # the 3 blocks decode's cluster holds do not cross


def test_plan_local_route_reuses_local_cache_even_for_a_cache_blind_route() -> None:
    look = CacheLookup(local=4 * B, prfaas=8 * B, local_kv=4 * B)
    plan = plan_request(10 * B, look, "local")  # no pull asked: compute from the local prefix
    assert plan.prefill_tokens == 6 * B and plan.kv_tokens == 6 * B


def test_plan_with_a_pull_into_local() -> None:
    look = CacheLookup(local=4 * B, prfaas=8 * B, local_kv=4 * B)
    plan = plan_request(10 * B, look, "local", pull_tokens=4 * B)
    assert plan.pull_tokens == 4 * B and plan.pull_from == "prfaas"
    assert plan.reused_tokens == 8 * B and plan.prefill_tokens == 2 * B
    assert plan.kv_tokens == 2 * B  # the pulled prefix is in the local cluster now
    # a pull never asks for more than the source holds
    assert plan_request(10 * B, look, "local", pull_tokens=100 * B).pull_tokens == 4 * B


def test_plan_leaves_at_least_one_token() -> None:
    look = CacheLookup(local=4 * B, prfaas=4 * B, local_kv=4 * B)
    plan = plan_request(4 * B, look, "local")
    assert plan.prefill_tokens >= 1 and plan.kv_tokens >= 1


def test_counters_and_stats() -> None:
    m = manager()
    plan = plan_request(
        10 * B, CacheLookup(local=4 * B, prfaas=8 * B, local_kv=4 * B), "local", 4 * B
    )
    m.record_prefill("local", plan)
    m.insert("local", list(range(10)), 10 * B)
    s = m.stats()["local"]
    assert s["prefills"] == 1 and s["reused_tokens"] == 8 * B and s["pulls_in"] == 1
    assert s["blocks"] == 10 and s["states"] == 1 and s["used_bytes"] > 0


def test_capacity_evicts_least_recently_used() -> None:
    pool_bytes = HYBRID.state_bytes + 4 * manager().pools["local"].block_bytes
    m = manager(capacity=pool_bytes * 1.5)  # room for one 4-block prompt and its state
    m.insert("local", [1, 2, 3, 4], 4 * B)
    m.insert("local", [5, 6, 7, 8], 4 * B)
    assert m.lookup([5, 6, 7, 8, 9], 5 * B).local == 4 * B
    assert m.lookup([1, 2, 3, 4, 9], 5 * B).local == 0


def test_default_capacities_from_hardware_and_config() -> None:
    dep = DeploymentConfig.model_validate(
        {
            "kind": "prfaas-pd",
            "prfaas": {"hardware": "h200x8", "instances": 4, "prefix_cache": "1TiB"},
            "local": {"hardware": "h20x8", "instances": 8},
        }
    )
    caps = cluster_capacities(dep)
    assert caps["prfaas"] == 2**40
    assert caps["local"] == default_capacity("h20x8", 8) == 8 * 2**40


def test_prefix_cache_unit_errors_name_the_field() -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="prefix_cache"):
        DeploymentConfig.model_validate(
            {"kind": "prfaas-pd", "local": {"hardware": "h20x8", "instances": 8,
                                            "prefix_cache": "lots"}}
        )  # fmt: skip
