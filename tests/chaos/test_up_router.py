"""`testbed up --router` live (issue #32): the tiny deployment stands up behind each pinned
external router, outside clients (the OpenAI SDK: a completion with `testbed_request_id`, a
streamed chat without) talk to the router at the banner's URL, and a SIGTERM stops it: exit 0
(the checkers' verdict), one record per request joined from the workers' attempts, KV accounted
and verified, and no router process left. Marker `routers` (`make test` installs the extra)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import openai
import pytest

pytestmark = [pytest.mark.chaos, pytest.mark.routers, pytest.mark.timeout(120)]

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "tests" / "data" / "tiny.yaml"


def _listener(port: int) -> int | None:
    """The process listening on 127.0.0.1:`port` (sglang-router renames its command line, so
    it is found by its socket: /proc/net/tcp's inode, then the process holding it)."""
    inodes = set()
    for row in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        f = row.split()
        if f[1] == f"0100007F:{port:04X}" and f[3] == "0A":  # LISTEN
            inodes.add(f"socket:[{f[9]}]")
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if any(os.readlink(fd) in inodes for fd in (proc / "fd").iterdir()):
                return int(proc.name)
        except OSError:
            continue
    return None


@pytest.mark.parametrize("preset", ["sglang-router", "vllm-router"])
def test_up_router_serves_outside_clients_and_stops_clean(tmp_path: Path, preset: str) -> None:
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "testbed.cli", "up", str(TINY), "--router", preset, "--no-faults",
           "--out", str(out)]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1"})  # fmt: skip
    assert proc.stdout is not None
    banner = []
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline:  # bounded: the banner or the end of the process
            line = proc.stdout.readline()
            if not line:
                break
            banner.append(line)
            if line.startswith("serving at"):
                break
        text = "".join(banner)
        m = re.search(r"OpenAI base URL:\s+(http://127\.0\.0\.1:(\d+)/v1)", text)
        assert m and f"external router: {preset}:cache_aware" in text, text
        base, port = m.group(1), int(m.group(2))
        client = openai.OpenAI(base_url=base, api_key="none", timeout=30, max_retries=0)
        done = client.completions.create(
            model="internal-1t-hybrid", prompt="the link is slow", max_tokens=8,
            extra_body={"testbed_request_id": "c-1"},
        )  # fmt: skip
        assert done.usage is not None and done.usage.completion_tokens == 8
        chunks = client.chat.completions.create(
            model="internal-1t-hybrid", messages=[{"role": "user", "content": "hi there"}],
            max_tokens=5, stream=True,
        )  # fmt: skip
        text_out = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert len(text_out.split()) == 5
        router = _listener(port)
        assert router is not None
    finally:
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=90)
    assert proc.returncode == 0, (stdout, stderr)
    assert "check nothing_lost: ok" in stdout and "note: stopped by SIGTERM" in stdout
    assert not Path(f"/proc/{router}").exists()  # the router's process is gone
    records = [json.loads(x) for x in (out / "requests.jsonl").read_text().splitlines()]
    assert len(records) == 2, records
    labelled, chat = records  # arrival order
    assert labelled["id"] == "c-1" and chat["id"].startswith(("room-", "router-"))
    for r in records:
        assert r["status"] == "completed" and r["kv_verified"], r
        assert r["kv_wire_bytes_expected"] == r["kv_wire_bytes_received"] > 0
        assert max(r["arrival"], r["prefill_start"]) < r["first_token"] <= r["last_token"]
        assert r["prefill_instance"] and r["decode_instance"] and r["route"]
    assert (labelled["tokens_out"], chat["tokens_out"]) == (8, 5)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["requests"]["submitted"] == 2 and summary["scale"]["time"] == 1.0
