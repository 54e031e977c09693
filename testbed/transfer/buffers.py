"""One memory budget for the read buffers of all of a receiver's connections.

Any local process can open connections to a KV port, and a frame header may promise up to
`max_payload` bytes. A connection's buffer therefore grows only with bytes that really arrived
(receiver/protocol.py), and all buffers together stay within this budget: a connection that
cannot grow stops reading until another one gives memory back.

One connection at a time may go past the limit (the *overdraft*), so that when every connection
holds half a frame and the budget is spent, one of them can still finish its frame, give its
memory back and let the others go on: the budget can never deadlock honest senders, it only
slows them. A stalled holder is dropped by the receiver's frame timeout, which ends its overdraft.
"""

from __future__ import annotations

from typing import Protocol

__all__ = ["BufferBudget"]


class Waiter(Protocol):
    def retry_grow(self) -> bool:
        """Try again to get the memory it waits for; True once it has it (it resumes)."""
        ...


class BufferBudget:
    """Bytes of connection buffers a receiver may hold in total (plus one overdraft)."""

    def __init__(self, limit: int) -> None:
        if limit <= 0:
            raise ValueError("buffer budget must be positive")
        self.limit = limit
        self.used = 0
        self.overdraft: object | None = None
        self._waiting: dict[Waiter, None] = {}

    @property
    def pressed(self) -> bool:
        """Memory is short: buffers should be given back as soon as they are empty."""
        return self.used > self.limit * 3 // 4 or bool(self._waiting) or self.overdraft is not None

    def force(self, n: int) -> None:
        """Account for `n` bytes that must be allocated anyway (a connection's first buffer)."""
        self.used += n

    def take(self, owner: object, n: int) -> bool:
        """Reserve `n` more bytes for `owner`; False if neither the budget nor the overdraft
        allows it."""
        if self.used + n <= self.limit:
            self.used += n
            return True
        if self.overdraft is None or self.overdraft is owner:
            self.overdraft = owner
            self.used += n
            return True
        return False

    def give(self, owner: object, n: int, *, done: bool = False) -> None:
        """Return `n` bytes; `done`: `owner` holds no partial frame any more (its overdraft, if
        any, ends). Connections waiting for memory are offered it again."""
        self.used -= n
        if done and self.overdraft is owner:
            self.overdraft = None
        self._wake()

    def wait(self, waiter: Waiter) -> None:
        self._waiting[waiter] = None

    def forget(self, waiter: Waiter) -> None:
        self._waiting.pop(waiter, None)

    def _wake(self) -> None:
        for waiter in list(self._waiting):
            if waiter.retry_grow():
                self._waiting.pop(waiter, None)
            elif self.used >= self.limit and self.overdraft is not None:
                return
