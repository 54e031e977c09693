"""A hybrid prefix cache pool, as the paper describes it for hybrid-attention models.

- Full-attention KV is block-level: a prompt is cut into blocks of BLOCK_TOKENS (512, as the
  Mooncake trace's hash_ids), and a prefix matches block by block. Only full blocks are cached.
- Linear-attention state is request-level and fixed-size: the state after exactly n tokens is
  useless for any other length. So a prefix of k blocks is reusable only if the pool also holds
  the state at exactly k x BLOCK_TOKENS tokens. For a model without linear layers (dense), the
  blocks alone are enough.
- Both share one byte budget; least-recently-used entries are evicted first. Transfer-cache
  blocks (the tail of a prefill waiting to be sent to decode) are reserved from the same budget
  and released once sent; they never serve a prefix match.

Keys are chained (each block's key covers every block before it), so two prompts share a block
only if they share the whole prefix up to it. Entries may carry a payload (real tensors for the
torch engine); the emulated engine stores none. The pool does no I/O and reads no clock.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Container, Iterator, Sequence
from dataclasses import dataclass
from functools import reduce
from itertools import repeat, takewhile
from operator import add
from typing import Any

__all__ = ["BLOCK_TOKENS", "ChainKeys", "HybridPrefixPool", "PoolStats", "chain_keys"]

BLOCK_TOKENS = 512


def chain_keys(hash_ids: Sequence[int]) -> list[int]:
    """Key of each block prefix: key_i = H(key_{i-1}, hash_id_i)."""
    return list(iter_chain_keys(hash_ids))


def iter_chain_keys(hash_ids: Sequence[int]) -> Iterator[int]:
    """chain_keys one at a time, so a lookup stops hashing at its first miss (a new 1 MiB
    prompt has ~2,000 blocks: hashing them all on every lookup cost the router's event loop
    about 5 ms a lookup)."""
    prev = _ROOT
    for h in hash_ids:
        prev = _chain(prev, h)
        yield prev


_ROOT = 0
"""The key before the first block."""


def _chain(prev: int, h: int) -> int:
    """H: Python's hash of the pair, a 64-bit mix of the two (not salted for ints, so the same
    in every process and run). A key only names a prefix inside one process's pools, so it
    needs no cryptographic strength: for a fixed parent, distinct hash ids give distinct keys,
    and two unrelated prefixes share a key with odds of about 2^-61 per pair present at once.
    blake2b (what the keys were until 2026-12) cost 1.1 us a block against 0.17 us, a seventh
    of the sim's time on the Mooncake trace, for no difference in any run (docs/sim.md)."""
    return hash((prev, h))


class ChainKeys:
    """The chain keys of one prompt, computed as far as they are asked for and kept.

    A request is looked up in every pool before it is routed, and inserted after its prefill
    (and after a pull): given its hash ids each time, every call hashed the prompt's blocks
    again (17.8K calls and 589K digests for the Mooncake trace's 3,993 requests, half the sim's
    time). Given one ChainKeys per request, each block is hashed at most once, and never past
    the longest prefix any call needed (a lookup stops at its first miss).
    """

    __slots__ = ("_keys", "hash_ids")

    def __init__(self, hash_ids: Sequence[int]) -> None:
        self.hash_ids = hash_ids
        self._keys: list[int] = []

    def __len__(self) -> int:
        return len(self.hash_ids)

    @property
    def known(self) -> list[int]:
        """The keys hashed so far (a prefix of all of them); do not modify."""
        return self._keys

    def leading(self, n: int, present: Container[int]) -> int:
        """How many of the first `n` keys (at most `len(self)`) are in `present` before the
        first that is not: the keys already hashed are checked in C (`takewhile`), the rest
        hashed one at a time until the first miss, so no block past it is hashed."""
        keys, ids = self._keys, self.hash_ids
        n = min(n, len(ids))
        known = keys[:n] if len(keys) > n else keys
        found = len(list(takewhile(present.__contains__, known)))
        if found < len(known) or found == n:
            return found
        prev = keys[-1] if keys else _ROOT
        for h in ids[len(keys) : n]:  # _chain, inline: this loop hashes most blocks
            prev = hash((prev, h))
            keys.append(prev)
            if prev not in present:
                break
            found += 1
        return found

    def first(self, n: int) -> list[int]:
        """The first `n` keys (at most `len(self)`), hashing those not hashed yet."""
        keys, ids = self._keys, self.hash_ids
        n = min(n, len(ids))
        if len(keys) < n:
            prev = keys[-1] if keys else _ROOT
            for h in ids[len(keys) : n]:  # _chain, inline
                prev = hash((prev, h))
                keys.append(prev)
        return keys[:n]


