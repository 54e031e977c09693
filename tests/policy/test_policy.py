import pytest

from testbed.policy import make_policy
from testbed.policy.base import InstanceLoad, RequestView, Snapshot


def snap(threshold: float | None = 10_000) -> Snapshot:
    return Snapshot(
        now=0.0,
        instances=(
            InstanceLoad("pf-0", "prfaas", "prefill", 2, 50_000),
            InstanceLoad("pf-1", "prfaas", "prefill", 1, 10_000),
            InstanceLoad("pdp-0", "local", "prefill", 0, 0),
            InstanceLoad("pdd-0", "local", "decode", 5, 4000),
            InstanceLoad("pdd-1", "local", "decode", 3, 1000),
        ),
        threshold_tokens=threshold,
    )


def test_prfaas_static_routes_by_uncached_length() -> None:
    policy = make_policy("prfaas-static")
    long = policy.decide(RequestView("a", 30_000, 10), snap())
    short = policy.decide(RequestView("b", 5_000, 10), snap())
    assert (long.prefill_cluster, long.prefill_instance) == ("prfaas", "pf-1")
    assert (short.prefill_cluster, short.prefill_instance) == ("local", "pdp-0")
    assert long.decode_instance == short.decode_instance == "pdd-1"
    assert long.threshold_tokens == 10_000
    # exactly at the threshold stays local (l > t goes to PrfaaS)
    assert policy.decide(RequestView("c", 10_000, 10), snap()).prefill_cluster == "local"


def test_cached_prefix_shortens_the_uncached_length() -> None:
    policy = make_policy("prfaas-static")
    route = policy.decide(RequestView("a", 30_000, 10, cached_local=25_000), snap())
    assert route.prefill_cluster == "local"
    assert route.uncached_tokens == 5_000


def test_baselines_ignore_length() -> None:
    for length in (100, 100_000):
        assert (
            make_policy("homogeneous")
            .decide(RequestView("a", length, 1), snap(None))
            .prefill_cluster
            == "local"
        )
        assert (
            make_policy("naive").decide(RequestView("a", length, 1), snap(None)).prefill_cluster
            == "prfaas"
        )


def test_errors() -> None:
    with pytest.raises(KeyError, match="unknown policy"):
        make_policy("random")
    with pytest.raises(ValueError, match="threshold"):
        make_policy("prfaas-static").decide(RequestView("a", 1, 1), snap(None))
    empty = Snapshot(0.0, (), 1.0)
    with pytest.raises(LookupError):
        make_policy("homogeneous").decide(RequestView("a", 1, 1), empty)
