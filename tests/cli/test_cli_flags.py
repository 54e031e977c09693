"""Every command-line flag reaches what it claims to set: each command runs in process with the
part that would start processes, touch the kernel or need torch replaced by a recorder, and
the flag's value is found where the command hands it on. What the receiving code does with it
is shown by the tests tests/test_no_silent_fields.py pairs these with."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from testbed import __version__
from testbed.cli import main
from testbed.scenario.plan import Progress, RunOptions, RunPlan, RunResult

ROOT = Path(__file__).resolve().parents[2]
TINY = str(ROOT / "tests" / "data" / "tiny.yaml")


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out.strip() == f"testbed {__version__}"


@pytest.fixture
def runs(monkeypatch: pytest.MonkeyPatch) -> list[tuple[RunPlan, RunOptions]]:
    """`testbed run` with the live run replaced: what it would have run, in order."""
    import testbed.cli.run as cli_run

    seen: list[tuple[RunPlan, RunOptions]] = []

    async def fake_run(rp: RunPlan, opts: RunOptions, progress: Any = None) -> RunResult:
        seen.append((rp, opts))
        if progress is not None:
            progress(Progress("starting", planned=1, services=4))
            progress(Progress("running", submitted=1, planned=1, workload_s=1, duration_s=2))
        return RunResult(opts.out_dir, [], [], {}, [])

    monkeypatch.setattr("testbed.scenario.runner.run_scenario", fake_run)  # imported per live run
    monkeypatch.setattr(cli_run, "to_text", lambda summary: "summary")
    return seen


def test_run_flags_reach_the_plan_and_the_options(
    runs: list[tuple[RunPlan, RunOptions]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["run", TINY, "--quiet", "--out", str(tmp_path / "o")]) == 0
    (rp, opts), = runs  # fmt: skip
    assert (rp.policy, rp.duration_s, opts.substrate) == ("prfaas-static", 40.0, "local")
    assert (
        opts.out_dir == tmp_path / "o" and f"results: {tmp_path / 'o'}/" in capsys.readouterr().out
    )
    trace = tmp_path / "t.jsonl"
    trace.write_text(
        "".join(
            json.dumps({"timestamp": i, "input_length": 777, "output_length": 5, "hash_ids": []})
            + "\n"
            for i in range(3)
        )
    )
    argv = ["run", TINY, "--quiet", "--out", str(tmp_path / "p"), "--policy", "prfaas",
            "--duration", "15", "--substrate", "compose", "--trace", str(trace)]  # fmt: skip
    assert main(argv) == 0
    rp, opts = runs[1]
    assert (rp.policy, rp.duration_s, opts.substrate, opts.trace) == (
        "prfaas", 15.0, "compose", str(trace),
    )  # fmt: skip
    assert {(r.input_tokens, r.output_tokens) for r in rp.requests} == {(777, 5)}


def test_set_writes_fields_of_the_scenario_for_this_run(
    runs: list[tuple[RunPlan, RunOptions]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["run", TINY, "--quiet", "--out", str(tmp_path / "a")]) == 0
    argv = ["run", TINY, "--quiet", "--out", str(tmp_path / "b"),
            "--set", "workload.arrivals.rate=0.5", "--set", "policy.name=prfaas"]  # fmt: skip
    assert main(argv) == 0
    (base, _), (rp, _) = runs
    assert (base.rate_rps, base.policy) == (1.0, "prfaas-static")
    assert (rp.rate_rps, rp.policy) == (0.5, "prfaas")
    assert len(rp.requests) < len(base.requests)  # the workload follows the rate written in
    # a bad value fails like the file would, naming the file, the field and the --set
    assert main(["run", TINY, "--quiet", "--set", "workload.arrivals.rate=x"]) == 2
    err = capsys.readouterr().err
    assert "tiny.yaml: workload.arrivals.rate" in err and "with --set" in err
    with pytest.raises(SystemExit):
        main(["run", TINY, "--set", "load"])
    assert "write it as path=value" in capsys.readouterr().err
    assert main(["run", TINY, "--quiet", "--set", "seed=1", "--set", "seed=2"]) == 2
    assert "each path may be --set once" in capsys.readouterr().err
    assert len(runs) == 2


def test_shaper_overrides_the_link_shaper_and_the_header_says_which(
    runs: list[tuple[RunPlan, RunOptions]],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import testbed.link.netns_link

    probes: list[str] = []
    monkeypatch.setattr(testbed.link.netns_link, "preflight", lambda: probes.append("p") or False)
    assert main(["run", TINY, "--quiet", "--out", str(tmp_path)]) == 0
    assert runs[0][0].deployment.link.shaper == "emulator" and not probes
    assert "link shaper: emulator" in capsys.readouterr().err
    assert main(["run", TINY, "--quiet", "--out", str(tmp_path), "--shaper", "tc"]) == 0
    assert runs[1][1].shaper == "tc" and runs[1][0].deployment.link.shaper == "tc"
    assert probes == ["p"]  # the kernel preflight ran before the run
    assert "link shaper: tc (htb on a veth" in capsys.readouterr().err


def test_quiet_drops_the_progress_bar(
    runs: list[tuple[RunPlan, RunOptions]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["run", TINY, "--out", str(tmp_path)]) == 0
    assert "%|" in capsys.readouterr().err and runs[0][1].progress
    assert main(["run", TINY, "--out", str(tmp_path), "--quiet"]) == 0
    assert "%|" not in capsys.readouterr().err and not runs[1][1].progress


def test_link_serve_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    import testbed.lifeline
    import testbed.link.server

    got: dict[str, Any] = {}

    async def serve(
        host: str, port: int, *, seed: int | None, config: str | None, listen_netns: str | None
    ) -> None:
        got.update(host=host, port=port, seed=seed, config=config, listen_netns=listen_netns)

    monkeypatch.setattr(testbed.lifeline, "die_with_parent", lambda: None)
    monkeypatch.setattr(testbed.link.server, "serve", serve)
    argv = ["link", "serve", "--host", "127.0.0.2", "--port", "0", "--config", "c.json"]
    assert main([*argv, "--seed", "7"]) == 0
    assert got == {
        "host": "127.0.0.2", "port": 0, "seed": 7, "config": "c.json", "listen_netns": None,
    }  # fmt: skip
    assert main([*argv, "--listen-netns", "tbl-x-b"]) == 0
    assert got["listen_netns"] == "tbl-x-b"


class Pair:
    def __init__(self, calls: list[tuple[Any, ...]], name: str) -> None:
        self.calls, self.name = calls, name

    def describe(self) -> str:
        return self.name

    def set_rate(self, rate: float, **kw: Any) -> None:
        self.calls.append(("rate", self.name, rate, kw))

    def show(self) -> str:
        self.calls.append(("show", self.name))
        return self.name


@pytest.fixture
def tc_calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    """`testbed link tc ...` with the kernel calls replaced by a recorder."""
    from testbed.link import tc

    calls: list[tuple[Any, ...]] = []

    def create_pair(name: str, **kw: Any) -> Pair:
        calls.append(("up", name, kw))
        return Pair(calls, name)

    def teardown(name: str, *, all_mine: bool, stale: bool) -> list[str]:
        calls.append(("down", name, all_mine, stale))
        return []

    monkeypatch.setattr(tc, "create_pair", create_pair)
    monkeypatch.setattr(tc, "existing_pair", lambda name: Pair(calls, name))
    monkeypatch.setattr(tc, "teardown", teardown)
    return calls


def test_link_tc_up_and_rate_flags(tc_calls: list[tuple[Any, ...]]) -> None:
    assert main(["link", "tc", "up"]) == 0
    assert main(["link", "tc", "up", "--name", "x", "--rate", "8Mbps", "--qdisc", "tbf",
                 "--one-way", "--wire"]) == 0  # fmt: skip
    assert main(["link", "tc", "rate", "--rate", "16Mbps"]) == 0
    assert main(["link", "tc", "rate", "--name", "y", "--rate", "16Mbps", "--qdisc", "tbf",
                 "--one-way", "--wire"]) == 0  # fmt: skip
    defaults = {"qdisc": "htb", "both": True, "goodput": True}
    flagged = {"qdisc": "tbf", "both": False, "goodput": False}
    assert tc_calls == [
        ("up", "link", {"rate": None, **defaults}),
        ("up", "x", {"rate": 1e6, **flagged}),
        ("rate", "link", 2e6, defaults),
        ("rate", "y", 2e6, flagged),
    ]


def test_link_tc_show_and_down_flags(tc_calls: list[tuple[Any, ...]]) -> None:
    assert main(["link", "tc", "show", "--name", "z"]) == 0
    assert main(["link", "tc", "down", "--name", "z"]) == 0
    assert main(["link", "tc", "down", "--all"]) == 0
    assert main(["link", "tc", "down", "--stale"]) == 0
    assert tc_calls == [
        ("show", "z"),
        ("down", "z", False, False),
        ("down", "link", True, False),
        ("down", "link", False, True),
    ]


@pytest.fixture
def verify_opts(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """`testbed verify-model` with torch and the harness replaced: the options it was given."""
    seen: list[dict[str, Any]] = []

    class VerifyOptions:
        def __init__(self, **kw: Any) -> None:
            seen.append(kw)

    async def run_verify(opts: Any) -> dict[str, Any]:
        return {"ok": True, "prompts": seen[-1]["prompts"], "model": {"layers": "x"},
                "elapsed_s": 0, "failures": [],
                **dict.fromkeys(("token_exact", "prefix_hit_exact", "reset_retried_exact",
                                 "corrupt_detected", "corrupt_retried_exact"), 0)}  # fmt: skip

    fake_torch = types.ModuleType("torch")
    fake_torch.set_num_threads = lambda n: None  # type: ignore[attr-defined]
    fake_verify = types.ModuleType("testbed.engine.torch.verify")
    fake_verify.VerifyOptions = VerifyOptions  # type: ignore[attr-defined]
    fake_verify.run_verify = run_verify  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch", fake_torch)
    monkeypatch.setitem(sys.modules, "testbed.engine.torch.verify", fake_verify)
    return seen


def test_verify_model_flags(
    verify_opts: list[dict[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["verify-model"]) == 0
    assert capsys.readouterr().out.startswith("verify-model: 50 prompts")
    argv = ["verify-model", "--prompts", "3", "--seed", "4", "--max-new-tokens", "2",
            "--bandwidth", "8Mbps", "--latency", "7ms", "--jitter", "1ms", "--time-scale", "0",
            "--dtype", "float64", "--json"]  # fmt: skip
    assert main(argv) == 0
    assert json.loads(capsys.readouterr().out)["prompts"] == 3
    default, flagged = verify_opts
    model = flagged.pop("model")
    assert (model.seed, model.dtype) == (4, "float64")
    assert default["model"].dtype == "float32"
    assert flagged == {"prompts": 3, "seed": 4, "max_new_tokens": 2, "bandwidth": 1e6,
                       "latency_ms": 7, "jitter_ms": 1, "time_scale": 0.0}  # fmt: skip


def test_compose_command_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    from testbed.substrate.compose import __main__ as compose_cli

    calls: list[tuple[Any, ...]] = []

    def ensure_images(*, force: bool) -> str:
        calls.append(("images", force))
        return "tag"

    def down(run: str | None) -> dict[str, int]:
        calls.append(("down", run))
        return {}

    monkeypatch.setattr(compose_cli, "ensure_images", ensure_images)
    monkeypatch.setattr(compose_cli, "down", down)
    monkeypatch.setattr(compose_cli, "leftovers", lambda run: {})
    for argv in (["images"], ["images", "--force"], ["down"], ["down", "--run", "r1"]):
        assert compose_cli.main(argv) == 0
    assert calls == [("images", False), ("images", True), ("down", None), ("down", "r1")]
