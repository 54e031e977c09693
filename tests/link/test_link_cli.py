"""`testbed link ...` from the command line: serve as a subprocess, and user errors."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from testbed.cli import main

pytestmark = pytest.mark.timeout(60)
ROOT = Path(__file__).resolve().parents[2]


def test_serve_subprocess_with_config(tmp_path: Path) -> None:
    cfg = tmp_path / "toxiproxy.json"
    cfg.write_text(json.dumps([{"name": "web", "listen": "127.0.0.1:0",
                                "upstream": "127.0.0.1:9"}]))  # fmt: skip
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "testbed.cli",
            "link",
            "serve",
            "--port",
            "0",
            "--config",
            str(cfg),
            "--seed",
            "3",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        m = re.search(r"(http://\S+)", line)
        assert m, line
        url = m.group(1)
        with urllib.request.urlopen(url + "/version", timeout=5) as r:
            assert json.loads(r.read())["version"].startswith("2.")
        with urllib.request.urlopen(url + "/proxies", timeout=5) as r:
            assert set(json.loads(r.read())) == {"web"}
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)


def test_bad_config_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert main(["link", "serve", "--port", "0", "--config", str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not valid JSON" in err[0]
    assert main(["link", "serve", "--port", "0", "--config", str(tmp_path / "none")]) == 2


def test_tc_needs_root_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert main(["link", "tc", "up", "--name", "x", "--rate", "10Mbps"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "needs root" in err[0]


def test_tc_bad_rate_is_user_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["link", "tc", "rate", "--name", "x", "--rate", "fast"]) == 2
    assert "--rate" in capsys.readouterr().err


def test_link_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["link"]) == 0
    assert "serve" in capsys.readouterr().out
