"""Adding a policy is one file (docs/extending.md): a toy policy defined here, registered for the
test only, runs through the runner's planning and the router; the docs' example, dropped into the
package path of a fresh interpreter as its one file, is found by name and does the same."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import ClassVar

from testbed.config import DeploymentKind
from testbed.policy import POLICIES, make_policy
from testbed.policy.base import RequestView, Route, Snapshot, least_loaded
from testbed.scenario.plan import RunOptions, prepare_run
from testbed.scenario.schema import load_scenario
from testbed.services.router.dispatch import RouterState
from testbed.services.spec import InstanceInfo, ServiceSpec

ROOT = Path(__file__).resolve().parents[2]
PAPER = ROOT / "scenarios" / "paper.yaml"  # three deployments: prfaas-pd, homogeneous, naive


class CacheFirst:
    """Prefill where the longer cached prefix is; a threshold only breaks ties. A toy."""

    name: ClassVar[str] = "test-cache-first"
    deployment_kind: ClassVar[DeploymentKind] = "prfaas-pd"
    needs_threshold: ClassVar[bool] = True
    replans: ClassVar[bool] = False
    long_term: ClassVar[bool] = False
    cache_aware: ClassVar[bool] = True

    def decide(self, request: RequestView, snapshot: Snapshot) -> Route:
        t = snapshot.threshold_tokens or 0.0
        if request.cached_prfaas != request.cached_local:
            cluster = "prfaas" if request.cached_prfaas > request.cached_local else "local"
        else:
            cluster = "prfaas" if request.input_tokens > t else "local"
        cached = request.cached_prfaas if cluster == "prfaas" else request.cached_local
        prefill = least_loaded(snapshot, cluster, "prefill")
        decode = least_loaded(snapshot, "local", "decode")
        return Route(prefill.cluster, prefill.id, decode.id, request.input_tokens - cached, t)


class CacheFirstAtHome(CacheFirst):
    name: ClassVar[str] = "test-cache-first-home"
    deployment_kind: ClassVar[DeploymentKind] = "homogeneous"
    needs_threshold: ClassVar[bool] = False
    cache_aware: ClassVar[bool] = False


def _opts(policy: str) -> RunOptions:
    return RunOptions(policy=policy, out_dir=Path("unused"), progress=False)


def test_the_runner_reads_a_toy_policys_facts_off_its_class() -> None:
    sc = load_scenario(PAPER)
    with POLICIES.added(CacheFirst), POLICIES.added(CacheFirstAtHome):
        rp = prepare_run(sc, _opts("test-cache-first"))
        home = prepare_run(sc, _opts("test-cache-first-home"))
    # deployment_kind picks the deployment; needs_threshold puts the planner's t in the plan
    assert (rp.deployment_name, rp.policy) == ("prfaas-pd", "test-cache-first")
    assert rp.threshold_tokens == rp.plan.threshold_tokens and rp.threshold_tokens is not None
    assert home.deployment_name == "homogeneous" and home.threshold_tokens is None
    assert "test-cache-first" not in POLICIES  # registered for the block only


def _router(policy: str) -> RouterState:
    infos = [
        InstanceInfo(id="prfaas-prefill-0", cluster="prfaas", role="prefill", url="http://x"),
        InstanceInfo(id="local-prefill-0", cluster="local", role="prefill", url="http://x"),
        InstanceInfo(id="local-decode-0", cluster="local", role="decode", url="http://x"),
    ]
    spec = ServiceSpec(
        role="router", id="router", policy=policy, threshold_tokens=8000, instances=infos
    )
    return RouterState(spec)


def test_the_router_routes_with_a_toy_policy_and_reads_cache_aware_off_it() -> None:
    view = RequestView("q1", 10_000, 16, cached_local=1_000, cached_prfaas=6_000)
    with POLICIES.added(CacheFirst), POLICIES.added(CacheFirstAtHome):
        state = _router("test-cache-first")
        blind = _router("test-cache-first-home")
    assert isinstance(state.policy, CacheFirst)
    route = state.policy.decide(view, state.snapshot())
    assert (route.prefill_instance, route.uncached_tokens) == ("prfaas-prefill-0", 4_000)
    # the length the scheduler plans with: the uncached part for a cache-aware policy (the
    # longest prefix anywhere, abundant link), the whole prompt for a cache-blind one
    assert state._routed_length(view) == 4_000
    assert blind._routed_length(view) == 10_000


def _example(path: str) -> str:
    """The code block marked `<!-- example: path -->` in docs/extending.md."""
    text = (ROOT / "docs" / "extending.md").read_text()
    m = re.search(rf"<!-- example: {re.escape(path)} -->\n```python\n(.*?)```\n", text, re.S)
    assert m is not None, f"docs/extending.md has no example {path}"
    return m.group(1)


DRIVER = """
import json, sys
from pathlib import Path
import testbed.policy
testbed.policy.__path__.append(sys.argv[1])  # as if the file sat in testbed/policy/
from testbed.policy import get_policy, make_policy
from testbed.policy.base import InstanceLoad, RequestView, Snapshot
from testbed.scenario.plan import RunOptions, prepare_run
from testbed.scenario.schema import load_scenario

cls = get_policy("least-work")
opts = RunOptions(policy="least-work", out_dir=Path("unused"), progress=False)
rp = prepare_run(load_scenario(sys.argv[2]), opts)
snap = Snapshot(0.0, (
    InstanceLoad("prfaas-prefill-0", "prfaas", "prefill", 1, 500.0),
    InstanceLoad("local-prefill-0", "local", "prefill", 3, 9000.0),
    InstanceLoad("local-decode-0", "local", "decode", 0, 0.0),
))
route = make_policy("least-work").decide(RequestView("q1", 4000, 8, cached_prfaas=1000), snap)
print(json.dumps({
    "module": cls.__module__,
    "facts": [cls.deployment_kind, cls.needs_threshold, cls.replans, cls.long_term,
              cls.cache_aware],
    "deployment": rp.deployment_name, "threshold": rp.threshold_tokens,
    "route": [route.prefill_instance, route.decode_instance, route.uncached_tokens],
}))
"""


def test_the_docs_example_is_one_file_that_the_registry_finds(tmp_path: Path) -> None:
    (tmp_path / "least_work.py").write_text(_example("testbed/policy/least_work.py"))
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(DRIVER), str(tmp_path), str(PAPER)],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    assert got["module"] == "testbed.policy.least_work"
    assert got["facts"] == ["prfaas-pd", False, False, False, False]
    assert got["deployment"] == "prfaas-pd" and got["threshold"] is None
    assert got["route"] == ["prfaas-prefill-0", "local-decode-0", 3000]
    assert "least-work" not in POLICIES  # this interpreter's package is untouched
    make_policy("prfaas")  # and its registry still works
