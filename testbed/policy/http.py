"""A policy answered by an outside service over HTTP (protocol `prfaas-policy/1`).

Named by its URL, wherever a policy name goes: `--policy http://127.0.0.1:9000/route`, or
`policy: {kind: http, url: ..., timeout: 20ms, fallback: prfaas-static}` in a scenario (the
config turns that into the same string). Settings ride in the URL's fragment, which is never
sent: `http://host:port/route#timeout=20ms&fallback=prfaas-static&validate=1`. The registry
makes one class per such name (the resolver below), carrying the fallback's facts (deployment,
threshold, scheduler loops, cache awareness): the service decides routes, the testbed keeps
running what the fallback would need, so a fallback decision is always possible.

`decide` blocks (the sim: a decision takes no virtual time; its wall latency is measured);
`adecide` is the live router's, on one aiohttp session with keep-alive. Either raises
LookupError for "no route yet" (HTTP 503) and anything else for a failure; the shared wrapper
(testbed.policy.decider) turns a failure into a fallback decision. Outcomes go to POST
/feedback from a bounded queue on a worker thread: fire-and-forget, dropped when full.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import os
import queue
import secrets
import signal
import socket
import subprocess
import threading
import time
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from testbed.config import DeploymentKind
from testbed.policy.base import POLICIES, Policy, RequestView, Route, Snapshot
from testbed.policy.protocol import (
    FEEDBACK_PATH,
    DeltaEncoder,
    Outcome,
    ProtocolError,
    decode_route,
    encode_decision,
    encode_feedback,
)
from testbed.registry import PluginError, UnknownName
from testbed.units import UnitError, parse_duration

__all__ = [
    "DEFAULT_FALLBACK",
    "DEFAULT_TIMEOUT_S",
    "HttpPolicy",
    "HttpSpec",
    "NoRouteYet",
    "SchedulerProcess",
    "check_schema",
    "is_http_spec",
]

DEFAULT_TIMEOUT_S = 0.020
DEFAULT_FALLBACK = "prfaas-static"
FEEDBACK_QUEUE = 1024
"""Outcomes waiting to be posted; more are dropped (counted), never waited for."""
SCHEMAS = Path(__file__).resolve().parents[2] / "schemas"


class NoRouteYet(LookupError):
    """The service answered 503: no instance can take the request now (wait, as built-ins do)."""


def is_http_spec(spec: str) -> bool:
    return spec.startswith(("http://", "https://"))


@dataclass(frozen=True)
class HttpSpec:
    """What a policy URL says: where to ask, how long to wait, who decides when it fails."""

    url: str
    timeout_s: float = DEFAULT_TIMEOUT_S
    fallback: str = DEFAULT_FALLBACK
    validate: bool = False
    """Debug: check every message against the JSON Schemas in schemas/ (needs jsonschema)."""

    @classmethod
    def parse(cls, spec: str) -> HttpSpec:
        url, _, frag = spec.partition("#")
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"policy URL {spec!r}: write it as http://host:port/path")
        kw: dict[str, Any] = {}
        for key, value in urllib.parse.parse_qsl(frag, keep_blank_values=True):
            if key == "timeout":
                kw["timeout_s"] = parse_duration(value)
                if kw["timeout_s"] <= 0:
                    raise ValueError(f"policy URL {spec!r}: timeout must be positive")
            elif key == "fallback":
                if is_http_spec(value) or not value:
                    raise ValueError(f"policy URL {spec!r}: the fallback must be a policy name")
                kw["fallback"] = value
            elif key == "validate":
                kw["validate"] = value not in ("0", "false", "no", "")
            else:
                raise ValueError(
                    f"policy URL {spec!r}: unknown setting {key!r} in the fragment "
                    "(known: timeout, fallback, validate)"
                )
        return cls(url, **kw)

    def to_spec(self) -> str:
        """The policy name that stands for these settings (only what differs from defaults)."""
        frag = []
        if self.timeout_s != DEFAULT_TIMEOUT_S:
            frag.append(f"timeout={self.timeout_s * 1e3:g}ms")
        if self.fallback != DEFAULT_FALLBACK:
            frag.append(f"fallback={self.fallback}")
        if self.validate:
            frag.append("validate=1")
        return self.url + ("#" + "&".join(frag) if frag else "")

    @property
    def feedback_url(self) -> str:
        parts = urllib.parse.urlsplit(self.url)
        return urllib.parse.urlunsplit((parts.scheme, parts.netloc, FEEDBACK_PATH, "", ""))


def check_schema(name: str, doc: Any) -> None:
    """ProtocolError ("garbage: ...") unless `doc` fits schemas/NAME.json (tests, debug)."""
    _Schemas.check(name, doc)


class _Schemas:
    """The protocol's JSON Schemas, loaded on first use (debug only: not the hot path)."""

    _validators: ClassVar[dict[str, Any]] = {}

    @classmethod
    def check(cls, name: str, doc: Any) -> None:
        v = cls._validators.get(name)
        if v is None:
            try:
                import jsonschema
            except ImportError as exc:
                raise RuntimeError("validate=1 needs the jsonschema package") from exc
            from referencing import Registry, Resource  # comes with jsonschema

            docs = {p.stem: json.loads(p.read_text()) for p in SCHEMAS.glob("*.json")}
            reg: Any = Registry().with_resources(
                (d["$id"], Resource.from_contents(d)) for d in docs.values()
            )
            v = cls._validators[name] = jsonschema.Draft202012Validator(docs[name], registry=reg)
        errors = sorted(v.iter_errors(doc), key=lambda e: list(e.path))
        if errors:
            e = errors[0]
            where = "/".join(str(p) for p in e.path) or "(top)"
            raise ProtocolError(f"garbage: {name} schema: {where}: {e.message}")