def _keys_of(hash_ids: Sequence[int] | ChainKeys) -> ChainKeys:
    return hash_ids if isinstance(hash_ids, ChainKeys) else ChainKeys(hash_ids)


@dataclass(frozen=True)
class PoolStats:
    capacity_bytes: float
    used_bytes: float
    transfer_bytes: float
    blocks: int
    states: int
    hits: int
    misses: int
    hit_tokens: int
    evictions: int


@dataclass(frozen=True, slots=True)
class _Entry:
    size: float
    payload: Any = None


class HybridPrefixPool:
    """One cluster's prefix cache (see the module docstring)."""

    def __init__(
        self,
        capacity_bytes: float,
        *,
        block_bytes: float,
        state_bytes: float,
        block_tokens: int = BLOCK_TOKENS,
    ) -> None:
        if capacity_bytes < 0 or block_bytes < 0 or state_bytes < 0 or block_tokens < 1:
            raise ValueError("capacity, block and state sizes must be >= 0, block_tokens >= 1")
        self.capacity = float(capacity_bytes)
        self.block_bytes = float(block_bytes)
        self.state_bytes = float(state_bytes)
        self.block_tokens = block_tokens
        self._blocks: OrderedDict[int, _Entry] = OrderedDict()
        self._states: OrderedDict[int, _Entry] = OrderedDict()
        self._bare_block = _Entry(self.block_bytes)
        self._used = 0.0
        self._transfer = 0.0
        self.hits = self.misses = self.hit_tokens = self.evictions = 0

    @property
    def needs_state(self) -> bool:
        return self.state_bytes > 0

    # ------------------------------------------------------------------ lookup

    def match_blocks(
        self,
        hash_ids: Sequence[int] | ChainKeys,
        *,
        limit: int | None = None,
        touch: bool = True,
        with_state: bool = True,
    ) -> int:
        """How many leading blocks (at most `limit`) are reusable: all present and, for a
        model with linear-attention layers, the state at exactly that many blocks too.

        `with_state=False` asks only for the full-attention blocks: what a decode instance
        already holds of a prompt whose final state arrives with its KV anyway. A ChainKeys
        keeps the keys it hashed for the request's next call.
        """
        chain = _keys_of(hash_ids)
        blocks = self._blocks
        # the leading blocks present, hashed only as far as they go
        n = chain.leading(len(chain) if limit is None else max(limit, 0), blocks)
        keys = chain.known
        need_state = self.needs_state and with_state
        if need_state:
            n = self._with_state(keys, n)
        if touch and n:
            deque(map(blocks.move_to_end, keys[:n]), maxlen=0)  # in order, at C speed
            if need_state:
                self._states.move_to_end(keys[n - 1])
        return n

    def lookup(self, hash_ids: Sequence[int] | ChainKeys, input_tokens: int) -> tuple[int, int]:
        """What a prompt finds here, in one pass over its leading blocks: the tokens a prefill
        reuses (`match(record=False)`: the blocks and, for a hybrid model, the state at their
        length) and the tokens of the blocks alone (`match_blocks(with_state=False)`: what a
        decode instance already holds). The blocks found move to the LRU end, the state does
        not, as when the global manager's lookup made those two calls, which walked the local
        pool's blocks twice per request (a third of the sim's pool lookups)."""
        chain = _keys_of(hash_ids)
        limit = max(input_tokens - 1, 0) // self.block_tokens
        held = self.match_blocks(chain, limit=limit, with_state=False)
        n = self._with_state(chain.known, held) if self.needs_state else held
        return n * self.block_tokens, held * self.block_tokens

    def _with_state(self, keys: list[int], n: int) -> int:
        """The longest of the first `n` block prefixes whose state is held too (a hybrid
        model reuses no prefix without the state at exactly its length)."""
        states = self._states
        while n > 0 and keys[n - 1] not in states:
            n -= 1
        return n

    def match(
        self, hash_ids: Sequence[int] | ChainKeys, input_tokens: int, *, record: bool = True
    ) -> int:
        """Cached tokens of a prompt: reusable blocks x block_tokens, never the whole prompt.

        At least one token is always left to prefill (the last one produces the first output).
        """
        limit = max(input_tokens - 1, 0) // self.block_tokens
        tokens = self.match_blocks(hash_ids, limit=limit, touch=record) * self.block_tokens
        if record:
            if tokens:
                self.hits += 1
                self.hit_tokens += tokens
            else:
                self.misses += 1
        return tokens

    def payloads(self, hash_ids: Sequence[int], n_blocks: int) -> tuple[list[Any], Any]:
        """Payloads of the first n_blocks blocks and of the state at that length."""
        keys = chain_keys(hash_ids)[:n_blocks]
        blocks = [self._blocks[k].payload for k in keys]
        state = self._states[keys[-1]].payload if (keys and self.needs_state) else None
        return blocks, state

    # ------------------------------------------------------------------ insert / evict

    def insert(
        self,
        hash_ids: Sequence[int] | ChainKeys,
        input_tokens: int,
        *,
        block_payloads: Sequence[Any] | None = None,
        state_payload: Any = None,
    ) -> int:
        """Cache a prompt's full blocks and the state at the last full block. Returns blocks kept.

        Only full blocks are cached (a partial last block is transfer cache, not prefix cache).
        """
        chain = _keys_of(hash_ids)
        full = min(len(chain), input_tokens // self.block_tokens)
        if full == 0:
            return 0
        keys = chain.first(full)
        blocks = self._blocks
        # The leading blocks already cached (a prompt's shared prefix) only move to the LRU
        # end, in order, at C speed; the rest one by one as before (the used bytes are summed
        # block by block, so the float total is the same).
        held = len(list(takewhile(blocks.__contains__, keys)))
        move = blocks.move_to_end
        deque(map(move, keys[:held]), maxlen=0)
        size, used, bare = self.block_bytes, self._used, self._bare_block
        new = keys[held:]
        if block_payloads is None and blocks.keys().isdisjoint(new):
            # the usual tail, all new: put in at C speed, each with the one shared (immutable)
            # entry; the used bytes still summed block by block, left to right
            blocks.update(zip(new, repeat(bare)))
            used = reduce(add, repeat(size, len(new)), used)
        else:
            for i in range(held, full):
                key = keys[i]
                if key in blocks:
                    move(key)
                    continue  # no payload below: one shared (immutable) entry
                blocks[key] = bare if block_payloads is None else _Entry(size, block_payloads[i])
                used += size
        self._used = used
        if self.needs_state:
            last = keys[-1]
            if last in self._states:
                self._states.move_to_end(last)
            else:
                self._states[last] = _Entry(self.state_bytes, state_payload)
                self._used += self.state_bytes
        evictions = self.evictions
        self._evict()
        if self.evictions == evictions:  # every block and the state just put in are there
            return full
        # The prompt's blocks are now the newest `full` entries, oldest first, and eviction
        # takes the oldest: if its first block and its state survived, all of it did.
        if keys[0] in blocks and (not self.needs_state or keys[-1] in self._states):
            return full
        return self.match_blocks(chain, limit=full, touch=False)

    def _evict(self) -> None:
        used, transfer, capacity = self._used, self._transfer, self.capacity
        if used + transfer <= capacity:
            return
        blocks, states = self._blocks, self._states
        block_bytes, state_bytes = self.block_bytes, self.state_bytes
        n_blocks, n_states = len(blocks), len(states)  # kept here, not asked at every pop
        evicted = 0
        while used + transfer > capacity and (n_blocks or n_states):
            # The least recently used of the two kinds goes first; blocks are evicted from the
            # tail end of the LRU order, states likewise.
            if n_states and (not n_blocks or n_states * state_bytes >= n_blocks * block_bytes):
                _, entry = states.popitem(last=False)
                n_states -= 1
            else:
                _, entry = blocks.popitem(last=False)
                n_blocks -= 1
            used -= entry.size
            evicted += 1
        self._used = used
        self.evictions += evicted

    # ------------------------------------------------------------------ transfer cache

    def reserve_transfer(self, nbytes: float) -> None:
        """Hold the tail of a prefill until it is sent; may evict prefix cache to make room."""
        self._transfer += nbytes
        self._evict()

    def release_transfer(self, nbytes: float) -> None:
        self._transfer = max(self._transfer - nbytes, 0.0)

    def stats(self) -> PoolStats:
        return PoolStats(
            self.capacity,
            self._used,
            self._transfer,
            len(self._blocks),
            len(self._states),
            self.hits,
            self.misses,
            self.hit_tokens,
            self.evictions,
        )
