"""`testbed up --router` without a live router: an outside client's record is joined from the
workers' attempts alone (external_run.join_attempts, keyed by external_run.attempt_key), and
the command refuses what an external router does not stand up with (one line, exit 2). The live
behaviour is tests/chaos/test_up_router.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from testbed.cli import main
from testbed.scenario.external_run import attempt_key, join_attempts
from testbed.scenario.plan import RunOptions, RunPlan, RunResult
from testbed.scenario.standing import Endpoints

ROOT = Path(__file__).resolve().parents[2]
TINY = str(ROOT / "tests" / "data" / "tiny.yaml")
VLLM_ID = "___prefill_addr_127.0.0.1:1___decode_addr_127.0.0.1:2_0f3a9c"


def _decode(outcome: str, **kw: Any) -> dict[str, Any]:
    return {"side": "decode", "outcome": outcome, "instance": "local-decode-0",
            "cluster": "local", "input_tokens": 900, "output_tokens": 16, **kw}  # fmt: skip


def test_attempts_are_keyed_by_label_then_vllm_routers_id_then_room() -> None:
    assert attempt_key({"request": "r-1", "room": 5, "router_id": VLLM_ID}) == "r-1"
    assert attempt_key({"room": 5, "router_id": VLLM_ID}) == "router-0f3a9c"
    # a client's own X-Request-Id (SGLang's gateway passes it to the decode half only) is not
    # a key: the two halves of one attempt would part
    assert attempt_key({"room": 5, "router_id": "my-req-1"}) == "room-5"
    assert attempt_key({"side": "decode"}) is None


def test_a_completed_request_is_the_decode_attempts_server_side_view() -> None:
    prefill = {"side": "prefill", "outcome": "completed", "arrival": 20.0, "input_tokens": 900}
    retried = _decode("failed", arrival=20.1, reason="decode on local-decode-1: KV timeout")
    done = _decode("completed", arrival=21.0, route="prfaas", prefill_instance="prfaas-prefill-0",
                   prefill_start=21.0, transfer_end=22.0, first_token=22.5, last_token=24.0,
                   tokens_out=16, kv_wire_bytes_expected=7, kv_wire_bytes_sent=7,
                   kv_wire_bytes_received=7, kv_verified=True)  # fmt: skip
    rec = join_attempts("r-1", [done, retried, prefill], lambda t: t - 10.0)
    assert (rec.id, rec.status, rec.retries, rec.route, rec.cross_dc) == (
        "r-1", "completed", 1, "prfaas", True)  # fmt: skip
    # arrival is the first attempt's at a worker; first and last token are the decode's
    assert (rec.arrival, rec.first_token, rec.last_token, rec.tokens_out) == (10.0, 12.5, 14.0, 16)
    assert (rec.input_tokens, rec.output_tokens, rec.prefill_start) == (900, 16, 11.0)
    assert rec.kv_verified and rec.kv_wire_bytes_received == 7


def test_no_completed_decode_attempt_is_a_failure_with_the_attempts_reason() -> None:
    prefill = {"side": "prefill", "outcome": "failed", "arrival": 1.0, "input_tokens": 50,
               "reason": "prefill on prfaas-prefill-0: killed"}  # fmt: skip
    orphan = _decode("failed", arrival=1.0, reason="decode on local-decode-0: prefill failed")
    rec = join_attempts("room-9", [prefill, orphan], lambda t: t)
    assert (rec.status, rec.arrival, rec.input_tokens) == ("failed", 1.0, 900)
    assert rec.failure_reason == "decode attempt failed: decode on local-decode-0: prefill failed"
    assert not rec.kv_verified and rec.first_token is None
    only = join_attempts("room-9", [prefill], lambda t: t)  # vllm-router: no decode was called
    assert (only.status, only.output_tokens) == ("failed", 0)
    assert only.failure_reason == "prefill attempt failed: prefill on prfaas-prefill-0: killed"
    # a prefill that ended well but no decode attempt on record (one still streaming at exit)
    held = join_attempts("k", [{**prefill, "outcome": "completed", "reason": None}], lambda t: t)
    assert held.failure_reason == "prefill attempt completed: no completed decode attempt"


@pytest.fixture
def ups(monkeypatch: pytest.MonkeyPatch) -> list[RunPlan]:
    """`testbed up --router` with the standing deployment replaced."""
    import testbed.scenario.standing_router as standing_router

    seen: list[RunPlan] = []

    async def fake(rp: RunPlan, opts: RunOptions, *, on_ready: Any, **_kw: Any) -> RunResult:
        seen.append(rp)
        on_ready(
            Endpoints("http://x/v1", "http://x", None, {}, external="sglang-router:cache_aware")
        )
        return RunResult(opts.out_dir, [], [], {}, [])

    monkeypatch.setattr(standing_router, "stand_up_router", fake)
    monkeypatch.setattr("testbed.cli.up.to_text", lambda summary: "summary")
    return seen


def test_up_router_stands_the_router_up_at_time_scale_1(
    ups: list[RunPlan], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["up", TINY, "--out", str(tmp_path), "--router", "vllm-router:round_robin"]) == 0
    (rp,) = ups
    assert rp.scenario.router is not None and rp.scenario.router.preset == "vllm-router"
    assert rp.scenario.router.policy == "round_robin" and rp.scenario.scale.time_scale == 1.0
    out = capsys.readouterr().out
    assert "OpenAI base URL:  http://x/v1" in out and "external router: sglang-router" in out


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        (["--substrate", "compose"], "local substrate only"),
        (["--prometheus"], "--prometheus needs --substrate compose, which an external router"),
        (["--time-scale", "4"], "--time-scale 4: an external router runs at time_scale 1"),
        (["--router", "sglang-router:nope"], "--router sglang-router:nope: policy"),
    ],
)
def test_up_router_refuses_in_one_line(
    ups: list[RunPlan], tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str],
    said: str,
) -> None:  # fmt: skip
    argv = ["up", TINY, "--out", str(tmp_path), "--router", "sglang-router", *extra]
    assert main(argv) == 2 and not ups
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and said in err[0], err