class HttpPolicy:
    """The client side of one policy URL (a subclass per URL carries the facts and `spec`)."""

    name: ClassVar[str] = "http"
    deployment_kind: ClassVar[DeploymentKind] = "prfaas-pd"
    needs_threshold: ClassVar[bool] = True
    replans: ClassVar[bool] = False
    long_term: ClassVar[bool] = False
    cache_aware: ClassVar[bool] = False
    spec: ClassVar[HttpSpec]
    fallback_name: ClassVar[str]

    def __init__(self) -> None:
        self.router = f"r-{secrets.token_hex(4)}"
        """This client's id: the service keeps one delta base per router."""
        self.encoder = DeltaEncoder()
        parts = urllib.parse.urlsplit(self.spec.url)
        self._host = parts.hostname or "127.0.0.1"
        self._https = parts.scheme == "https"
        self._port = parts.port or (443 if self._https else 80)
        self._path = urllib.parse.urlunsplit(("", "", parts.path or "/", parts.query, ""))
        self._conn: http.client.HTTPConnection | None = None
        self._session: Any = None  # aiohttp.ClientSession, made on the first live decision
        self._lock: asyncio.Lock | None = None
        """Live decisions go one at a time: each delta is on the base the last one left."""
        self._feedback: queue.Queue[dict[str, Any] | None] | None = None
        self._feeder: threading.Thread | None = None
        self.feedback_dropped = 0
        self.resyncs = 0

    # -------------------------------------------------------------------- one decision

    def _body(self, view: RequestView, snapshot: Snapshot, full: bool) -> bytes:
        doc = encode_decision(self.router, view, self.encoder.encode(snapshot, full=full))
        if self.spec.validate:
            _Schemas.check("decision-request", doc)
        return json.dumps(doc, separators=(",", ":")).encode()

    def _answer(self, status: int, body: bytes, snapshot: Snapshot) -> Route | None:
        """The route of a 200; None for a 409 (resend full); raises for the rest."""
        if status == 409:
            self.encoder.reset()
            self.resyncs += 1
            return None
        if status == 503:
            self.encoder.commit()
            raise NoRouteYet(f"scheduler: no route yet ({body[:120].decode(errors='replace')})")
        if status != 200:
            self.encoder.reset()
            raise ProtocolError(f"status: HTTP {status}")
        self.encoder.commit()
        try:
            doc = json.loads(body)
        except ValueError:
            raise ProtocolError(f"garbage: not JSON: {body[:60]!r}") from None
        if self.spec.validate:
            _Schemas.check("decision-response", doc)
        return decode_route(doc, snapshot.threshold_tokens)

    def decide(self, request: RequestView, snapshot: Snapshot) -> Route:
        """Blocking (the sim's form): one keep-alive connection, `timeout_s` per decision."""
        deadline = time.monotonic() + self.spec.timeout_s
        full = False
        for _ in range(2):  # a 409 resends the whole snapshot once
            body = self._body(request, snapshot, full)
            left = deadline - time.monotonic()
            if left <= 0:
                self.encoder.reset()
                raise TimeoutError(f"timeout: no answer within {self.spec.timeout_s * 1e3:g}ms")
            try:
                status, answer = self._post_blocking(body, left)
            except TimeoutError:
                self._drop_conn()
                self.encoder.reset()
                raise TimeoutError(
                    f"timeout: no answer within {self.spec.timeout_s * 1e3:g}ms"
                ) from None
            except (OSError, http.client.HTTPException) as exc:
                self._drop_conn()
                self.encoder.reset()
                raise ConnectionError(f"unreachable: {type(exc).__name__}: {exc}") from None
            route = self._answer(status, answer, snapshot)
            if route is not None:
                return route
            full = True
        raise ProtocolError("status: 409 twice (the service refused a full snapshot)")

    def _post_blocking(self, body: bytes, timeout: float) -> tuple[int, bytes]:
        if self._conn is None:
            cls = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
            self._conn = cls(self._host, self._port, timeout=timeout)
            self._conn.connect()
            with contextlib.suppress(OSError):
                self._conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._conn.sock.settimeout(timeout)
        self._conn.request(
            "POST",
            self._path,
            body,
            {"Content-Type": "application/json", "Connection": "keep-alive"},
        )
        resp = self._conn.getresponse()
        data = resp.read()
        if resp.will_close:
            self._drop_conn()
        return resp.status, data

    def _drop_conn(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    async def adecide(self, request: RequestView, snapshot: Snapshot) -> Route:
        """The live router's form: the same exchange on one aiohttp session (keep-alive)."""
        import aiohttp

        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=64, keepalive_timeout=60),
            )
        if self._lock is None:
            self._lock = asyncio.Lock()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.spec.timeout_s
        try:  # one exchange at a time (the delta's base); waiting counts against the timeout
            async with asyncio.timeout(self.spec.timeout_s):
                await self._lock.acquire()
        except TimeoutError:
            raise TimeoutError(
                f"timeout: no answer within {self.spec.timeout_s * 1e3:g}ms (queued behind "
                "other decisions)"
            ) from None
        try:
            return await self._exchange(request, snapshot, deadline)
        finally:
            self._lock.release()

    async def _exchange(self, request: RequestView, snapshot: Snapshot, deadline: float) -> Route:
        import aiohttp

        assert self._session is not None
        loop = asyncio.get_running_loop()
        full = False
        for _ in range(2):
            body = self._body(request, snapshot, full)
            left = deadline - loop.time()
            try:
                if left <= 0:
                    raise TimeoutError
                async with asyncio.timeout(left):
                    async with self._session.post(
                        self.spec.url.partition("#")[0],
                        data=body,
                        headers={"Content-Type": "application/json"},
                    ) as resp:
                        status, answer = resp.status, await resp.read()
            except TimeoutError:
                self.encoder.reset()
                raise TimeoutError(
                    f"timeout: no answer within {self.spec.timeout_s * 1e3:g}ms"
                ) from None
            except (OSError, aiohttp.ClientError) as exc:
                self.encoder.reset()
                raise ConnectionError(f"unreachable: {type(exc).__name__}: {exc}") from None
            route = self._answer(status, answer, snapshot)
            if route is not None:
                return route
            full = True
        raise ProtocolError("status: 409 twice (the service refused a full snapshot)")

    # -------------------------------------------------------------------- feedback

    def on_complete(self, request: RequestView, outcome: Outcome) -> None:
        """Queue the outcome for POST /feedback; never blocks (dropped when the queue is full)."""
        if self._feedback is None:
            self._feedback = queue.Queue(FEEDBACK_QUEUE)
            self._feeder = threading.Thread(
                target=self._feed, args=(self._feedback,), name="policy-feedback", daemon=True
            )
            self._feeder.start()
        try:
            self._feedback.put_nowait(encode_feedback(self.router, request, outcome))
        except queue.Full:
            self.feedback_dropped += 1

    def _feed(self, q: queue.Queue[dict[str, Any] | None]) -> None:
        parts = urllib.parse.urlsplit(self.spec.feedback_url)
        conn: http.client.HTTPConnection | None = None
        timeout = max(1.0, self.spec.timeout_s * 10)
        for _ in iter(int, 1):  # bounded by the queue: None (close) ends it
            doc = q.get()
            if doc is None:
                break
            try:
                if conn is None:
                    conn = http.client.HTTPConnection(self._host, self._port, timeout=timeout)
                conn.request("POST", parts.path, json.dumps(doc).encode(),
                             {"Content-Type": "application/json"})  # fmt: skip
                conn.getresponse().read()
            except (OSError, http.client.HTTPException):
                if conn is not None:
                    conn.close()
                conn = None
        if conn is not None:
            conn.close()

    # -------------------------------------------------------------------- closing

    def close(self) -> None:
        self._drop_conn()
        if self._feedback is not None and self._feeder is not None:
            with contextlib.suppress(queue.Full):
                self._feedback.put_nowait(None)
            self._feeder.join(timeout=1.0)

    async def aclose(self) -> None:
        self.close()
        if self._session is not None:
            await self._session.close()
            self._session = None


