"""How a substrate says a service ended (scenario.standing prints it under `testbed up`): the
local substrate from the process's return code, compose from the container's state."""

from __future__ import annotations

from typing import Any

import pytest

from testbed.services.spec import ServiceSpec
from testbed.substrate.base import ServiceHandle
from testbed.substrate.compose.substrate import ComposeSubstrate, _Instance
from testbed.substrate.local import ended


def test_a_return_code_as_a_reason() -> None:
    assert ended(None) is None
    assert ended(0) == "exit code 0"
    assert ended(3) == "exit code 3"
    assert ended(-9) == "killed by SIGKILL"
    assert ended(-200) == "killed by signal 200"


class FakeContainer:
    def __init__(self, state: dict[str, Any] | None, gone: bool = False) -> None:
        self.attrs = {"State": state or {}}
        self.gone = gone

    def reload(self) -> None:
        if self.gone:
            raise LookupError("no such container")


@pytest.mark.parametrize(
    ("container", "why"),
    [
        (FakeContainer({"Status": "running"}), None),
        (FakeContainer({"Status": "paused"}), None),
        (FakeContainer({"Status": "exited", "ExitCode": 137}), "exit code 137"),
        (FakeContainer({"Status": "dead", "OOMKilled": True}), "killed by the OOM killer"),
        (FakeContainer(None, gone=True), "container gone (LookupError)"),
    ],
)
async def test_a_containers_state_as_a_reason(container: FakeContainer, why: str | None) -> None:
    spec = ServiceSpec(role="decode", id="d0", hardware="h20x8")
    sub = ComposeSubstrate.__new__(ComposeSubstrate)  # no engine needed to read a state
    sub.instances = {"d0": _Instance(spec, container, "10.0.0.2")}
    assert await sub.exited(ServiceHandle(spec, "http://x")) == why
