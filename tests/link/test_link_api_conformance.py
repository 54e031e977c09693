"""Acceptance 1: the unmodified toxiproxy-python client (sync, requests) drives the emulator.

Proxies: create, list, get, disable/enable, destroy. Toxics: add, list and destroy one of every
type. Reset and version. Plus populate, and data really flowing through a created proxy.
"""

from __future__ import annotations

import json
import socket

import pytest
from toxiproxy import Toxiproxy
from toxiproxy.api import APIConsumer
from toxiproxy.exceptions import InvalidToxic, NotFound, ProxyExists

from testbed.link.toxics import REGISTRY

pytestmark = pytest.mark.timeout(60)

TOXIC_ATTRS = {
    "latency": {"latency": 10, "jitter": 2},
    "bandwidth": {"rate": 1000},
    "slow_close": {"delay": 10},
    "timeout": {"timeout": 100},
    "reset_peer": {"timeout": 100},
    "slicer": {"average_size": 64, "size_variation": 8, "delay": 10},
    "limit_data": {"bytes": 1000},
    "noop": {},
    "link_bandwidth": {"rate": 12500},
}


@pytest.fixture
def toxiproxy(threaded_emulator):  # type: ignore[no-untyped-def]
    t = Toxiproxy()
    t.update_api_consumer(threaded_emulator.host, threaded_emulator.port)
    yield t
    t.destroy_all()


def _echo_through(listen: str) -> bytes:
    host, port = listen.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as s:
        s.sendall(b"ping")
        return s.recv(16)


def test_every_toxic_type_is_covered() -> None:
    assert set(TOXIC_ATTRS) == set(REGISTRY)


def test_proxy_lifecycle(toxiproxy, threaded_emulator) -> None:  # type: ignore[no-untyped-def]
    up = f"{threaded_emulator.upstream[0]}:{threaded_emulator.upstream[1]}"
    assert toxiproxy.running()
    version = json.loads(toxiproxy.version())
    assert version["version"].startswith("2.")

    proxy = toxiproxy.create(upstream=up, name="db")
    assert proxy.name == "db" and proxy.upstream == up and proxy.enabled is True
    assert not proxy.listen.endswith(":0")
    assert _echo_through(proxy.listen) == b"ping"

    with pytest.raises(ProxyExists):
        toxiproxy.create(upstream=up, name="db")
    with pytest.raises(ProxyExists):  # the server's own 409, bypassing the client's check
        APIConsumer.post("/proxies", json={"name": "db", "upstream": up})

    assert set(toxiproxy.proxies()) == {"db"}
    got = toxiproxy.get_proxy("db")
    assert got is not None and got.listen == proxy.listen
    assert toxiproxy.get_proxy("nope") is None

    proxy.disable()
    assert toxiproxy.get_proxy("db").enabled is False
    host, port = proxy.listen.rsplit(":", 1)
    with pytest.raises(OSError):
        socket.create_connection((host, int(port)), timeout=2)
    proxy.enable()
    assert toxiproxy.get_proxy("db").enabled is True
    assert _echo_through(proxy.listen) == b"ping"
    with proxy.down():
        assert toxiproxy.get_proxy("db").enabled is False
    assert toxiproxy.get_proxy("db").enabled is True

    assert proxy.destroy() is True
    assert toxiproxy.proxies() == {}
    with pytest.raises(NotFound):
        proxy.destroy()


def test_every_toxic_type(toxiproxy, threaded_emulator) -> None:  # type: ignore[no-untyped-def]
    proxy = toxiproxy.create(
        upstream=f"{threaded_emulator.upstream[0]}:{threaded_emulator.upstream[1]}", name="tox"
    )
    for type_name, attrs in TOXIC_ATTRS.items():
        proxy.add_toxic(type=type_name, attributes=attrs)
        name = f"{type_name}_downstream"
        toxic = proxy.get_toxic(name)
        assert toxic is not None, type_name
        assert toxic.type == type_name and toxic.stream == "downstream"
        assert toxic.toxicity == 1.0
        for k, v in attrs.items():
            assert toxic.attributes[k] == v
        proxy.add_toxic(type=type_name, stream="upstream", toxicity=0.5, attributes=attrs)
        assert proxy.get_toxic(f"{type_name}_upstream").toxicity == 0.5
        with pytest.raises(ProxyExists):  # 409 for a duplicate toxic name
            proxy.add_toxic(type=type_name, attributes=attrs)
    assert len(proxy.toxics()) == 2 * len(TOXIC_ATTRS)
    for type_name in TOXIC_ATTRS:
        assert proxy.destroy_toxic(f"{type_name}_downstream") is True
    assert set(proxy.toxics()) == {f"{t}_upstream" for t in TOXIC_ATTRS}
    with pytest.raises(NotFound):
        proxy.destroy_toxic("latency_downstream")
    with pytest.raises(InvalidToxic):
        proxy.add_toxic(type="no_such_toxic")


def test_reset_and_populate(toxiproxy, threaded_emulator) -> None:  # type: ignore[no-untyped-def]
    up = f"{threaded_emulator.upstream[0]}:{threaded_emulator.upstream[1]}"
    proxy = toxiproxy.create(upstream=up, name="a")
    proxy.add_toxic(type="latency", attributes={"latency": 100})
    proxy.disable()
    assert toxiproxy.reset() is True
    again = toxiproxy.get_proxy("a")
    assert again.enabled is True and again.toxics() == {}
    assert _echo_through(again.listen) == b"ping"

    created = toxiproxy.populate(
        [
            {"name": "a", "upstream": up, "listen": again.listen},  # unchanged: kept
            {"name": "b", "upstream": up, "listen": "127.0.0.1:0"},
        ]
    )
    assert [p.name for p in created] == ["b"]
    resp = APIConsumer.post("/populate", json=[{"name": "c", "upstream": up}])
    assert resp.status_code == 201
    assert [p["name"] for p in resp.json()["proxies"]] == ["c"]
    assert set(toxiproxy.proxies()) == {"a", "b", "c"}
