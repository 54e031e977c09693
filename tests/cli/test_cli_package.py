"""The `testbed` command as a package (testbed/cli/): `python -m testbed.cli` runs it, the
console script points at it, and every subcommand module answers --help."""

from __future__ import annotations

import argparse
import importlib.metadata
import subprocess
import sys
from pathlib import Path

import pytest

from testbed.cli import main
from testbed.substrate import SUBSTRATES

ROOT = Path(__file__).resolve().parents[2]
SUBCOMMANDS = ("plan", "run", "scenarios", "link", "verify-model", "policy-vectors")


def test_python_dash_m_runs_the_command() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "testbed.cli", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr
    for name in SUBCOMMANDS:
        assert name in out.stdout


def test_the_console_script_is_the_packages_main() -> None:
    (script,) = [
        ep
        for ep in importlib.metadata.entry_points(group="console_scripts")
        if ep.name == "testbed"
    ]
    assert script.value == "testbed.cli:main"
    assert script.load() is main


@pytest.mark.parametrize(
    "argv",
    [[name, "--help"] for name in SUBCOMMANDS]
    + [["link", "serve", "--help"], ["link", "tc", "up", "--help"]],
)
def test_every_subcommand_answers_help(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: testbed {argv[0]}")


def test_an_unknown_subcommand_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["no-such-command"])
    assert exit_.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


def test_run_offers_the_substrates_make_substrate_knows(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["run", "scenarios/burst.yaml", "--substrate", "nowhere"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "invalid choice" in err and all(name in err for name in SUBSTRATES)
    assert SUBSTRATES == ("local", "compose")


def test_the_command_table_names_every_subcommand_the_modules_add() -> None:
    """COMMANDS is what lets a command line import one module: a subcommand missing from it
    would still work from `--help`'s full parser but be an invalid choice when named."""
    from testbed.cli import COMMANDS, build_parser

    full = build_parser()
    (sub,) = [a for a in full._actions if isinstance(a, argparse._SubParsersAction)]
    assert list(sub.choices) == list(COMMANDS)
    for name, module in COMMANDS.items():
        alone = build_parser([name])
        (one,) = [a for a in alone._actions if isinstance(a, argparse._SubParsersAction)]
        assert name in one.choices, (name, module)


def test_a_sim_run_does_not_load_the_live_path(tmp_path: Path) -> None:
    """The sim path's start-up is part of every sim run's cost (issue #35): it must not import
    the link client's HTTP stack, the services or the live runner."""
    code = (
        "import sys\n"
        "from testbed.cli import main\n"
        f"rc = main(['run', 'burst', '--substrate', 'sim', '--duration', '5s', '--quiet', "
        f"'--out', {str(tmp_path / 'out')!r}])\n"
        "live = sorted(m for m in sys.modules if m.split('.')[0] == 'aiohttp' "
        "or m.startswith(('testbed.services.router', 'testbed.scenario.runner', "
        "'testbed.substrate.local', 'testbed.link.client')))\n"
        "print('LIVE', live); sys.exit(rc)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "LIVE []" in out.stdout, out.stdout[-500:]
