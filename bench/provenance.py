"""The provenance header a bench report starts with: command, commit, date, machine (cores, the
processor's model, load average before and after), substrate and seeds (issue #37: no figure
without where it came from). One function for every script that writes one, so the headers
read alike."""

from __future__ import annotations

import contextlib
import io
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TextIO, TypeVar

ROOT = Path(__file__).resolve().parent.parent
T = TypeVar("T")


def with_header(text: str, head: str) -> str:
    """`text` (a report whose first line is its title) with the provenance header `head` under
    the title, a blank line either side."""
    title, _, rest = text.partition("\n")
    return f"{title}\n\n{head}\n{rest.lstrip(chr(10))}"


def report_body(text: str) -> str:
    """A report without its provenance lines (the header's `- command:` ... `- substrate:`
    items): what regenerating it with the same seeds must reproduce byte for byte when its
    runs are on the sim and it has no wall-clock column."""
    keys = ("- command:", "- commit:", "- date:", "- machine:", "- substrate:")
    out: list[str] = []
    after_header = False
    for line in text.splitlines(keepends=True):
        if line.startswith(keys):
            after_header = True
            continue
        if not (after_header and not line.strip()):  # the blank line closing the header
            out.append(line)
        after_header = False
    return "".join(out)


def commit(cwd: Path = ROOT) -> str:
    """The short hash of the checkout's HEAD."""
    return subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=cwd
    ).stdout.strip()


def changed(cwd: Path | None = None) -> bool:
    """Whether the checkout has uncommitted changes outside bench/reports/: the reports are what
    the scripts write (a script writing several sections changes its own report after the
    first), not what produced the figures."""
    return bool(
        subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", "--", ".",
             ":(exclude)bench/reports"],
            capture_output=True, text=True, cwd=cwd if cwd is not None else ROOT,
        ).stdout.strip()
    )  # fmt: skip


def load_text(load: tuple[float, ...]) -> str:
    """A load average (os.getloadavg()) as the header writes it: `1.02/0.87/0.66`."""
    return "/".join(f"{x:.2f}" for x in load)


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The processor's model name as the kernel reports it, with its family and model numbers
    (CPU seconds differ between hosts of the same core count, by two and more between two
    named only "Intel(R) Xeon(R) Processor": a report says which one it ran on), or the
    platform's guess."""
    try:
        fields: dict[str, str] = {}
        for line in cpuinfo.read_text().splitlines():
            key, _, value = line.partition(":")
            if not key.strip():
                break  # the first processor's block is enough
            fields.setdefault(key.strip(), value.strip())
    except OSError:
        fields = {}
    name = fields.get("model name")
    if name is None:
        return platform.processor() or platform.machine() or "unknown processor"
    if "cpu family" in fields and "model" in fields:
        return f"{name}, family {fields['cpu family']} model {fields['model']}"
    return name


def provenance(script: str, argv: list[str], load_before: tuple[float, ...], setup: str) -> str:
    """The header's lines (markdown list items); `setup`: the substrate, deployment, scale and
    seeds the figures came from, as one sentence. The tree counts as changed as `changed`
    says."""
    dirty = changed()
    after = os.getloadavg()
    return (
        f"- command: `python {shlex.join([script, *argv])}`\n"  # as a shell takes it
        f"- commit: {commit()}{' (with uncommitted changes in the tree)' if dirty else ''}\n"
        f"- date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}\n"
        f"- machine: {os.cpu_count()} cores ({cpu_model()}); load average before "
        f"{load_text(load_before)}, after {load_text(after)} (1/5/15 min)\n"
        f"- substrate: {setup}\n"
    )


def checkout_label(src: str) -> str:
    """A checkout as a column heads it: "this checkout", or its path and short commit."""
    return "this checkout" if Path(src) == ROOT else f"{src} ({commit(Path(src))})"


def checkout_table(
    results: dict[str, list[dict[str, float]]], figures: dict[str, tuple[str, str]]
) -> list[str]:
    """Interleaved rounds on several checkouts as a markdown table, a row a figure
    (`figures`: key -> (label, format), those the rounds carry), a column a checkout (the
    median of its rounds); with two checkouts, then how the first two figures of this one
    compare to the other's."""
    names = list(results)
    lines = [
        "| figure (median) | " + " | ".join(checkout_label(n) for n in names) + " |",
        "|---|" + "---|" * len(names),
    ]
    medians = {
        key: [statistics.median(r[key] for r in results[n]) for n in names]
        for key in figures
        if key in results[names[0]][0]
    }
    for key, cells in medians.items():
        label, fmt = figures[key]
        lines.append(f"| {label} | " + " | ".join(fmt.format(c) for c in cells) + " |")
    if len(names) == 2:
        for key in list(figures)[:2]:
            (a, b), label = medians[key], figures[key][0]
            lines.append(
                f"\n{label}: this checkout {(a - b) / b:+.0%} against {checkout_label(names[1])}"
            )
    return lines


