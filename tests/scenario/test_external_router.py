"""The external router's wiring, without a router: the preset's command line, the one-line
errors (extra missing, router exiting, never ready), `--router`, the scenario's `router:` and
the record joined from the client's view and the workers' attempts. Fast: fake routers are
shell scripts."""

from __future__ import annotations

import asyncio
import os
import stat
from pathlib import Path
from typing import Any

import pytest
import yaml

import testbed.scenario.external_run as external_run
from testbed.cli import main
from testbed.config.router import ExternalRouterConfig
from testbed.errors import UserError
from testbed.scenario.external_router import healthy_workers, router_command, start_router
from testbed.scenario.external_run import join_record, with_router
from testbed.scenario.openai_load import ClientView, PromptText
from testbed.scenario.plan import RunOptions, RunPlan, RunResult, prepare_run
from testbed.scenario.schema import load_scenario, scenario_from_data
from testbed.services.spec import InstanceInfo
from testbed.workload.generate import RequestSpec

TINY = str(Path(__file__).resolve().parents[1] / "data" / "tiny.yaml")
P = [InstanceInfo(id="prfaas-prefill-0", cluster="prfaas", role="prefill",
                  url="http://127.0.0.1:4001")]  # fmt: skip
D = [InstanceInfo(id="local-decode-0", cluster="local", role="decode", url="http://127.0.0.1:4002")]


def test_the_preset_keeps_the_router_on_loopback_with_its_policy_and_flags() -> None:
    cfg = ExternalRouterConfig(policy="round_robin", flags=["--retry-max-retries", "3"])
    cmd = router_command(cfg, "/py", 9000, 9001, [("http://127.0.0.1:4001", 4001)],
                         ["http://127.0.0.1:4002"])  # fmt: skip
    assert cmd[:3] == ["/py", "-m", "sglang_router.launch_router"]  # the module, not a script
    line = " ".join(cmd)
    assert "--host 127.0.0.1 --port 9000" in line
    assert "--prometheus-host 127.0.0.1 --prometheus-port 9001" in line
    assert "--pd-disaggregation --prefill http://127.0.0.1:4001 4001 --decode" in line
    assert "--policy round_robin" in line and "--health-check-interval-secs 2" in line
    assert cmd[-2:] == ["--retry-max-retries", "3"]  # the scenario's flags last
    assert "--policy cache_aware" in " ".join(router_command(ExternalRouterConfig(), "/py", 1,
                                                             2, [], []))  # fmt: skip


def test_the_vllm_preset_names_no_bootstrap_port_and_no_tokenizer() -> None:
    cfg = ExternalRouterConfig(preset="vllm-router", policy="round_robin")
    cmd = router_command(cfg, "/py", 9000, 9001, [("http://127.0.0.1:4001", 4001)],
                         ["http://127.0.0.1:4002"])  # fmt: skip
    assert cmd[:3] == ["/py", "-m", "vllm_router.launch_router"]
    line = " ".join(cmd)
    assert "--host 127.0.0.1 --port 9000" in line
    assert "--prometheus-host 127.0.0.1 --prometheus-port 9001" in line
    assert "--vllm-pd-disaggregation --prefill http://127.0.0.1:4001 --decode" in line
    assert "--tokenizer-path" not in line and "--log-level warning" in line
    assert "--health-check-interval-secs 2 --health-failure-threshold 2" in line
    assert ExternalRouterConfig(preset="vllm-router").policy == "cache_aware"


def test_readiness_counts_both_routers_shapes() -> None:
    assert healthy_workers({"status": "ready", "healthy_workers": 4, "total_workers": 4}) == 4
    vllm = {"status": "ready", "prefill": {"healthy": 2, "total": 2},
            "decode": {"healthy": 1, "total": 2}}  # fmt: skip
    assert healthy_workers(vllm) == 3
    assert healthy_workers({"status": "starting"}) is None and healthy_workers([]) is None


def test_a_policy_the_router_has_not_is_refused() -> None:
    with pytest.raises(ValueError, match="no policy 'least-ttft'"):
        ExternalRouterConfig(policy="least-ttft")


def _fake_router(tmp_path: Path, body: str) -> str:
    script = tmp_path / "fake-python"
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return str(script)


async def test_a_missing_router_says_which_extra_to_install(tmp_path: Path) -> None:
    cfg = ExternalRouterConfig(python=str(tmp_path / "no-such-python"))
    with pytest.raises(UserError, match=r"pip install -e '\.\[routers\]'"):
        await start_router(cfg, P, D, tmp_path)


