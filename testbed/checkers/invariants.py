"""The built-in invariants, checked after every run whatever the scenario says.

- nothing_lost: every submitted request ends exactly once, as completed or as failed with a
  reason. A request that vanishes under a fault is the bug this exists to catch.
- kv_accounted: every completed request received exactly the KV bytes its prefill emitted, all
  of them sent, and decode verified them; a short or padded transfer that still "completed"
  means the emulated transfer path is lying.
- no_unverified_decode: no request streamed a token before its KV was verified, including
  requests that later failed.
- generator_count (when the runner passes the load generator's planned count): every request
  the generator planned was submitted (requests never submitted are only allowed on Ctrl-C).

Each is a checker like a scenario's (testbed.checkers.base): a model and a function
`(config, run: CheckInput) -> CheckResult`, listed in `INVARIANTS` in the order the report shows
them, and not in the `CHECKERS` registry (a scenario cannot list or leave out an invariant). The
`check_*` functions below hold the logic with plain arguments, for tests and other callers.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any, Literal

from testbed.checkers.base import Checker, CheckerConfig, CheckInput
from testbed.checkers.result import CheckResult, show_ids, vacuous
from testbed.metrics.records import RequestRecord
from testbed.units import format_size

__all__ = [
    "INVARIANTS",
    "Invariant",
    "check_generator_count",
    "check_kv_accounted",
    "check_no_unverified_decode",
    "check_nothing_lost",
]


def check_nothing_lost(
    records: Sequence[RequestRecord], submitted_ids: Sequence[str]
) -> CheckResult:
    """Every submitted id has exactly one record, completed or failed-with-a-reason."""
    submitted = set(submitted_ids)
    counts = Counter(r.id for r in records)
    problems: list[str] = []

    dup_submitted = sorted(i for i, n in Counter(submitted_ids).items() if n > 1)
    if dup_submitted:
        problems.append(f"ids submitted more than once: {show_ids(dup_submitted)}")
    missing = sorted(submitted - counts.keys())
    if missing:
        problems.append(f"{len(missing)} submitted without a record: {show_ids(missing)}")
    duplicated = sorted(i for i, n in counts.items() if n > 1)
    if duplicated:
        problems.append(f"{len(duplicated)} with more than one record: {show_ids(duplicated)}")
    unknown = sorted(counts.keys() - submitted)
    if unknown:
        problems.append(f"{len(unknown)} records for ids never submitted: {show_ids(unknown)}")
    bad_status = [r.id for r in records if r.status not in ("completed", "failed")]
    if bad_status:
        problems.append(f"{len(bad_status)} neither completed nor failed: {show_ids(bad_status)}")
    no_reason = [
        r.id for r in records if r.status == "failed" and not (r.failure_reason or "").strip()
    ]
    if no_reason:
        problems.append(f"{len(no_reason)} failed without a reason: {show_ids(no_reason)}")

    completed = sum(1 for r in records if r.status == "completed")
    failed = sum(1 for r in records if r.status == "failed")
    tally = f"{len(submitted_ids)} submitted, {completed} completed, {failed} failed"
    if not problems and completed + failed != len(submitted_ids):
        problems.append("completed + failed does not equal submitted")
    if problems:
        return CheckResult("nothing_lost", False, f"{tally}; " + "; ".join(problems))
    if not submitted_ids:
        return vacuous("nothing_lost", f"{tally}: nothing to account for")
    return CheckResult("nothing_lost", True, tally)


def check_kv_accounted(records: Sequence[RequestRecord], byte_scale: float = 1.0) -> CheckResult:
    """For every completed request: received == sent == expected wire bytes, and verified.

    The totals read in real-world bytes, as the report's (wire bytes x `byte_scale`); the exact
    wire byte counts that were compared follow in brackets."""
    completed = [r for r in records if r.status == "completed"]
    expected = sum(r.kv_wire_bytes_expected for r in completed)
    sent = sum(r.kv_wire_bytes_sent for r in completed)
    received = sum(r.kv_wire_bytes_received for r in completed)

    def real(wire: int) -> str:
        return format_size(wire * byte_scale)

    if expected == sent == received:
        moved = f"KV {real(expected)} real-world expected = sent = received"
    else:
        moved = (
            f"KV real-world expected {real(expected)}, sent {real(sent)}, received {real(received)}"
        )
    totals = (
        f"{len(completed)} completed; {moved} (wire bytes {expected} / {sent} / {received}"
        f"{f' at byte_scale {byte_scale:g}' if byte_scale != 1 else ''})"
    )
    mismatched = [
        r.id
        for r in completed
        if not (r.kv_wire_bytes_received == r.kv_wire_bytes_sent == r.kv_wire_bytes_expected)
    ]
    unverified = [r.id for r in completed if not r.kv_verified]
    problems: list[str] = []
    if mismatched:
        problems.append(f"{len(mismatched)} with byte mismatch: {show_ids(mismatched)}")
    if unverified:
        problems.append(f"{len(unverified)} completed without verified KV: {show_ids(unverified)}")
    if problems:
        return CheckResult("kv_accounted", False, f"{totals}; " + "; ".join(problems))
    if not completed:
        return vacuous("kv_accounted", f"{totals}: no completed request to account")
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
            f"{show_ids(bad)}",
        )
    if not decoded:
        return vacuous("no_unverified_decode", "no request streamed a token: nothing to verify")
    return CheckResult("no_unverified_decode", True, f"{decoded} decoded requests, all verified")


def check_generator_count(planned: int, submitted_ids: Sequence[str]) -> CheckResult:
    """The load generator's own count: every planned request was submitted, once."""
    n = len(submitted_ids)
    ok = n == planned and len(set(submitted_ids)) == n
    return CheckResult(
        "generator_count", ok, f"{planned} planned by the load generator, {n} submitted"
    )


# ----------------------------------------------------------------- the checker calling convention


class Invariant(CheckerConfig):
    """A built-in invariant's model: no settings, its name in `check`."""


class NothingLost(Invariant):
    check: Literal["nothing_lost"] = "nothing_lost"


class KvAccounted(Invariant):
    check: Literal["kv_accounted"] = "kv_accounted"


class NoUnverifiedDecode(Invariant):
    check: Literal["no_unverified_decode"] = "no_unverified_decode"


class GeneratorCount(Invariant):
    check: Literal["generator_count"] = "generator_count"

    def applies(self, run: CheckInput) -> bool:
        return run.planned is not None  # only when the runner knows the generator's count


def _nothing_lost(cfg: NothingLost, run: CheckInput) -> CheckResult:
    return check_nothing_lost(run.records, run.submitted_ids)


def _kv_accounted(cfg: KvAccounted, run: CheckInput) -> CheckResult:
    return check_kv_accounted(run.records, run.byte_scale)


def _no_unverified_decode(cfg: NoUnverifiedDecode, run: CheckInput) -> CheckResult:
    return check_no_unverified_decode(run.records)


def _generator_count(cfg: GeneratorCount, run: CheckInput) -> CheckResult:
    return check_generator_count(run.planned or 0, run.submitted_ids)


INVARIANTS: tuple[Checker[Any], ...] = (
    Checker(NothingLost, _nothing_lost),
    Checker(KvAccounted, _kv_accounted),
    Checker(NoUnverifiedDecode, _no_unverified_decode),
    Checker(GeneratorCount, _generator_count),
)
"""The invariants every run is checked against, in the report's order."""
