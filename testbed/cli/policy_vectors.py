"""`testbed policy-vectors URL`: the protocol's shared test vectors, run against your service.

The vectors (testbed/data/policy-vectors/*.json, written by tests/policy/make_vectors.py) ship
with the package, so the author of an outside scheduler checks it against the contract of
`prfaas-policy/1` from a pip-installed testbed, before any run and without the test source:

    testbed policy-vectors http://127.0.0.1:9000/route [--timeout 2s] [--exact]

Each decision vector is a sequence of decisions one router sends (a full snapshot, a delta on
it, a delta on a base the service never saw...) and what the service must answer. They are
posted in order, each vector under a router id of its own, so a service's copy from one vector
(or from an earlier invocation) is never the base of another's delta. An answer passes when it
is what the router would take: the expected status (409 for a delta on an unknown base, 503
when no route exists) and, for a 200, a route the router applies as it is (the same checks as
`testbed.policy.decider.route_problem` on the service's copy of the deployment, and the JSON
Schema when `jsonschema` is installed). `--exact` also asks for the example scheduler's own
routes (examples/least-ttft), for a service meant to route as it does. The `answer-*` vectors
describe what the router makes of a service's answers, not what a service must do: they are
not sent.

Every exchange is bounded by `--timeout` and by the router's answer size cap
(testbed.policy.http_client, shared with the router); prints one line
per vector and a summary; exit code 0 when every vector passes, 1 when any fails, 2 when the
URL is not one or nothing listens there (one line, no traceback).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from testbed.errors import UserError
from testbed.policy.decider import route_problem
from testbed.policy.http import check_schema
from testbed.policy.http_client import read_capped
from testbed.policy.protocol import (
    ProtocolError,
    SnapshotMirror,
    decode_route,
    encode_route,
    snapshot_from_doc,
)
from testbed.units import UnitError, parse_duration

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "VECTORS_DIR",
    "Verdict",
    "add_parser",
    "check_service",
    "decision_vectors",
    "load_vectors",
]

VECTORS_DIR = Path(__file__).resolve().parents[1] / "data" / "policy-vectors"
"""Package data (pyproject's package-data), so an installed testbed has them."""
DEFAULT_TIMEOUT_S = 2.0
"""Per exchange: generous, since this judges answers, not speed (a run's `timeout` does)."""
_SHOWN = 80
"""Characters of an unexpected answer's body quoted in a FAIL line."""


def load_vectors(directory: Path = VECTORS_DIR) -> list[dict[str, Any]]:
    """Every vector, by name."""
    return [json.loads(p.read_text()) for p in sorted(directory.glob("*.json"))]


def decision_vectors(directory: Path = VECTORS_DIR) -> list[dict[str, Any]]:
    """The vectors a service is checked against: decisions to send, each with its answer."""
    return [v for v in load_vectors(directory) if "steps" in v]


@dataclass(frozen=True)
class Verdict:
    name: str
    ok: bool
    detail: str
    """What each step answered (ok), or why the vector failed."""
    slowest_ms: float | None = None
    """The slowest answer's wall time, from posting to the last byte read."""
    steps: int = 1


class _Failed(Exception):
    """One step's answer is not what the router needs (the message says why)."""


@dataclass(frozen=True)
class _Answer:
    status: int
    body: bytes
    ms: float


def _schema_checker() -> bool:
    """Whether the JSON Schemas can be checked here (jsonschema installed, schemas/ present)."""
    try:
        check_schema("decision-response", {"route": {}})
    except ProtocolError:
        return True
    except (RuntimeError, KeyError, OSError):  # no jsonschema, or an install without schemas/
        return False
    return True


def _shown(body: bytes) -> str:
    text = " ".join(body[:_SHOWN].decode(errors="replace").split())
    return f": {text!r}" if text else ""


async def _post(session: Any, url: str, doc: dict[str, Any], timeout_s: float) -> _Answer:
    """One exchange as the router makes it, within `timeout_s` and the size cap."""
    import aiohttp

    data = json.dumps(doc, separators=(",", ":")).encode()
    t0 = time.monotonic()
    try:
        async with asyncio.timeout(timeout_s):
            async with session.post(
                url,
                data=data,
                headers={"Content-Type": "application/json"},
                allow_redirects=False,  # as the router: the URL is the contract
            ) as resp:
                try:
                    body = await read_capped(resp)
                except ProtocolError as exc:  # over the router's cap
                    raise _Failed(f"HTTP {resp.status}: {exc}") from None
                return _Answer(resp.status, body, (time.monotonic() - t0) * 1e3)
    except TimeoutError:
        raise _Failed(f"no answer within {timeout_s:g}s (the router: a fallback)") from None
    except aiohttp.ClientConnectorError as exc:
        raise _Failed(
            f"unreachable: {' '.join(str(exc).split())} (did the service exit?)"
        ) from None
    except (OSError, aiohttp.ClientError) as exc:
        raise _Failed(f"the exchange broke: {type(exc).__name__}: {exc}") from None


def _judge(
    step: dict[str, Any], answer: _Answer, mirror: SnapshotMirror, *, exact: bool, schemas: bool
) -> str:
    """What the step's answer was (for the ok line); _Failed when the router could not take it.

    `mirror` is the service's copy as a correct service holds it after this step's snapshot
    (what the route is checked against: a delta's instances plus the ones held)."""
    want = step["expect"]["status"]
    expected = {200: "a route", 409: "resync", 503: "no route yet"}.get(want, "")
    if answer.status != want:
        raise _Failed(f"HTTP {answer.status}{_shown(answer.body)}; expected {want} ({expected})")
    if want == 409:
        return "409 resync"
    if want == 503:
        return "503 no route yet"
    try:
        doc = json.loads(answer.body)
    except ValueError:
        raise _Failed(f"HTTP 200 but not JSON{_shown(answer.body)} (garbage)") from None
    try:
        if schemas:
            check_schema("decision-response", doc)
        route = decode_route(doc)  # its own threshold_tokens, if it gives one
    except ProtocolError as exc:
        raise _Failed(str(exc)) from None
    snap = snapshot_from_doc(step["decision"]["snapshot"], mirror.rows, mirror.costs)
    problem = route_problem(route, snap)
    if problem is not None:
        raise _Failed(f"the router would not apply this route: {problem}")
    got = encode_route(route)
    text = f"{route.prefill_cluster} {route.prefill_instance} -> {route.decode_instance}"
    if exact and got != step["expect"]["route"]:
        e = step["expect"]["route"]
        raise _Failed(
            f"route {text}; the example's is {e['prefill_cluster']} {e['prefill_instance']} -> "
            f"{e['decode_instance']} (--exact; uncached {got['uncached_tokens']} vs "
            f"{e['uncached_tokens']})"
        )
    said = "" if route.threshold_tokens is None else f" (threshold {route.threshold_tokens:g})"
    return f"200 {text}{said}"


async def _run_vector(
    session: Any, url: str, vec: dict[str, Any], router: str, timeout_s: float, *, exact: bool,
    schemas: bool,
) -> Verdict:  # fmt: skip
    mirror = SnapshotMirror()  # what a correct service holds, to check routes on deltas
    said: list[str] = []
    slowest = 0.0
    n = len(vec["steps"])
    for i, step in enumerate(vec["steps"], 1):
        doc = {**step["decision"], "router": router}
        where = f"step {i} of {n}: " if n > 1 else ""
        try:
            answer = await _post(session, url, doc, timeout_s)
            slowest = max(slowest, answer.ms)
            if step["expect"]["status"] != 409:
                mirror.apply(doc["snapshot"])
            said.append(_judge(step, answer, mirror, exact=exact, schemas=schemas))
        except _Failed as why:
            return Verdict(vec["name"], False, f"{where}{why} - {vec['description']}", slowest, n)
    return Verdict(vec["name"], True, ", then ".join(said), slowest, n)


async def check_service(
    url: str,
    vectors: list[dict[str, Any]],
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    exact: bool = False,
    schemas: bool | None = None,
) -> list[Verdict]:
    """Each vector's verdict for the service at `url`, in order (the service must be up)."""
    import aiohttp

    if schemas is None:
        schemas = _schema_checker()
    run = secrets.token_hex(3)
    out = []
    async with aiohttp.ClientSession() as session:
        for i, vec in enumerate(vectors):
            router = f"r-vectors-{run}-{i}"
            out.append(await _run_vector(session, url, vec, router, timeout_s, exact=exact,
                                         schemas=schemas))  # fmt: skip
    return out


def _endpoint(text: str) -> tuple[str, str, int]:
    """The URL to post to (fragment dropped: a policy name's settings are never sent), its host
    and port; UserError unless it is an http(s) URL with a host."""
    url = urllib.parse.urldefrag(text)[0]
    parts = urllib.parse.urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        raise UserError(f"{text!r}: not a URL with a valid port") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UserError(f"{text!r}: write the service's URL as http://host:port/path")
    return url, parts.hostname, port or (443 if parts.scheme == "https" else 80)


async def _reachable(host: str, port: int, timeout_s: float) -> str | None:
    """None when something accepts a connection at host:port, else why not (one line)."""
    try:
        async with asyncio.timeout(timeout_s):
            _, writer = await asyncio.open_connection(host, port)
    except TimeoutError:
        return f"no connection within {timeout_s:g}s"
    except OSError as exc:
        return " ".join(str(exc).split()) or type(exc).__name__
    writer.close()
    return None


def _run(args: argparse.Namespace) -> int:
    url, host, port = _endpoint(args.url)
    vectors = decision_vectors()
    if not vectors:
        raise UserError(f"no test vectors in {VECTORS_DIR}/ (a broken installation)")
    schemas = _schema_checker()

    async def main() -> list[Verdict]:
        why = await _reachable(host, port, args.timeout)
        if why is not None:
            raise UserError(f"{url}: unreachable: {why} (is the service running?)")
        return await check_service(
            url, vectors, timeout_s=args.timeout, exact=args.exact, schemas=schemas
        )

    verdicts = asyncio.run(main())
    width = max(len(v.name) for v in verdicts)
    for v in verdicts:
        ms = ""
        if v.ok and v.slowest_ms is not None:
            ms = f" ({'slowest ' if v.steps > 1 else ''}{v.slowest_ms:.1f} ms)"
        print(f"{'ok  ' if v.ok else 'FAIL'} {v.name.ljust(width)}  {v.detail}{ms}")
    failed = sum(not v.ok for v in verdicts)
    checked = ["statuses", "routes the router accepts"]
    if args.exact:
        checked.append("the example's routes")
    checked.append("JSON Schemas" if schemas else "not the JSON Schemas (pip install jsonschema)")
    print(
        f"{len(verdicts)} vectors: {len(verdicts) - failed} ok, {failed} failed "
        f"({url}; checked: {', '.join(checked)})"
    )
    return 1 if failed else 0


def _timeout(text: str) -> float:
    try:
        value = parse_duration(text)
    except UnitError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: a positive duration, e.g. 2s or 500ms")
    return value


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "policy-vectors",
        help="check a running policy service against the protocol's test vectors",
        description="Post the shared test vectors of prfaas-policy/1 (the decisions shipped "
        "with the testbed: full snapshots, deltas, a delta on an unknown base, draining and "
        "suspect instances, no decode instance) to a running policy service, in order, and "
        "check each answer as the router would: the expected status (409 resync, 503 no "
        "route yet) and a route the router applies. One line per vector and a summary; exit "
        "code 0 when all pass, 1 when any fails, 2 for a bad URL or an unreachable service.",
    )
    p.add_argument(
        "url", help="the service's decision URL, e.g. http://127.0.0.1:9000/route (a policy "
        "name's #settings are ignored)",
    )  # fmt: skip
    p.add_argument(
        "--timeout",
        type=_timeout,
        default=DEFAULT_TIMEOUT_S,
        metavar="DURATION",
        help=f"bound on each exchange and on connecting (default {DEFAULT_TIMEOUT_S:g}s)",
    )
    p.add_argument(
        "--exact",
        action="store_true",
        help="also require the example scheduler's routes (examples/least-ttft), for a service "
        "meant to route as it does",
    )
    p.set_defaults(func=_run)
