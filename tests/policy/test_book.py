"""The load book: the incremental index must answer exactly as a scan of the instances would."""

from __future__ import annotations

import random

import pytest

from testbed.policy.base import CostModel, InstanceLoad, RequestView, Snapshot
from testbed.policy.book import BookEntry, LoadBook
from testbed.policy.static import PrfaasStatic
from testbed.profiles import MODELS

MODEL = MODELS["internal-1t-hybrid"]
HW = {"prfaas": "h200x8", "local": "h20x8"}


def book(n_prfaas: int = 5, n_pdp: int = 4, n_pdd: int = 6) -> tuple[LoadBook, set[str]]:
    draining: set[str] = set()
    entries = (
        [BookEntry(f"p{i}", "prfaas", "prefill", HW["prfaas"]) for i in range(n_prfaas)]
        + [BookEntry(f"l{i}", "local", "prefill", HW["local"]) for i in range(n_pdp)]
        + [BookEntry(f"d{i}", "local", "decode", HW["local"]) for i in range(n_pdd)]
    )
    return LoadBook(entries, draining, CostModel.of(MODEL, HW)), draining


def scan(snap: Snapshot, cluster: str | None, role: str) -> InstanceLoad | None:
    """What least_loaded meant before the index: the min over a plain list."""
    plain = Snapshot(snap.now, tuple(snap.instances), exclude=snap.exclude)
    try:
        return plain.least_loaded(cluster, role)  # type: ignore[arg-type]
    except LookupError:
        return None


def test_random_changes_keep_the_index_equal_to_a_scan() -> None:
    rng = random.Random(3)
    b, draining = book()
    ids = list(b.entries)
    charged: list[tuple[str, float, str, float]] = []
    for step in range(3000):
        op = rng.random()
        if op < 0.45:
            pre = rng.choice([i for i in ids if b.entries[i].role == "prefill"])
            dec = rng.choice([i for i in ids if b.entries[i].role == "decode"])
            tokens, out = float(rng.randint(0, 4) * 1000), float(rng.randint(1, 3) * 100)
            b.charge(pre, tokens, dec, out, +1)
            charged.append((pre, tokens, dec, out))
        elif op < 0.8 and charged:
            pre, tokens, dec, out = charged.pop(rng.randrange(len(charged)))
            b.charge(pre, tokens, dec, out, -1)
        elif op < 0.88:
            b.set_healthy(rng.choice(ids), rng.random() < 0.6)
        elif op < 0.94:
            iid = rng.choice(ids)
            (draining.discard if iid in draining else draining.add)(iid)
        elif not charged:
            iid = rng.choice([i for i in ids if b.entries[i].cluster == "local"])
            b.set_role(iid, rng.choice(["prefill", "decode"]))
        exclude = frozenset(rng.sample(ids, rng.randint(0, 2)) + rng.choice([[], ["prfaas"]]))
        snap = b.snapshot(float(step), 19_400.0, False, exclude=exclude)
        for cluster in (None, "prfaas", "local"):
            for role in ("prefill", "decode"):
                want = scan(snap, cluster, role)
                try:
                    got: InstanceLoad | None = snap.least_loaded(cluster, role)  # type: ignore[arg-type]
                except LookupError:
                    got = None
                assert got == want, (step, cluster, role)
                assert snap.least(cluster, role) == want, (step, cluster, role)  # type: ignore[arg-type]


def test_instances_list_every_instance_with_its_state() -> None:
    b, draining = book(2, 1, 1)
    b.set_healthy("p0", False)
    draining.add("l0")
    snap = b.snapshot(0.0, None, False)
    states = {i.id: i.state for i in snap.instances}
    assert states == {"p0": "suspect", "p1": "ok", "l0": "draining", "d0": "ok"}
    assert snap.least_loaded("prfaas", "prefill").id == "p1"
    with pytest.raises(LookupError):
        snap.least_loaded("local", "prefill")  # the only PD-P is draining
    assert snap.least("local", "prefill") is None  # the same answer, without the exception
    plain = Snapshot(0.0, tuple(snap.instances))  # a hand-made snapshot: no book behind it
    assert plain.least("local", "prefill") is None
    assert plain.least("prfaas", "prefill") == snap.least("prfaas", "prefill")


