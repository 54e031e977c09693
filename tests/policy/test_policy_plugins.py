"""#16 item 1: a policy from outside the project, by `module:Class` or by an entry point of the
`prfaas_testbed.policies` group, through the same registry and checks as the built-in ones; a
plugin that cannot load stops the run before it starts with one line naming it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from testbed.cli import main
from testbed.policy import POLICIES, get_policy
from testbed.registry import PluginError, UnknownName
from testbed.scenario.plan import RunOptions, prepare_run
from testbed.scenario.schema import load_scenario

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "tests" / "data" / "tiny.yaml"

POLICY_SRC = """\
from typing import ClassVar

from testbed.policy.base import RequestView, Route, Snapshot, least_loaded


class AlwaysLocal:
    '''Every prefill on the least-loaded local PD-P instance: easy to see in the routes.'''

    name: ClassVar[str] = "{name}"
    deployment_kind: ClassVar[str] = "prfaas-pd"
    needs_threshold: ClassVar[bool] = False
    replans: ClassVar[bool] = False
    long_term: ClassVar[bool] = False
    cache_aware: ClassVar[bool] = False

    def decide(self, request: RequestView, snapshot: Snapshot) -> Route:
        prefill = least_loaded(snapshot, "local", "prefill")
        decode = least_loaded(snapshot, "local", "decode")
        return Route("local", prefill.id, decode.id, request.input_tokens)


class NoDecide:
    name: ClassVar[str] = "{name}-nodecide"
    deployment_kind: ClassVar[str] = "prfaas-pd"
    needs_threshold: ClassVar[bool] = False
    replans: ClassVar[bool] = False
    long_term: ClassVar[bool] = False
    cache_aware: ClassVar[bool] = False


class TakesABuiltinName(AlwaysLocal):
    name: ClassVar[str] = "prfaas"
"""


def make_package(tmp_path: Path, module: str, name: str) -> Path:
    """A module on sys.path (and on PYTHONPATH, for the services a run starts)."""
    src = tmp_path / "site"
    src.mkdir(exist_ok=True)
    (src / f"{module}.py").write_text(POLICY_SRC.format(name=name))
    return src


@pytest.fixture(autouse=True)
def _forget_plugins() -> Iterator[None]:
    yield
    POLICIES.forget_plugins()  # the registry is global: no plugin outlives its test


@pytest.fixture
def plugin_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    src = make_package(tmp_path, "toyrouting", "always-local")
    monkeypatch.syspath_prepend(str(src))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(src), str(ROOT)]))
    return src


def test_module_class_loads_with_its_facts(plugin_path: Path) -> None:
    cls = get_policy("toyrouting:AlwaysLocal")
    assert cls.name == "always-local" and cls.deployment_kind == "prfaas-pd"
    assert POLICIES.is_plugin("toyrouting:AlwaysLocal")
    assert not POLICIES.is_plugin("prfaas-static")
    rp = prepare_run(
        load_scenario(TINY), RunOptions(policy="toyrouting:AlwaysLocal", out_dir=plugin_path / "o")
    )
    assert rp.policy == "toyrouting:AlwaysLocal" and rp.threshold_tokens is None


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        ("no_such_module_xyz:Cls", "cannot import no_such_module_xyz: ModuleNotFoundError"),
        ("toyrouting:Missing", "module toyrouting has no 'Missing'"),
        ("toyrouting:NoDecide", "needs a decide(request, snapshot) method"),
        ("toyrouting:TakesABuiltinName", "name 'prfaas' is taken"),
        ("toyrouting:", "write it as module:Class"),
    ],
)
def test_a_plugin_that_cannot_load_is_one_line_naming_it(
    plugin_path: Path, spec: str, needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(PluginError) as err:
        get_policy(spec)
    assert str(err.value).startswith(f"policy plugin {spec!r}: ") and needle in str(err.value)
    out = plugin_path / "out"
    assert main(["run", str(TINY), "--policy", spec, "--quiet", "--out", str(out)]) == 2
    line = capsys.readouterr().err
    assert line.count("\n") == 1 and spec in line and needle in line
    assert not out.exists()  # stopped before anything started


def test_an_unknown_plain_name_mentions_module_class() -> None:
    with pytest.raises(UnknownName, match=r"\(or an outside one as module:Class\)"):
        get_policy("nothing-called-this")


def test_an_entry_point_loads_by_its_name(tmp_path: Path) -> None:
    """A distribution on sys.path declaring the policy under prfaas_testbed.policies; checked in
    a fresh interpreter, where the entry-point list is read from scratch."""
    src = make_package(tmp_path, "eprouting", "ep-local")
    dist = src / "eprouting-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: eprouting\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(
        "[prfaas_testbed.policies]\nep-local = eprouting:AlwaysLocal\nbroken = eprouting:Nope\n"
    )
    code = textwrap.dedent(
        """
        import json
        from testbed.policy import POLICIES, get_policy
        from testbed.registry import PluginError, UnknownName
        out = {"name": get_policy("ep-local").name, "plugin": POLICIES.is_plugin("ep-local")}
        try:
            get_policy("broken")
        except PluginError as exc:
            out["broken"] = str(exc)
        try:
            get_policy("neither")
        except UnknownName as exc:
            out["unknown"] = str(exc)
        print(json.dumps(out))
        """
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src), str(ROOT)])}
    done = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    out = json.loads(done.stdout)
    assert out["name"] == "ep-local" and out["plugin"] is True
    assert out["broken"].startswith(
        "policy plugin 'broken' (entry point eprouting:Nope of eprouting)"
    )
    assert "ep-local" in out["unknown"] and "broken" in out["unknown"]  # listed, not loaded


def test_compose_refuses_a_plugin_with_one_line(plugin_path: Path) -> None:
    with pytest.raises(Exception, match="runs on the local substrate"):
        prepare_run(
            load_scenario(TINY),
            RunOptions(policy="toyrouting:AlwaysLocal", substrate="compose", out_dir=plugin_path),
        )


@pytest.mark.slow
async def test_a_plugin_routes_a_live_run(plugin_path: Path) -> None:
    """The router is another process: it imports the plugin itself (PYTHONPATH), and every
    request goes where the plugin says."""
    from testbed.scenario.runner import run_scenario

    opts = RunOptions(policy="toyrouting:AlwaysLocal", out_dir=plugin_path / "run", progress=False)
    rp = prepare_run(load_scenario(TINY), opts)
    result = await run_scenario(rp, opts)
    assert result.ok, [c.detail for c in result.checks if not c.ok]
    assert result.summary["routes"] == {"local": result.summary["requests"]["submitted"]}
    assert result.summary["policy"] == "toyrouting:AlwaysLocal"
