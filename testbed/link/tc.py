"""Kernel shaping: two network namespaces joined by a veth pair, shaped with htb or tbf.

The emulator shapes in user space; this module lets the kernel do the bandwidth part instead
(or as a cross-check): `create_pair("x", rate=...)` makes namespaces `tbl-x-a` and `tbl-x-b`,
a veth pair between them (10.213.0.1 in a, 10.213.0.2 in b) and an htb class or tbf qdisc on
each end's egress. The rate changes at run time with `set_rate`. Latency is meant to come from
the emulator's `latency` toxic (run the emulator in one namespace, or in the root namespace with
sockets from `socket_in`); where the kernel has netem, `set_delay` uses it instead, and says so.

Everything here needs root and iproute2. Without them the functions raise UserError with one
line saying what is missing. Namespaces are always prefixed `tbl-` so they never collide with
anyone else's; `teardown` (and the `pair` context manager, which tests use) deletes them.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from testbed.errors import UserError
from testbed.transfer.netns import socket_in_namespace

__all__ = [
    "PREFIX",
    "NetnsPair",
    "check_available",
    "create_pair",
    "existing_pair",
    "list_pairs",
    "pair",
    "qdisc_counters",
    "socket_in_namespace",
    "stale_namespaces",
    "teardown",
]

PREFIX = "tbl-"
ADDR_A = "10.213.0.1"
ADDR_B = "10.213.0.2"
DEV_A = "veth-a"
DEV_B = "veth-b"
CMD_TIMEOUT = 10.0  # seconds for any one ip/tc command
HTB_QUANTUM = 60000
# A full-size TCP segment on a 1500-byte-MTU Ethernet link carries 1448 payload bytes in 1514
# bytes on the wire (14 Ethernet + 20 IP + 32 TCP with timestamps). Qdiscs count wire bytes; the
# emulator and the testbed count payload, so by default the qdisc rate is scaled up by this.
WIRE_PER_PAYLOAD = 1514 / 1448


def _run(argv: list[str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=CMD_TIMEOUT)
    except FileNotFoundError:
        raise UserError(f"{argv[0]} not found: install iproute2") from None
    except subprocess.TimeoutExpired:
        raise UserError(f"{' '.join(argv)} did not finish in {CMD_TIMEOUT:g}s") from None
    if check and proc.returncode != 0:
        msg = (proc.stderr or proc.stdout).strip().splitlines()
        raise UserError(f"{' '.join(argv)}: {msg[-1] if msg else f'exit {proc.returncode}'}")
    return proc


def check_available() -> None:
    """Raise UserError unless we are root and `ip` and `tc` exist."""
    if os.geteuid() != 0:
        raise UserError("tc shaping needs root (network namespaces and qdiscs); run as root")
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            raise UserError(f"tc shaping needs `{tool}` (iproute2), which is not installed")


def _ns_names(name: str) -> tuple[str, str]:
    if not name or "/" in name or name.startswith(PREFIX):
        raise UserError(f"bad pair name {name!r}: use letters, digits and '-' (no '{PREFIX}')")
    return f"{PREFIX}{name}-a", f"{PREFIX}{name}-b"


def _existing_namespaces() -> list[str]:
    proc = _run(["ip", "netns", "list"], check=False)
    return [line.split()[0] for line in proc.stdout.splitlines() if line.strip()]


def list_pairs() -> list[str]:
    """Names of the pairs whose namespaces exist."""
    names = set()
    for ns in _existing_namespaces():
        if ns.startswith(PREFIX) and ns[-2:] in ("-a", "-b"):
            names.add(ns[len(PREFIX) : -2])
    return sorted(names)


def _bits(rate: float) -> str:
    return f"{round(rate * 8)}bit"


@dataclass
class NetnsPair:
    """Two namespaces `ns_a`, `ns_b` joined by veth (`addr_a` <-> `addr_b`)."""

    name: str
    ns_a: str
    ns_b: str
    addr_a: str = ADDR_A
    addr_b: str = ADDR_B

    def describe(self) -> str:
        return (
            f"{self.name}: {self.ns_a} ({DEV_A} {self.addr_a}) <-> "
            f"{self.ns_b} ({DEV_B} {self.addr_b})"
        )

    def _ends(self, both: bool) -> list[tuple[str, str]]:
        ends = [(self.ns_a, DEV_A)]
        if both:
            ends.append((self.ns_b, DEV_B))
        return ends

    def set_rate(
        self, rate: float, *, qdisc: str = "htb", both: bool = True, goodput: bool = True
    ) -> None:
        """Shape egress at `rate` bytes/s (a->b, and b->a unless both=False); live change.

        With `goodput` (default) `rate` is TCP payload, as in the emulator, and the qdisc gets
        the matching wire rate; with goodput=False the qdisc gets `rate` as is.
        """
        if rate <= 0:
            raise UserError(f"rate must be positive, got {rate}")
        if goodput:
            rate *= WIRE_PER_PAYLOAD
        for ns, dev in self._ends(both):
            current = _run(["tc", "-n", ns, "qdisc", "show", "dev", dev]).stdout
            if qdisc == "htb":
                burst = max(16 * 1024, int(rate * 0.002))
                if " htb 1:" not in current:
                    _run(["tc", "-n", ns, "qdisc", "replace", "dev", dev, "root", "handle", "1:",
                          "htb", "default", "10"])  # fmt: skip
                _run(["tc", "-n", ns, "class", "replace", "dev", dev, "parent", "1:",
                      "classid", "1:10", "htb", "rate", _bits(rate), "ceil", _bits(rate),
                      "burst", str(burst), "cburst", str(burst),
                      "quantum", str(HTB_QUANTUM)])  # fmt: skip
            elif qdisc == "tbf":
                burst = max(16 * 1024, int(rate * 0.004))
                verb = "change" if " tbf " in current else "replace"
                _run(["tc", "-n", ns, "qdisc", verb, "dev", dev, "root", "tbf",
                      "rate", _bits(rate), "burst", str(burst), "latency", "100ms"])  # fmt: skip
            else:
                raise UserError(f"unknown qdisc {qdisc!r}: use htb or tbf")

    def cut(self, side: str = "a") -> None:
        """Drop everything leaving `side` toward the other (a partition): a pfifo of length 0
        as the htb class's leaf, so the class, its rate and its counters stay, and the drops
        are counted. Needs the htb shaping of `set_rate` on that end."""
        ns, dev = self._end(side)
        _run(["tc", "-n", ns, "qdisc", "replace", "dev", dev, "parent", "1:10",
              "handle", "10:", "pfifo", "limit", "0"])  # fmt: skip

    def mend(self, side: str = "a") -> None:
        """Undo `cut` (the class gets its default leaf back); idempotent."""
        ns, dev = self._end(side)
        _run(["tc", "-n", ns, "qdisc", "del", "dev", dev, "parent", "1:10"], check=False)

    def counters(self, side: str = "a") -> dict[str, int]:
        """The root qdisc's counters on `side`'s veth: bytes, packets, drops (a `cut` leaf's
        included), overlimits, backlog."""
        ns, dev = self._end(side)
        return qdisc_counters(ns, dev)

    def _end(self, side: str) -> tuple[str, str]:
        if side == "a":
            return self.ns_a, DEV_A
        if side == "b":
            return self.ns_b, DEV_B
        raise ValueError(f"side must be 'a' or 'b', got {side!r}")

    def clear(self) -> None:
        """Remove shaping (and netem delay) from both ends."""
        for ns, dev in self._ends(True):
            _run(["tc", "-n", ns, "qdisc", "del", "dev", dev, "root"], check=False)

    def has_netem(self) -> bool:
        """Whether this kernel has the netem qdisc (probed on the namespace's loopback)."""
        proc = _run(
            ["tc", "-n", self.ns_a, "qdisc", "add", "dev", "lo", "root", "netem", "delay", "0ms"],
            check=False,
        )
        if proc.returncode == 0:
            _run(["tc", "-n", self.ns_a, "qdisc", "del", "dev", "lo", "root"], check=False)
            return True
        return False

    def set_delay(self, delay: float, jitter: float = 0.0, *, both: bool = True) -> None:
        """Kernel delay with netem (replaces any rate shaping on the ends it touches)."""
        if not self.has_netem():
            raise UserError(
                "this kernel has no netem qdisc: add latency with the emulator's latency toxic"
            )
        for ns, dev in self._ends(both):
            argv = ["tc", "-n", ns, "qdisc", "replace", "dev", dev, "root", "netem", "delay",
                    f"{delay * 1e3:.3f}ms"]  # fmt: skip
            if jitter > 0:
                argv.append(f"{jitter * 1e3:.3f}ms")
            _run(argv)

    def show(self) -> str:
        out = [self.describe()]
        for ns, dev in self._ends(True):
            out.append(f"[{ns} {dev}]")
            out.append(_run(["tc", "-n", ns, "-s", "qdisc", "show", "dev", dev]).stdout.rstrip())
            cls = _run(["tc", "-n", ns, "class", "show", "dev", dev], check=False).stdout
            if cls.strip():
                out.append(cls.rstrip())
        return "\n".join(out)

    def socket_in(self, side: str, kind: int = socket.SOCK_STREAM) -> socket.socket:
        """An AF_INET socket that lives in namespace `side` ("a" or "b").

        A socket belongs to the namespace it was created in, whatever thread uses it later, so
        one process can hold sockets in both namespaces (this is how tests and the bench drive
        traffic over the veth without extra processes).
        """
        ns = {"a": self.ns_a, "b": self.ns_b}[side]
        return socket_in_namespace(ns, kind)

    def exec_argv(self, side: str, argv: list[str]) -> list[str]:
        """argv that runs a command inside namespace `side` (e.g. the emulator)."""
        ns = {"a": self.ns_a, "b": self.ns_b}[side]
        return ["ip", "netns", "exec", ns, *argv]

    def delete(self) -> None:
        for ns in (self.ns_a, self.ns_b):
            _run(["ip", "netns", "del", ns], check=False)


def qdisc_counters(ns: str, dev: str) -> dict[str, int]:
    """Counters of `dev`'s root qdisc in namespace `ns` (`tc -s -j qdisc show`): bytes, packets,
    drops, overlimits, backlog. htb counts its classes' leaf drops at the root too (a `cut`'s
    pfifo), so the root's own counters are the link's, and stay monotonic when a leaf goes."""
    out = _run(["tc", "-n", ns, "-s", "-j", "qdisc", "show", "dev", dev]).stdout
    try:
        qdiscs: list[dict[str, Any]] = json.loads(out or "[]")
    except json.JSONDecodeError:
        raise UserError(f"tc -j qdisc show dev {dev}: unreadable output") from None
    root = next((q for q in qdiscs if q.get("root")), qdiscs[0] if qdiscs else {})
    return {
        "bytes": int(root.get("bytes", 0)),
        "packets": int(root.get("packets", 0)),
        "drops": int(root.get("drops", 0)),
        "overlimits": int(root.get("overlimits", 0)),
        "backlog": int(root.get("backlog", 0)),
    }


_OWNED = re.compile(rf"^{PREFIX}[rp](\d+)(?:-\d+)?-[ab]$")
"""Namespaces a run (`r<pid>`) or a preflight probe (`p<pid>`) made: the pid is the owner."""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stale_namespaces() -> list[str]:
    """Namespaces made by a run or a probe whose process is gone (killed, crashed)."""
    out = []
    for ns in _existing_namespaces():
        m = _OWNED.match(ns)
        if m and not _alive(int(m.group(1))):
            out.append(ns)
    return sorted(out)


def create_pair(
    name: str | None = None,
    *,
    rate: float | None = None,
    qdisc: str = "htb",
    both: bool = True,
    goodput: bool = True,
) -> NetnsPair:
    """Create namespaces tbl-<name>-a/-b joined by veth; shape at `rate` bytes/s if given.

    On any failure the namespaces created so far are deleted again.
    """
    check_available()
    name = name or str(os.getpid())
    ns_a, ns_b = _ns_names(name)
    existing = set(_existing_namespaces())
    if ns_a in existing or ns_b in existing:
        raise UserError(f"namespaces of pair {name!r} exist already; `testbed link tc down`")
    p = NetnsPair(name, ns_a, ns_b)
    try:
        _run(["ip", "netns", "add", ns_a])
        _run(["ip", "netns", "add", ns_b])
        _run(["ip", "link", "add", DEV_A, "netns", ns_a, "type", "veth",
              "peer", "name", DEV_B, "netns", ns_b])  # fmt: skip
        for ns, dev, addr in ((ns_a, DEV_A, ADDR_A), (ns_b, DEV_B, ADDR_B)):
            _run(["ip", "-n", ns, "addr", "add", f"{addr}/30", "dev", dev])
            _run(["ip", "-n", ns, "link", "set", dev, "up"])
            _run(["ip", "-n", ns, "link", "set", "lo", "up"])
        if rate is not None:
            p.set_rate(rate, qdisc=qdisc, both=both, goodput=goodput)
    except BaseException:
        p.delete()
        raise
    return p


def existing_pair(name: str) -> NetnsPair:
    check_available()
    ns_a, ns_b = _ns_names(name)
    existing = set(_existing_namespaces())
    if ns_a not in existing or ns_b not in existing:
        raise UserError(f"no pair {name!r} (namespaces {ns_a}, {ns_b}); create it with `tc up`")
    return NetnsPair(name, ns_a, ns_b)


def teardown(name: str | None = None, *, all_mine: bool = False, stale: bool = False) -> list[str]:
    """Delete the namespaces of pair `name`, of every tbl-* pair (`all_mine`), or of runs whose
    process is gone (`stale`); returns what was removed."""
    check_available()
    targets: list[str] = []
    existing = _existing_namespaces()
    if all_mine:
        targets = [ns for ns in existing if ns.startswith(PREFIX)]
    elif stale:
        targets = stale_namespaces()
    elif name:
        targets = [ns for ns in _ns_names(name) if ns in existing]
    for ns in targets:
        _run(["ip", "netns", "del", ns], check=False)
    return targets


@contextlib.contextmanager
def pair(
    name: str | None = None, *, rate: float | None = None, qdisc: str = "htb", both: bool = True
) -> Iterator[NetnsPair]:
    """A pair that is deleted on exit, whatever happens inside."""
    p = create_pair(name, rate=rate, qdisc=qdisc, both=both)
    try:
        yield p
    finally:
        p.delete()
