"""Checkers: invariants every run must keep, judged from its request records alone.

They are the testbed's promises, checked after every run (faults or not) rather than trusted:

- nothing_lost: every submitted request ends exactly once, as completed or as failed with a
  reason. A request that vanishes under a fault is the bug this exists to catch.
- kv_accounted: every completed request received exactly the KV bytes its prefill emitted, all
  of them sent, and decode verified them; a short or padded transfer that still "completed"
  means the emulated transfer path is lying.
- no_unverified_decode: no request streamed a token before its KV was verified, including
  requests that later failed.

Each result carries a one-line detail with the counts and the first few offending ids, which is
what a person needs to start debugging from the report.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from testbed.metrics.records import RequestRecord

__all__ = [
    "CheckResult",
    "check_kv_accounted",
    "check_no_unverified_decode",
    "check_nothing_lost",
    "run_checkers",
]

_SHOW = 5
"""How many offending ids a detail line names."""


@dataclass
class CheckResult:
    name: str
    ok: bool
    detail: str


def _ids(ids: Sequence[str]) -> str:
    more = f" (+{len(ids) - _SHOW} more)" if len(ids) > _SHOW else ""
    return ", ".join(ids[:_SHOW]) + more


def check_nothing_lost(
    records: Sequence[RequestRecord], submitted_ids: Sequence[str]
) -> CheckResult:
    """Every submitted id has exactly one record, completed or failed-with-a-reason."""
    submitted = set(submitted_ids)
    counts = Counter(r.id for r in records)
    problems: list[str] = []

    dup_submitted = sorted(i for i, n in Counter(submitted_ids).items() if n > 1)
    if dup_submitted:
        problems.append(f"ids submitted more than once: {_ids(dup_submitted)}")
    missing = sorted(submitted - counts.keys())
    if missing:
        problems.append(f"{len(missing)} submitted without a record: {_ids(missing)}")
    duplicated = sorted(i for i, n in counts.items() if n > 1)
    if duplicated:
        problems.append(f"{len(duplicated)} with more than one record: {_ids(duplicated)}")
    unknown = sorted(counts.keys() - submitted)
    if unknown:
        problems.append(f"{len(unknown)} records for ids never submitted: {_ids(unknown)}")
    bad_status = [r.id for r in records if r.status not in ("completed", "failed")]
    if bad_status:
        problems.append(f"{len(bad_status)} neither completed nor failed: {_ids(bad_status)}")
    no_reason = [
        r.id for r in records if r.status == "failed" and not (r.failure_reason or "").strip()
    ]
    if no_reason:
        problems.append(f"{len(no_reason)} failed without a reason: {_ids(no_reason)}")

    completed = sum(1 for r in records if r.status == "completed")
    failed = sum(1 for r in records if r.status == "failed")
    tally = f"{len(submitted_ids)} submitted, {completed} completed, {failed} failed"
    if not problems and completed + failed != len(submitted_ids):
        problems.append("completed + failed does not equal submitted")
    if problems:
        return CheckResult("nothing_lost", False, f"{tally}; " + "; ".join(problems))
    return CheckResult("nothing_lost", True, tally)


def check_kv_accounted(records: Sequence[RequestRecord]) -> CheckResult:
    """For every completed request: received == sent == expected wire bytes, and verified."""
    completed = [r for r in records if r.status == "completed"]
    expected = sum(r.kv_wire_bytes_expected for r in completed)
    sent = sum(r.kv_wire_bytes_sent for r in completed)
    received = sum(r.kv_wire_bytes_received for r in completed)
    totals = (
        f"{len(completed)} completed; wire bytes expected {expected}, sent {sent}, "
        f"received {received}"
    )
    mismatched = [
        r.id
        for r in completed
        if not (r.kv_wire_bytes_received == r.kv_wire_bytes_sent == r.kv_wire_bytes_expected)
    ]
    unverified = [r.id for r in completed if not r.kv_verified]
    problems: list[str] = []
    if mismatched:
        problems.append(f"{len(mismatched)} with byte mismatch: {_ids(mismatched)}")
    if unverified:
        problems.append(f"{len(unverified)} completed without verified KV: {_ids(unverified)}")
    if problems:
        return CheckResult("kv_accounted", False, f"{totals}; " + "; ".join(problems))
    return CheckResult("kv_accounted", True, totals)


def check_no_unverified_decode(records: Sequence[RequestRecord]) -> CheckResult:
    """No request (completed or failed) streamed output tokens without verified KV."""
    bad = [r.id for r in records if r.tokens_out > 0 and not r.kv_verified]
    decoded = sum(1 for r in records if r.tokens_out > 0)
    if bad:
        return CheckResult(
            "no_unverified_decode",
            False,
            f"{len(bad)} of {decoded} decoded requests streamed tokens without verified KV: "
            f"{_ids(bad)}",
        )
    return CheckResult("no_unverified_decode", True, f"{decoded} decoded requests, all verified")


def run_checkers(
    records: Sequence[RequestRecord], submitted_ids: Sequence[str]
) -> list[CheckResult]:
    """All built-in checkers, in a fixed order."""
    return [
        check_nothing_lost(records, submitted_ids),
        check_kv_accounted(records),
        check_no_unverified_decode(records),
    ]