def write_section(report: Path, name: str, heading: str, text: str) -> None:
    """Put `text` in `report` between `<!-- name:start -->` and `<!-- name:end -->`: in place of
    the section a previous run wrote, or appended under `heading` the first time; the rest of
    the report is kept as it is."""
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    old = report.read_text() if report.exists() else ""
    section = f"{start}\n{text}{end}"
    if start in old and end in old:
        pre, rest = old.split(start, 1)
        new = pre + section + rest.split(end, 1)[1]
    else:
        new = old.rstrip("\n") + f"\n\n## {heading}\n\n" + section + "\n"
    report.write_text(new)


class _Tee(io.StringIO):
    """A buffer that also passes every write on to `echo`, so a script's table reaches the
    terminal as it is printed and its report afterwards, from one set of print calls."""

    def __init__(self, echo: TextIO) -> None:
        self.echo = echo
        super().__init__()

    def write(self, s: str) -> int:
        n = super().write(s)
        self.echo.write(s)
        return n

    def flush(self) -> None:
        self.echo.flush()


@contextlib.contextmanager
def printed() -> Iterator[io.StringIO]:
    """What the block prints to stdout, still printed, and kept in the yielded buffer: for the
    scripts whose report is their printed tables (`output_section`)."""
    tee = _Tee(sys.stdout)
    with contextlib.redirect_stdout(tee):
        yield tee


def output_section(report: Path, name: str, heading: str, head: str, text: str) -> None:
    """A script's printed output as section `name` of `report` (`write_section`): the
    provenance header `head`, then `text` verbatim in a fenced block."""
    body = text.strip("\n")
    write_section(report, name, heading, f"{head}\n```\n{body}\n```\n")


def reported(
    report: Path | None, name: str, heading: str, setup: str, measure: Callable[[], T]
) -> T:
    """`measure()`, which prints a script's tables; with `report`, what it printed becomes
    section `name` of `report` (`output_section`) under the provenance header of the script
    being run, the machine's load average taken before and after. One call for the scripts
    whose report is their printed output, so they read alike."""
    load_before = os.getloadavg()
    with printed() as out:
        result = measure()
    if report is not None:
        script = f"bench/{Path(sys.argv[0]).name}"
        head = provenance(script, sys.argv[1:], load_before, setup)
        output_section(report, name, heading, head, out.getvalue())
    return result


def markdown_section(
    report: Path, name: str, heading: str, load_before: tuple[float, ...], setup: str, text: str
) -> None:
    """`text`, markdown tables a script rendered, as section `name` of `report`
    (`write_section`) under the provenance header of the script being run: `reported` for the
    scripts whose report is tables rather than their printed output."""
    head = provenance(f"bench/{Path(sys.argv[0]).name}", sys.argv[1:], load_before, setup)
    write_section(report, name, heading, f"{head}\n{text.strip()}\n")


TESTBED = [sys.executable, "-c", "from testbed.cli import main; raise SystemExit(main())"]
"""`testbed` as the console script runs it, from this interpreter's environment."""


def measured_child(
    cmd: Sequence[str], env: dict[str, str] | None = None
) -> tuple[int, float, float, str]:
    """Run `cmd` in the checkout to its end (`env` added to this process's): its exit status,
    wall seconds, CPU seconds of it and its descendants (user + system), and its output
    (stdout, then stderr)."""
    before = os.times()
    t0 = time.perf_counter()
    done = subprocess.run(
        list(cmd), cwd=ROOT, env={**os.environ, **(env or {})}, capture_output=True, text=True
    )
    wall = time.perf_counter() - t0
    after = os.times()
    cpu = (after.children_user - before.children_user) + (
        after.children_system - before.children_system
    )
    return done.returncode, wall, cpu, done.stdout + done.stderr


def timed_child(cmd: list[str]) -> float:
    """Wall seconds of `cmd` run to its end in the checkout; a failed command exits this
    script with its status and output, before any report is written."""
    code, wall, _, out = measured_child(cmd)
    if code != 0:
        print(out, file=sys.stderr)
        raise SystemExit(code)
    return wall
