"""Warm service processes (testbed.substrate.local `warm`, services.host `--warm ROLE`): a run's
interpreters start together, each service gets one of them when its spec is known, and what a
run did not use leaves nothing behind."""

from __future__ import annotations

from pathlib import Path

import pytest

from testbed.errors import UserError
from testbed.services.spec import ServiceSpec
from testbed.substrate.local import LocalSubstrate

pytestmark = pytest.mark.timeout(60)


def _spec(role: str, sid: str) -> ServiceSpec:
    return ServiceSpec(role=role, id=sid, hardware="h20x8", time_scale=1000)


async def test_a_service_runs_in_a_warm_process_of_its_role(tmp_path: Path) -> None:
    sub = LocalSubstrate(tmp_path)
    await sub.warm(["decode", "prefill", "prefill"], None, seed=1)
    warm = {(w.role, w.proc.pid) for w in sub._warm}
    try:
        decode = await sub.start_service(_spec("decode", "d0"))
        prefill = await sub.start_service(_spec("prefill", "p0"))
        assert ("decode", decode.ref.pid) in warm  # type: ignore[attr-defined]
        assert ("prefill", prefill.ref.pid) in warm  # type: ignore[attr-defined]
        assert [w.role for w in sub._warm] == ["prefill"]  # one prefill left unused
        # a second decode: no warm decode is left, so it starts cold and still works
        cold = await sub.start_service(_spec("decode", "d1"))
        assert cold.ref.pid not in {pid for _role, pid in warm}  # type: ignore[attr-defined]
        unused = sub._warm[0].proc
    finally:
        await sub.stop_all()
    assert unused.returncode is not None  # the unused warm process is gone
    # a service leaves with status 0 on SIGTERM (services.host skips the interpreter's teardown)
    assert [h.ref.proc.returncode for h in (decode, prefill, cold)] == [0, 0, 0]  # type: ignore[attr-defined]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d0.log", "d1.log", "p0.log"]


async def test_a_restarted_service_appends_to_its_log(tmp_path: Path) -> None:
    sub = LocalSubstrate(tmp_path)
    await sub.warm(["decode", "decode"], None, seed=1)
    try:
        first = await sub.start_service(_spec("decode", "d0"))
        (tmp_path / "d0.log").write_text("first life\n")
        again = await sub.restart(first)
        assert again.url == first.url  # same ports
    finally:
        await sub.stop_all()
    assert (tmp_path / "d0.log").read_text().startswith("first life\n")


async def test_a_warm_process_given_another_roles_spec_fails_with_its_log(
    tmp_path: Path,
) -> None:
    sub = LocalSubstrate(tmp_path)
    await sub.warm(["decode"], None, seed=1)
    sub._warm[0].role = "prefill"  # hand a prefill spec to the warm decode process
    try:
        with pytest.raises(UserError, match=r"p0 exited during start-up; see .*warm-0\.log"):
            await sub.start_service(_spec("prefill", "p0"))
    finally:
        await sub.stop_all()
    assert "warm decode process given a prefill spec" in (tmp_path / "p0.log").read_text()
