"""The hybrid prefix cache pool's match semantics (the paper's Section on the hybrid pool)."""

import random

import pytest

from testbed.kvcache import BLOCK_TOKENS, HybridPrefixPool, chain_keys


def hybrid(capacity: float = 1e9) -> HybridPrefixPool:
    return HybridPrefixPool(capacity, block_bytes=10, state_bytes=100)


def test_block_prefix_match_needs_the_state_at_exactly_that_length() -> None:
    pool = hybrid()
    pool.insert([1, 2, 3, 4], 4 * BLOCK_TOKENS + 100)  # 4 full blocks, state at 4 blocks
    assert pool.match([1, 2, 3, 4, 5], 10 * BLOCK_TOKENS) == 4 * BLOCK_TOKENS
    # the first 3 blocks are there, but no linear-attention state at 3 x 512 tokens
    assert pool.match([1, 2, 3, 9], 10 * BLOCK_TOKENS) == 0
    assert pool.match([7, 2, 3, 4], 10 * BLOCK_TOKENS) == 0  # chained: a different prefix


def test_dense_models_match_block_by_block() -> None:
    pool = HybridPrefixPool(1e9, block_bytes=10, state_bytes=0)
    pool.insert([1, 2, 3, 4], 4 * BLOCK_TOKENS)
    assert pool.match([1, 2, 3, 9], 10 * BLOCK_TOKENS) == 3 * BLOCK_TOKENS


def test_partial_blocks_are_not_cached_and_one_token_is_always_left() -> None:
    pool = hybrid()
    assert pool.insert([1, 2], BLOCK_TOKENS + 10) == 1  # the partial second block is not kept
    assert pool.match([1, 2], 2 * BLOCK_TOKENS) == BLOCK_TOKENS
    pool.insert([5, 6], 2 * BLOCK_TOKENS)
    # the same prompt again: all blocks cached, but the last token must be prefilled, and the
    # state at 1 block is missing, so nothing is reusable
    assert pool.match([5, 6], 2 * BLOCK_TOKENS) == 0


def test_lru_eviction_respects_capacity_and_transfer_reservations() -> None:
    pool = hybrid(capacity=250)  # room for one prompt of 4 blocks + state (140 bytes)
    pool.insert([1, 2, 3, 4], 4 * BLOCK_TOKENS)
    pool.insert([5, 6, 7, 8], 4 * BLOCK_TOKENS)
    s = pool.stats()
    assert s.used_bytes <= 250 and s.evictions > 0
    assert pool.match([5, 6, 7, 8, 9], 9 * BLOCK_TOKENS) == 4 * BLOCK_TOKENS
    assert pool.match([1, 2, 3, 4, 9], 9 * BLOCK_TOKENS) == 0
    pool.reserve_transfer(200)
    assert pool.stats().used_bytes + 200 <= 250
    pool.release_transfer(200)
    assert pool.stats().transfer_bytes == 0


def test_insert_says_how_much_of_the_prompt_survived_its_own_eviction() -> None:
    # room for 4 blocks + a state (140 bytes) and a little more: the second prompt evicts
    # the first, and survives whole
    pool = hybrid(capacity=250)
    assert pool.insert([1, 2, 3, 4], 4 * BLOCK_TOKENS) == 4
    assert pool.insert([5, 6, 7, 8], 4 * BLOCK_TOKENS) == 4
    assert pool.stats().evictions > 0
    # a prompt whose blocks and state do not fit together: its state goes (the larger kind),
    # so none of it is reusable
    big = hybrid(capacity=120)
    assert big.insert([1, 2, 3, 4, 5, 6], 6 * BLOCK_TOKENS) == 0
    assert big.match([1, 2, 3, 4, 5, 6, 7], 7 * BLOCK_TOKENS) == 0
    # a dense model keeps the blocks that fit, oldest gone first: nothing of the prefix
    dense = HybridPrefixPool(35, block_bytes=10, state_bytes=0)
    assert dense.insert([1, 2, 3, 4, 5], 5 * BLOCK_TOKENS) == 0
    # a prompt whose prefix is cached but older than another's: touched, it becomes the
    # newest, so the eviction its new block causes takes the other prompt's
    warm = HybridPrefixPool(45, block_bytes=10, state_bytes=0)
    warm.insert([1, 2], 2 * BLOCK_TOKENS)
    warm.insert([7, 8], 2 * BLOCK_TOKENS)
    assert warm.insert([1, 2, 3], 3 * BLOCK_TOKENS) == 3
    assert warm.stats().evictions == 1
    assert warm.match([1, 2, 3, 4], 4 * BLOCK_TOKENS) == 3 * BLOCK_TOKENS
    assert warm.match([7, 8, 9], 3 * BLOCK_TOKENS) == 0


def test_payloads_round_trip() -> None:
    pool = hybrid()
    pool.insert([1, 2], 2 * BLOCK_TOKENS, block_payloads=["b1", "b2"], state_payload="s2")
    assert pool.payloads([1, 2], 2) == (["b1", "b2"], "s2")
    # a longer prompt over the same prefix: the held blocks keep their payloads, the new
    # block takes the payload at its own position
    pool.insert([1, 2, 3], 3 * BLOCK_TOKENS, block_payloads=["x1", "x2", "b3"], state_payload="s3")
    assert pool.payloads([1, 2, 3], 3) == (["b1", "b2", "b3"], "s3")


def test_chain_keys_cover_the_whole_prefix() -> None:
    a, b = chain_keys([1, 2, 3]), chain_keys([9, 2, 3])
    assert a[0] != b[0] and a[2] != b[2]
    assert chain_keys([1, 2]) == a[:2]


def test_bad_sizes() -> None:
    with pytest.raises(ValueError):
        HybridPrefixPool(-1, block_bytes=1, state_bytes=1)


def test_blocks_without_state_are_what_a_decode_side_holds() -> None:
    pool = hybrid()
    pool.insert([1, 2, 3, 4], 4 * BLOCK_TOKENS)  # state only at 4 blocks
    assert pool.match_blocks([1, 2, 3, 9]) == 0  # no state at 3 blocks: not reusable by prefill
    assert pool.match_blocks([1, 2, 3, 9], with_state=False) == 3  # but the KV blocks are there


@pytest.mark.parametrize("state_bytes", [0, 100])
def test_lookup_is_match_then_match_blocks_without_state(state_bytes: int) -> None:
    """`lookup` answers, and leaves the LRU order, as the two calls it replaces did, on a pool
    small enough to evict: a touch that went missing (or the state touched) changes what a
    later insert evicts."""
    rng = random.Random(7)
    one = HybridPrefixPool(900, block_bytes=10, state_bytes=state_bytes)
    two = HybridPrefixPool(900, block_bytes=10, state_bytes=state_bytes)
    for _ in range(300):
        ids = [rng.randrange(4)] + [rng.randrange(3) for _ in range(rng.randrange(1, 9))]
        tokens = rng.randrange(1, len(ids) + 2) * BLOCK_TOKENS - rng.randrange(2)
        limit = max(tokens - 1, 0) // BLOCK_TOKENS
        before = (
            one.match(ids, tokens, record=False),
            one.match_blocks(ids, limit=limit, with_state=False) * BLOCK_TOKENS,
        )
        assert two.lookup(ids, tokens) == before
        if rng.random() < 0.5:
            assert one.insert(ids, tokens) == two.insert(ids, tokens)
        assert list(one._blocks) == list(two._blocks)
        assert list(one._states) == list(two._states)
    assert one.evictions == two.evictions > 0
