"""A request's ChainKeys: each block hashed at most once, never past what a call needed, and the
cache's answers the same as when every call is given the hash ids.

The property test replays random prompts (sharing prefixes, as a conversation's turns do)
through two managers, one given the hash ids on every call and one given a ChainKeys per
request, with pools small enough to evict, and requires every lookup, insert and statistic to
be equal.
"""

from __future__ import annotations

import os
import subprocess
import sys

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from testbed.kvcache import BLOCK_TOKENS, ChainKeys, HybridPrefixPool, chain_keys
from testbed.kvcache.manager import KVCacheManager


def test_keys_are_chain_keys_computed_lazily() -> None:
    ids = [5, 1, 9, 9, 2]
    keys = ChainKeys(ids)
    assert keys.known == []
    assert keys.first(2) == chain_keys(ids)[:2]
    assert len(keys.known) == 2
    assert keys.first(99) == chain_keys(ids)
    assert len(keys) == 5


def test_a_lookup_hashes_no_block_past_its_first_miss() -> None:
    pool = HybridPrefixPool(1e9, block_bytes=10, state_bytes=0)
    pool.insert([1, 2, 3], 3 * BLOCK_TOKENS)
    keys = ChainKeys([1, 2, 3, 4, 5, 6, 7, 8])
    assert pool.match_blocks(keys) == 3
    assert len(keys.known) == 4  # three present, the fourth missed: no further
    assert pool.match_blocks(keys) == 3 and len(keys.known) == 4  # nothing hashed again
    pool.insert(keys, 8 * BLOCK_TOKENS)
    assert len(keys.known) == 8  # the insert hashes only the blocks not hashed yet
    assert pool.match_blocks(keys) == 8 and len(keys.known) == 8


def test_chain_keys_are_the_same_in_every_process() -> None:
    """A key is Python's hash of (parent, hash id): ints are not salted, so a key does not
    depend on PYTHONHASHSEED (a worker and a rerun agree with this process)."""
    code = "from testbed.kvcache import chain_keys; print(chain_keys([7, 1, 2**40, -3]))"
    seen = set()
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
        assert run.returncode == 0, run.stderr
        seen.add(run.stdout)
    assert seen == {f"{chain_keys([7, 1, 2**40, -3])}\n"}


def test_siblings_never_share_a_key() -> None:
    """Under one parent, distinct hash ids give distinct keys (the pair's hash is a bijection
    of the second element's hash for a fixed first)."""
    parent = chain_keys([11, 12])[-1]
    children = {chain_keys([11, 12, h])[-1] for h in range(5_000)}
    assert len(children) == 5_000 and parent not in children


prompts = st.lists(
    st.tuples(
        st.integers(0, 4),  # which conversation: its turns share a prefix
        st.integers(0, 12),  # blocks of its own after the shared part
        st.integers(0, 600),  # tokens past the last full block
        st.booleans(),  # prefilled in PrfaaS or locally
        st.integers(0, 3),  # then a pull of this many blocks into the other cluster
    ),
    max_size=40,
)


@settings(
    max_examples=80,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(seq=prompts, capacity=st.sampled_from([300.0, 2_000.0, 1e9]), state=st.sampled_from([0, 50]))
def test_chain_keys_answer_as_hash_ids_do(
    seq: list[tuple[int, int, int, bool, int]], capacity: float, state: int
) -> None:
    def manager() -> KVCacheManager:
        pools = {
            c: HybridPrefixPool(capacity, block_bytes=10, state_bytes=state)
            for c in ("prfaas", "local")
        }
        return KVCacheManager(pools)  # type: ignore[arg-type]

    plain, memo = manager(), manager()
    for i, (conv, own, extra, prfaas, pull) in enumerate(seq):
        ids = tuple([1000 + conv] * 3 + [i * 100 + b for b in range(own)])
        tokens = len(ids) * BLOCK_TOKENS - (BLOCK_TOKENS - extra if extra < BLOCK_TOKENS else 0)
        keys = ChainKeys(ids)
        assert plain.lookup(ids, tokens) == memo.lookup(keys, tokens)
        here = "prfaas" if prfaas else "local"
        assert plain.insert(here, ids, tokens) == memo.insert(here, keys, tokens)
        other = "local" if prfaas else "prfaas"
        pulled = pull * BLOCK_TOKENS
        assert plain.insert(other, ids, pulled) == memo.insert(other, keys, pulled)
        assert plain.lookup(ids, tokens) == memo.lookup(keys, tokens)
    assert plain.stats() == memo.stats()
    for c in ("prfaas", "local"):
        assert plain.pools[c].stats() == memo.pools[c].stats()  # type: ignore[index]
