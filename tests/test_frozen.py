"""quick_init: the same frozen dataclass, built by a faster __init__, and a refusal of what it
cannot copy exactly."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from testbed.frozen import quick_init
from testbed.policy.base import InstanceLoad, LinkView, RequestView, Route, Snapshot


@dataclasses.dataclass(frozen=True)
class Plain:
    a: int
    b: str = "x"
    c: tuple[int, ...] = ()


@quick_init
@dataclasses.dataclass(frozen=True)
class Quick:
    a: int
    b: str = "x"
    c: tuple[int, ...] = ()


def _twins(*args: object, **kwargs: object) -> tuple[Plain, Quick]:
    return Plain(*args, **kwargs), Quick(*args, **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [((1,), {}), ((1, "y"), {}), ((1,), {"c": (2,)}), ((), {"a": 3, "b": "z", "c": (4, 5)})],
)
def test_a_quick_instance_is_the_dataclass_one(
    args: tuple[object, ...], kwargs: dict[str, object]
) -> None:
    plain, quick = _twins(*args, **kwargs)
    assert dataclasses.astuple(plain) == dataclasses.astuple(quick)
    assert repr(plain).replace("Plain", "Quick") == repr(quick)
    assert quick == Quick(*args, **kwargs)  # type: ignore[arg-type]
    assert hash(quick) == hash(Quick(*args, **kwargs))  # type: ignore[arg-type]
    assert dataclasses.replace(quick, b="w").b == "w"
    assert inspect.signature(Quick).parameters.keys() == inspect.signature(Plain).parameters.keys()


def test_a_quick_instance_stays_read_only() -> None:
    quick = Quick(1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        quick.a = 2  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        del quick.b  # type: ignore[misc]


def test_a_quick_init_refuses_bad_arguments_as_the_dataclass_does() -> None:
    for cls in (Plain, Quick):
        with pytest.raises(TypeError):
            cls()  # type: ignore[call-arg]
        with pytest.raises(TypeError):
            cls(1, d=2)  # type: ignore[call-arg]
        with pytest.raises(TypeError):
            cls(1, a=2)  # type: ignore[misc]


def test_quick_init_refuses_what_it_cannot_copy() -> None:
    @dataclasses.dataclass
    class Mutable:
        a: int

    @dataclasses.dataclass(frozen=True, slots=True)
    class Slotted:
        a: int

    @dataclasses.dataclass(frozen=True)
    class Factory:
        a: list[int] = dataclasses.field(default_factory=list)

    @dataclasses.dataclass(frozen=True)
    class Post:
        a: int

        def __post_init__(self) -> None:
            pass

    @dataclasses.dataclass(frozen=True)
    class KwOnly:
        a: int = dataclasses.field(kw_only=True)

    for cls in (Mutable, Slotted, Factory, Post, KwOnly):
        with pytest.raises(TypeError, match=cls.__name__):
            quick_init(cls)


def test_the_policy_views_keep_their_fields_and_defaults() -> None:
    """The classes the sim builds per request: built by keyword with only their required
    fields, they hold the dataclass defaults."""
    load = InstanceLoad("p0", "prfaas", "prefill", 1, 2.0)
    assert (load.queue_wait_s, load.state, load.hardware) == (0.0, "ok", None)
    assert RequestView("r", 10, 2).kv_bytes == 0.0
    assert LinkView(1.0, None, None, None, False).scarce is False
    route = Route("local", "a", "b", 5)
    assert (route.threshold_tokens, route.pull_prefix_tokens) == (None, 0)
    snap = Snapshot(now=1.0, instances=[load])
    assert (snap.link, snap.version, snap.index, snap.exclude) == (None, 0, None, frozenset())


def test_a_class_without_fields_gets_a_quick_init_too() -> None:
    @quick_init
    @dataclasses.dataclass(frozen=True)
    class Empty:
        pass

    assert Empty() == Empty()
    with pytest.raises(TypeError):
        Empty(1)  # type: ignore[call-arg]