async def test_a_router_that_exits_is_one_line_with_its_stderr(tmp_path: Path) -> None:
    cfg = ExternalRouterConfig(python=_fake_router(tmp_path, "echo 'bad flag --x' >&2; exit 3"))
    with pytest.raises(UserError, match=r"exited with code 3: .*bad flag --x"):
        await start_router(cfg, P, D, tmp_path)


async def test_the_router_is_given_the_control_path_proxy_and_the_instances_own_bootstrap(
    tmp_path: Path,
) -> None:
    """A PrfaaS prefill reached through the link's control-path proxy: the router calls the
    proxy, and the decode half meets the prefill at its own port (the bootstrap port)."""
    cfg = ExternalRouterConfig(python=_fake_router(tmp_path, "exit 3"))
    with pytest.raises(UserError, match="exited with code 3"):
        await start_router(cfg, P, D, tmp_path, via={"prfaas-prefill-0": "http://127.0.0.1:5999"})
    command = (tmp_path / "router-sglang-router.log").read_text().splitlines()[0]
    assert "--prefill http://127.0.0.1:5999 4001" in command
    assert "--decode http://127.0.0.1:4002" in command and ":4001 " not in command


async def test_a_router_never_ready_is_stopped_after_ready_timeout(tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    cfg = ExternalRouterConfig(
        python=_fake_router(tmp_path, f"echo $$ > {pidfile}; echo starting >&2; exec sleep 60"),
        ready_timeout=1.0,
    )
    with pytest.raises(UserError, match=r"not ready in 1s .*starting"):
        await start_router(cfg, P, D, tmp_path)
    pid = int(pidfile.read_text())
    await asyncio.sleep(0.1)
    with pytest.raises(ProcessLookupError):  # stopped: no process left behind
        os.kill(pid, 0)


def test_the_scenarios_router_section_is_read() -> None:
    sc = load_scenario(Path(TINY))
    assert sc.router is None
    data = yaml.safe_load(Path(TINY).read_text())
    data["router"] = {"kind": "external", "policy": "round_robin"}
    got = scenario_from_data(data, Path(TINY))
    assert got.router == ExternalRouterConfig(policy="round_robin")


def test_an_external_router_with_the_tc_shaper_is_refused(tmp_path: Path) -> None:
    """Its control-path proxies would listen in the run's namespaces, out of its reach."""
    data = yaml.safe_load(Path(TINY).read_text())
    data["router"] = {"kind": "external"}
    data["deployments"]["prfaas-pd"]["link"]["shaper"] = "tc"
    opts = RunOptions(out_dir=tmp_path, progress=False)
    rp = prepare_run(scenario_from_data(data, Path(TINY)), opts)
    with pytest.raises(UserError, match=r"link\.shaper emulator only"):
        external_run.ExternalRun(rp, opts)


def test_router_option_puts_the_router_in_front_at_time_scale_1() -> None:
    sc = load_scenario(Path(TINY))
    got = with_router(sc, "sglang-router:round_robin", time_scale_set=False)
    assert got.router is not None and got.router.policy == "round_robin"
    assert got.scale.time_scale == 1.0 and sc.scale.time_scale == 20
    assert with_router(sc, "sglang-router", time_scale_set=True).scale.time_scale == 20
    with pytest.raises(UserError, match="--router sglang-router:nope: policy"):
        with_router(sc, "sglang-router:nope", time_scale_set=False)


def test_run_router_flag_runs_the_external_router(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    seen: list[RunPlan] = []

    async def fake(rp: RunPlan, opts: RunOptions, progress: Any = None) -> RunResult:
        seen.append(rp)
        return RunResult(opts.out_dir, [], [], {}, [])

    monkeypatch.setattr(external_run, "run_external", fake)
    monkeypatch.setattr("testbed.cli.run.to_text", lambda summary: "summary")
    args = ["run", TINY, "--quiet", "--out", str(tmp_path), "--router", "sglang-router"]
    assert main(args) == 0
    (rp,) = seen
    assert rp.scenario.router is not None and rp.scenario.scale.time_scale == 1.0
    assert main([*args[:-1], "sglang-router:nope"]) == 2
    assert main([*args, "--substrate", "sim"]) == 2  # not silently our router on the sim


def test_a_record_joins_the_clients_view_and_the_completed_attempt() -> None:
    req = RequestSpec("r1", 1.0, 1000, 16)
    view = ClientView(sent=1.0, first_token=1.5, last_token=2.0, tokens=16)
    failed = {"side": "decode", "outcome": "failed", "instance": "local-decode-1"}
    done = {"side": "decode", "outcome": "completed", "instance": "local-decode-0",
            "cluster": "local", "route": "prfaas", "prefill_instance": "prfaas-prefill-0",
            "prefill_start": 10.0, "transfer_end": 11.0, "kv_wire_bytes_expected": 5,
            "kv_wire_bytes_sent": 5, "kv_wire_bytes_received": 5, "kv_verified": True}  # fmt: skip
    prefill = {"side": "prefill", "outcome": "completed"}
    rec = join_record(req, view, [failed, prefill, done], lambda t: t - 9.0)
    assert (rec.status, rec.retries, rec.route, rec.cross_dc) == ("completed", 1, "prfaas", True)
    assert (rec.prefill_instance, rec.decode_instance) == ("prfaas-prefill-0", "local-decode-0")
    assert (rec.prefill_start, rec.transfer_end, rec.first_token) == (1.0, 2.0, 1.5)
    assert rec.kv_verified and rec.kv_wire_bytes_received == 5 and rec.tokens_out == 16
    # the client saw it complete, no completed attempt is on record: not verified
    assert not join_record(req, view, [failed], lambda t: t).kv_verified
    bad = ClientView(sent=1.0, error="router answered HTTP 503: Prefill server error")
    rec = join_record(req, bad, [failed], lambda t: t)
    assert (rec.status, rec.failure_reason) == ("failed", bad.error)


def test_prompt_text_shares_blocks_by_hash_id() -> None:
    text = PromptText()
    a = text.prompt(RequestSpec("a", 0.0, 1100, 4, (7, 8, 9)))
    b = text.prompt(RequestSpec("b", 0.0, 600, 4, (7, 5)))
    assert a[: len(text.block(7, 512))] == b[: len(text.block(7, 512))]
    assert a != b and len(text.words[0]) > 1


def test_a_stream_its_worker_died_in_keeps_the_kv_it_verified() -> None:
    """A decode killed while it streams journals no outcome; its progress entry (journaled
    when its KV was verified, before the status line) still proves the tokens the client got
    came from verified KV, and is one attempt with the outcome that may follow it."""
    from testbed.services.facade.journal import VERIFIED

    req = RequestSpec("r1", 1.0, 1000, 16)
    kv = {"kv_wire_bytes_expected": 5, "kv_wire_bytes_sent": 5, "kv_wire_bytes_received": 5,
          "kv_verified": True, "route": "prfaas", "cluster": "local"}  # fmt: skip
    verified = {"side": "decode", "outcome": VERIFIED, "instance": "local-decode-0", "room": 3,
                "arrival": 5.0, **kv}  # fmt: skip
    broken = ClientView(sent=1.0, first_token=1.5, tokens=3, error="ClientPayloadError: ...")
    rec = join_record(req, broken, [verified], lambda t: t)
    assert (rec.status, rec.failure_reason, rec.retries) == ("failed", broken.error, 0)
    assert rec.kv_verified and rec.tokens_out == 3 and rec.kv_wire_bytes_received == 5
    done = {**verified, "outcome": "completed"}
    view = ClientView(sent=1.0, first_token=1.5, last_token=2.0, tokens=16)
    rec = join_record(req, view, [verified, done], lambda t: t)
    assert (rec.status, rec.retries, rec.kv_verified) == ("completed", 0, True)


async def test_a_restarted_workers_journal_is_read_from_its_start() -> None:
    """A restarted decode's journal counts from 1 again: the runner, which asks for entries
    after the last it read, sees another `boot` and reads the new journal from its start."""
    from types import SimpleNamespace

    import aiohttp
    from aiohttp import web
    from aiohttp.test_utils import TestServer

    from testbed.services.facade.journal import AttemptJournal, attempts_handler

    first, second = AttemptJournal(), AttemptJournal()
    for i in range(3):
        first.add("completed", request=f"r{i}")
    second.add("completed", request="after-restart")
    serving = {"journal": first}

    async def handler(request: web.Request) -> web.StreamResponse:
        return await attempts_handler(serving["journal"])(request)

    app = web.Application()
    app.router.add_get("/facade/attempts", handler)
    async with TestServer(app, host="127.0.0.1") as server, aiohttp.ClientSession() as session:
        inst = InstanceInfo(id="local-decode-0", cluster="local", role="decode",
                            url=str(server.make_url("")).rstrip("/"))  # fmt: skip
        run = SimpleNamespace(read_upto={}, boots={})
        doc = await external_run.ExternalRun._journal(run, session, inst)  # type: ignore[arg-type]
        assert [a["request"] for a in doc["attempts"]] == ["r0", "r1", "r2"]
        run.read_upto[inst.id] = 3
        serving["journal"] = second  # the worker was killed and restarted
        doc = await external_run.ExternalRun._journal(run, session, inst)  # type: ignore[arg-type]
        assert [a["request"] for a in doc["attempts"]] == ["after-restart"]
        assert run.read_upto[inst.id] == 0 and run.boots[inst.id] == second.boot
