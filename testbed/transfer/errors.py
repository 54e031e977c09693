"""The one error a caller of the transfer path has to handle."""

from __future__ import annotations

__all__ = ["TransferError"]


class TransferError(Exception):
    """A request's KV did not (or may not have) arrived complete and verified.

    `reason` is a short human-readable cause ("checksum mismatch ...", "connection lost ...",
    "timed out ..."); the history records it verbatim so every failed request says why.
    """

    def __init__(self, request_id: str, reason: str) -> None:
        super().__init__(f"KV transfer of {request_id!r} failed: {reason}")
        self.request_id = request_id
        self.reason = reason
