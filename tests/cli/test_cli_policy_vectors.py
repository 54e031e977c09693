"""`testbed policy-vectors URL` (testbed/cli/policy_vectors.py): the shared test vectors, from
package data, against a running service; one line per vector, a summary, exit 0 / 1 / 2."""

from __future__ import annotations

import json
import socket

import pytest
from aiohttp import web

from testbed.cli import main
from testbed.cli.policy_vectors import VECTORS_DIR, decision_vectors
from testbed.policy.http_client import MAX_ANSWER_BYTES
from tests.policy.servers import Replay, example_app, serve

NAMES = [v["name"] for v in decision_vectors()]
GOOD = {  # a valid route on every vector's deployment but one (least-ttft-no-decode)
    "prefill_cluster": "prfaas",
    "prefill_instance": "prfaas-p1",
    "decode_instance": "pd-d1",
    "uncached_tokens": 12000,
    "pull_prefix_tokens": 0,
}


def lines(out: str) -> dict[str, str]:
    """Each vector's line by name (the last line is the summary)."""
    found = {}
    for line in out.splitlines()[:-1]:
        verdict, name, rest = line.split(None, 2)
        found[name] = f"{verdict} {rest}"
    return found


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    rc = main(["policy-vectors", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def test_the_vectors_are_package_data() -> None:
    """Under testbed/ (pyproject's package-data ships them), not under tests/."""
    assert VECTORS_DIR.parts[-3:] == ("testbed", "data", "policy-vectors")
    assert len(NAMES) >= 5 and {"least-ttft-delta", "least-ttft-resync"} <= set(NAMES)
    assert not any(n.startswith("answer-") for n in NAMES)  # those test the router, not a service


def test_the_example_service_passes_every_vector(capsys: pytest.CaptureFixture[str]) -> None:
    with serve(example_app()) as base:
        rc, out, _ = run([f"{base}/route#timeout=50ms"], capsys)  # the fragment is dropped
        rc_exact, out_exact, _ = run([f"{base}/route", "--exact"], capsys)
    assert rc == 0 and rc_exact == 0, out + out_exact
    got = lines(out)
    assert sorted(got) == sorted(NAMES) and all(v.startswith("ok ") for v in got.values())
    assert got["least-ttft-resync"].startswith("ok 409 resync, then 200 ")
    assert got["least-ttft-no-decode"].startswith("ok 503 no route yet")
    summary = out.splitlines()[-1]
    assert summary.startswith(f"{len(NAMES)} vectors: {len(NAMES)} ok, 0 failed")
    assert "JSON Schemas" in summary and "the example's routes" in out_exact.splitlines()[-1]


def test_a_service_answering_500_fails_every_vector(capsys: pytest.CaptureFixture[str]) -> None:
    service = Replay(500, "internal error")
    with serve(service.app()) as base:
        rc, out, err = run([f"{base}/route"], capsys)
    assert rc == 1 and not err
    got = lines(out)
    assert sorted(got) == sorted(NAMES)
    for name, line in got.items():
        assert line.startswith("FAIL "), name
        assert "HTTP 500: 'internal error'; expected " in line, line
    assert "expected 409 (resync)" in got["least-ttft-resync"]
    assert out.splitlines()[-1].startswith(f"{len(NAMES)} vectors: 0 ok, {len(NAMES)} failed")
    # each vector under its own router id, so no vector's delta lands on another's base
    routers = {doc["router"] for doc in service.seen}
    assert len(routers) == len(NAMES) and all(r.startswith("r-vectors-") for r in routers)


def test_one_fixed_route_fails_only_where_the_router_would_refuse_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The route prfaas-p1 -> pd-d1 for everything: refused where prfaas-p1 drains, where there
    is no decode instance (503 expected), and where a delta's base is unknown (409 expected)."""
    body = json.dumps({"protocol": "prfaas-policy/1", "route": GOOD})
    with serve(Replay(200, body).app()) as base:
        rc, out, _ = run([f"{base}/route"], capsys)
        rc_exact, out_exact, _ = run([f"{base}/route", "--exact"], capsys)
    assert rc == 1 and rc_exact == 1
    got = lines(out)
    refused = "FAIL the router would not apply this route: not-ok: prefill instance 'prfaas-p1'"
    assert got["least-ttft-states"].startswith(refused + " is draining")
    assert got["least-ttft-no-decode"].startswith("FAIL HTTP 200")
    assert "expected 503 (no route yet)" in got["least-ttft-no-decode"]
    assert got["least-ttft-resync"].startswith("FAIL step 1 of 2: HTTP 200")
    for name in ("least-ttft-full", "least-ttft-delta", "least-ttft-costs-link"):
        assert got[name].startswith("ok "), got[name]
    # --exact: the example routes least-ttft-costs-link locally (the link is loaded)
    exact = lines(out_exact)
    assert exact["least-ttft-full"].startswith("ok ")
    wrong = "FAIL route prfaas prfaas-p1 -> pd-d1; the example's is local pd-p0"
    assert exact["least-ttft-costs-link"].startswith(wrong)


def test_a_delta_answered_on_a_stale_copy_is_caught(capsys: pytest.CaptureFixture[str]) -> None:
    """A service that ignores `removed` routes the delta's request to pd-d2, which left."""
    body = json.dumps(
        {"protocol": "prfaas-policy/1", "route": {**GOOD, "decode_instance": "pd-d2"}}
    )
    with serve(Replay(200, body).app()) as base:
        rc, out, _ = run([f"{base}/route"], capsys)
    assert rc == 1
    assert lines(out)["least-ttft-delta"].startswith(
        "FAIL step 2 of 2: the router would not apply this route: unknown-instance: decode "
        "instance 'pd-d2' is not in the snapshot"
    )


def test_a_routes_threshold_is_shown_and_a_bad_one_fails(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`route.threshold_tokens` is optional: shown when given, garbage when not positive."""
    outs = []
    for t in (19500, -1):
        body = json.dumps({"route": {**GOOD, "threshold_tokens": t}})
        with serve(Replay(200, body).app()) as base:
            outs.append(lines(run([f"{base}/route"], capsys)[1])["least-ttft-full"])
    assert outs[0].startswith("ok ") and "(threshold 19500)" in outs[0]
    assert outs[1].startswith("FAIL ") and "threshold_tokens" in outs[1]


def test_a_late_service_fails_within_the_timeout(capsys: pytest.CaptureFixture[str]) -> None:
    with serve(Replay(200, "{}", delay_s=5.0).app()) as base:
        rc, out, _ = run([f"{base}/route", "--timeout", "100ms"], capsys)
    assert rc == 1
    assert all("no answer within 0.1s" in v for v in lines(out).values()), out


async def _streamed(request: web.Request) -> web.StreamResponse:
    """A 200 with no Content-Length whose body never ends below the cap."""
    await request.read()
    resp = web.StreamResponse()
    await resp.prepare(request)
    chunk = b" " * (1 << 16)
    for _ in range(MAX_ANSWER_BYTES // len(chunk) + 2):
        await resp.write(chunk)
    return resp


def test_an_answer_over_the_cap_fails_unread(capsys: pytest.CaptureFixture[str]) -> None:
    big = Replay(200, " " * (2 * MAX_ANSWER_BYTES))
    streamed = web.Application()
    streamed.router.add_post("/route", _streamed)
    with serve(big.app()) as base, serve(streamed) as base2:
        rc, out, _ = run([f"{base}/route"], capsys)
        rc2, out2, _ = run([f"{base2}/route"], capsys)
    assert rc == 1 and rc2 == 1
    said = f"HTTP 200: garbage: too large ({2 * MAX_ANSWER_BYTES:,} bytes"
    assert all(said in v for v in lines(out).values()), out
    assert all("HTTP 200: garbage: too large (" in v for v in lines(out2).values()), out2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("http://127.0.0.1:{free}/route", "unreachable"),
        ("ftp://127.0.0.1/route", "write the service's URL as http://host:port/path"),
        ("http://127.0.0.1:99999/route", "not a URL with a valid port"),
        ("127.0.0.1:9000/route", "write the service's URL"),
    ],
)
def test_a_bad_url_or_no_service_is_one_line_and_exit_2(
    url: str, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # the free port is found when the test runs, not in its id: every collection of the suite
    # (pytest-xdist's workers each collect it) names the same tests
    url = url.replace("{free}", str(_free_port()))
    rc, out, err = run([url], capsys)
    assert rc == 2 and not out
    assert err.count("\n") == 1 and says in err and "Traceback" not in err


def test_help_says_what_it_does(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["policy-vectors", "--help"])
    out = capsys.readouterr().out
    assert exit_.value.code == 0 and out.startswith("usage: testbed policy-vectors")
    assert "test vectors" in out and "--timeout" in out and "--exact" in out
    with pytest.raises(SystemExit) as exit_:
        main(["policy-vectors", "http://127.0.0.1:1/route", "--timeout", "0s"])
    assert exit_.value.code == 2
