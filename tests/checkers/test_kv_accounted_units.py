"""#17 item 7: check messages speak the report's real-world units. kv_accounted printed scaled
wire bytes next to the report's real-world GiB; now it leads with real-world bytes and keeps the
exact wire counts it compared in brackets."""

from __future__ import annotations

from dataclasses import replace

from testbed.checkers import run_checkers
from testbed.checkers.invariants import check_kv_accounted
from tests.checkers.test_checkers import done


def test_totals_are_real_world_with_the_wire_counts_behind_them() -> None:
    records = [done(i, kv=1 << 20) for i in range(3)]  # 3 MiB on the wire
    r = check_kv_accounted(records, byte_scale=1024)
    assert r.ok
    assert "KV 3GiB real-world expected = sent = received" in r.detail
    assert f"wire bytes {3 << 20} / {3 << 20} / {3 << 20} at byte_scale 1024" in r.detail


def test_a_mismatch_shows_each_total_in_real_world_bytes() -> None:
    short = replace(done(1, kv=1 << 20), kv_wire_bytes_received=1 << 19)
    r = check_kv_accounted([done(0, kv=1 << 20), short], byte_scale=1024)
    assert not r.ok
    assert "expected 2GiB, sent 2GiB, received 1.5GiB" in r.detail


def test_run_checkers_passes_the_byte_scale_on() -> None:
    records = [done(0, kv=1 << 20)]
    kv = run_checkers(records, ["r0"] if records[0].id == "r0" else [records[0].id], byte_scale=2)[
        1
    ]
    assert kv.name == "kv_accounted"
    assert "KV 2MiB real-world" in kv.detail