def _resolve(name: str) -> type[Policy] | None:
    """The registry's resolver: a class for a policy URL (None for any other name)."""
    if not is_http_spec(name):
        return None
    try:
        spec = HttpSpec.parse(name)
        fb = POLICIES[spec.fallback]
    except (ValueError, UnitError, UnknownName) as exc:  # one line, before anything starts
        text = str(exc) if str(exc).startswith("policy URL") else f"policy URL {name!r}: {exc}"
        raise PluginError(text) from None
    attrs = {
        "name": name,
        "deployment_kind": fb.deployment_kind,
        "needs_threshold": fb.needs_threshold,
        "replans": fb.replans,
        "long_term": fb.long_term,
        "cache_aware": fb.cache_aware,
        "spec": spec,
        "fallback_name": spec.fallback,
        "__module__": __name__,
    }
    return type("HttpPolicy", (HttpPolicy,), attrs)


POLICIES.add_resolver(_resolve)


# ------------------------------------------------------------------------ an owned service


class SchedulerProcess:
    """The outside scheduler's process when a scenario owns it (`policy.command`): started
    before the run, its output to files in the results directory, stopped after it. The
    scheduler nemesis actions kill, pause and resume it through here."""

    def __init__(self, command: Sequence[str], url: str, out_dir: Path, cwd: Path | None = None):
        self.command = list(command)
        self.url = url
        self.out_dir = out_dir
        self.cwd = cwd
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self, ready_timeout_s: float = 20.0) -> None:
        """Start it and wait (bounded) until its port accepts connections."""
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.starts += 1
        tag = "" if self.starts == 1 else f".{self.starts}"
        with (
            open(self.out_dir / f"scheduler{tag}.stdout", "wb") as out,
            open(self.out_dir / f"scheduler{tag}.stderr", "wb") as err,
        ):
            self.proc = subprocess.Popen(
                self.command, stdout=out, stderr=err, cwd=self.cwd, start_new_session=True
            )
        parts = urllib.parse.urlsplit(self.url)
        host, port = parts.hostname or "127.0.0.1", parts.port or 80
        deadline = time.monotonic() + ready_timeout_s
        for _ in range(int(ready_timeout_s / 0.05) + 1):
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"scheduler command {self.command!r} exited with {self.proc.returncode} "
                    f"before serving (see {self.out_dir}/scheduler{tag}.stderr)"
                )
            try:
                with socket.create_connection((host, port), timeout=0.2):
                    return
            except OSError:
                if time.monotonic() > deadline:
                    break
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"scheduler command {self.command!r}: {host}:{port} not serving "
                           f"within {ready_timeout_s:g}s")  # fmt: skip

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: int) -> None:
        if self.running:
            assert self.proc is not None
            os.kill(self.proc.pid, sig)

    def kill(self) -> None:
        self.signal(signal.SIGKILL)
        if self.proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=5)

    def pause(self) -> None:
        self.signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.signal(signal.SIGCONT)

    def stop(self, grace_s: float = 5.0) -> None:
        if self.proc is None:
            return
        self.resume()
        self.signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            self.kill()