def test_queue_wait_is_the_sum_of_the_prefill_times_of_what_is_outstanding() -> None:
    b, _ = book(1, 1, 1)
    for tokens in (8_000, 30_000):
        b.charge("p0", tokens, "d0", 100, +1)
    load = b.snapshot(0.0, None, False).least_loaded("prfaas", "prefill")
    want = MODEL.prefill_time("h200x8", 8_000) + MODEL.prefill_time("h200x8", 30_000)
    assert load.queue_wait_s == pytest.approx(want)
    assert load.hardware == "h200x8"
    b.charge("p0", 8_000, "d0", 100, -1)
    b.charge("p0", 30_000, "d0", 100, -1)
    assert b.load("p0").queue_wait_s == 0.0
    assert b.load("d0").queue_wait_s == 0.0


def test_changed_since_walks_only_what_moved() -> None:
    b, draining = book()
    v = b.snapshot(0.0, None, False).version
    b.charge("p1", 1000, "d2", 10, +1)
    b.set_healthy("l3", False)
    draining.add("d4")
    snap = b.snapshot(1.0, None, False)
    assert [i.id for i in snap.changed_since(v)] == ["p1", "d2", "l3", "d4"]
    assert snap.changed_since(snap.version) == ()
    b.charge("p1", 1000, "d2", 10, -1)
    later = b.snapshot(2.0, None, False)
    assert [i.id for i in later.changed_since(snap.version)] == ["p1", "d2"]
    assert len(later.changed_since(0)) == len(b.entries)  # 0: everything


def test_cost_model_is_the_profiles_curves() -> None:
    costs = CostModel.of(MODEL, HW)
    for n in (512, 19_400, 100_000):
        assert costs.prefill_s("local", n) == pytest.approx(MODEL.prefill_time("h20x8", n))
        assert costs.prefill_s("prfaas", n) == pytest.approx(MODEL.prefill_time("h200x8", n))
        assert costs.kv_bytes(n) == pytest.approx(MODEL.kv_bytes(n))
    assert costs.kv_bytes(0) == 0.0


def test_a_builtin_policy_routes_the_same_on_a_book_and_on_a_plain_snapshot() -> None:
    rng = random.Random(5)
    b, _ = book()
    policy = PrfaasStatic()
    for i in range(500):
        req = RequestView(f"r{i}", rng.randint(100, 90_000), 200, rng.randint(0, 5_000))
        snap = b.snapshot(float(i), 19_400.0, False)
        plain = Snapshot(snap.now, tuple(snap.instances), 19_400.0)
        route = policy.decide(req, snap)
        assert route == policy.decide(req, plain)
        b.charge(route.prefill_instance, route.uncached_tokens, route.decode_instance, 200, +1)


def test_the_link_view_is_reused_only_for_the_same_objects() -> None:
    """One LinkView per change of what the scheduler state holds, not one per decision; an
    equal value in a new object (0.0 for -0.0) gets a view of its own."""
    b, _ = book()
    bw, inflight, delivered = 1.25e9, 3.0e6, 1.0e9
    first = b.link_view(bw, inflight, delivered, 0.02, False)
    assert b.link_view(bw, inflight, delivered, 0.02, False) is first
    moved = b.link_view(bw, 4.0e6, delivered, 0.02, False)
    assert moved is not first and moved.in_flight_bytes == 4.0e6
    assert b.link_view(bw, 4.0e6, delivered, 0.02, True).scarce is True
    zero, negative = 0.0, -0.0
    assert b.link_view(zero, None, None, None, False) is not b.link_view(
        negative, None, None, None, False
    )
    assert str(b.link_view(negative, None, None, None, False).bandwidth_bps) == "-0.0"
