"""What `--qdisc`, `--one-way`, `--wire` and `--all` of `testbed link tc` change in the kernel
commands issued (testbed.link.tc), with the command runner replaced by a recorder: no root, no
namespace. The live shaping itself is tests/link/test_link_tc.py (root)."""

from __future__ import annotations

import subprocess

import pytest

from testbed.link import tc


@pytest.fixture
def issued(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    argvs: list[list[str]] = []

    def run(argv: list[str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
        argvs.append(argv)
        return subprocess.CompletedProcess(argv, 0, "", "")

    monkeypatch.setattr(tc, "_run", run)
    return argvs


def _rates(argvs: list[list[str]]) -> list[str]:
    return [a[a.index("rate") + 1] for a in argvs if "rate" in a]


def test_qdisc_one_way_and_wire(issued: list[list[str]]) -> None:
    pair = tc.NetnsPair("x", "tbl-x-a", "tbl-x-b")
    pair.set_rate(1e6)
    assert {a[2] for a in issued} == {"tbl-x-a", "tbl-x-b"}  # both directions
    assert any("htb" in a for a in issued) and not any("tbf" in a for a in issued)
    assert set(_rates(issued)) == {f"{round(1e6 * tc.WIRE_PER_PAYLOAD * 8)}bit"}  # goodput
    issued.clear()
    pair.set_rate(1e6, qdisc="tbf", both=False, goodput=False)
    assert {a[2] for a in issued} == {"tbl-x-a"}  # one way
    assert any("tbf" in a for a in issued) and not any("htb" in a for a in issued)
    assert set(_rates(issued)) == {"8000000bit"}  # the rate as given: wire bytes


def test_down_all_removes_every_pair_of_this_tool(
    issued: list[list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tc, "check_available", lambda: None)
    monkeypatch.setattr(
        tc, "_existing_namespaces", lambda: ["tbl-a-a", "tbl-a-b", "tbl-b-a", "other"]
    )
    assert tc.teardown("a") == ["tbl-a-a", "tbl-a-b"]
    assert tc.teardown("a", all_mine=True) == ["tbl-a-a", "tbl-a-b", "tbl-b-a"]
    assert ["ip", "netns", "del", "other"] not in issued
