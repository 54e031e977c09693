"""A bounded fuzz of the library's scenarios (issue #33): mutate values, YAML tags, keys and text
of every library scenario, then run what `testbed plan` and `testbed run` run on it
(`load_scenario`, the plan and its limits, `prepare_run` on the sim). Anything but a one-line
UserError (what the CLI turns into exit 2) is a failure; a ConfigError from reading the file
names the file. Seeded (a failure names its seed and mutation, and reproduces), fixed in count,
so it runs in `make test`: no marker.

The regression examples (the sites the issue's fuzz found, each a traceback before) are also
plain unit tests in tests/config/test_limits.py.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import yaml

from testbed.cli.plan import check_plans, plan_scenario
from testbed.config.limits import FieldError
from testbed.errors import ConfigError, UserError
from testbed.scenario.library import LIBRARY_DIR, library_scenarios
from testbed.scenario.plan import RunOptions, prepare_run
from testbed.scenario.schema import load_scenario

ROOT = Path(__file__).resolve().parents[2]
SOURCES = [*library_scenarios(), ROOT / "tests" / "data" / "tiny.yaml"]
EXAMPLES = 2000
CHUNKS = 8
MAX_REQUESTS = 20_000
"""The fuzz's --max-requests: a mutation that scales a rate up is refused at 20K requests, not
generated up to the default 1M (the cap's path is the same)."""

HOSTILE: list[Any] = [
    0, -1, 1, 2**63, 2**64, 9223372036854775808, 10**30, -(10**30), 1e308, -1e308, 1e-308,
    1e-320, 5e-324, float("inf"), float("nan"), 0.5, 1e6, 1e12, "", "abc", "0", "1ns", "1e400s",
    "-3s", "0s", "1e-9s", "100Gbps", "1e-300Gbps", "64K", "1e12", "1M", "10M", "auto", None,
    True, [], {}, [1, 2], {"a": 1}, "\u00e9\u4e2d", "x" * 300,
]  # fmt: skip
TAGS = ["!!int", "!!float", "!!str", "!!bool", "!!null", "!!binary", "!!timestamp", "!!set",
        "!!seq", "!!map", "!!python/object:os.system", "!custom", "!!omap", "!!pairs"]  # fmt: skip
TEXT_BITS = ["? [a, b]\n: 1\n", "? {a: 1}\n: 1\n", "&a x", "*a", "*nope", "- ", ": ", "{", "]",
             "\t", "'", '"', "%YAML 1.1\n", "---\n", "...\n", "\x00", "\ufeff", "#"]  # fmt: skip


def _paths(doc: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path to a value (mapping keys, list indices) in a parsed document."""
    out = [prefix] if prefix else []
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += _paths(v, (*prefix, i))
    return out


def _set(doc: Any, path: tuple[Any, ...], value: Any, *, rename: Any = None) -> None:
    holder = doc
    for part in path[:-1]:
        holder = holder[part]
    last = path[-1]
    if rename is not None and isinstance(holder, dict):
        holder[rename] = holder.pop(last)
    elif value is _DELETE:
        del holder[last]
    else:
        holder[last] = value


_DELETE = object()


def _scaled(v: Any, rng: random.Random) -> Any:
    if isinstance(v, bool) or not isinstance(v, int | float):
        return rng.choice(HOSTILE)
    return v * 10.0 ** rng.choice([-320, -30, -9, -3, 3, 6, 9, 30, 300])


def mutate(text: str, rng: random.Random) -> tuple[str, str]:
    """A mutated scenario text and what was done to it (for the failure message)."""
    kind = rng.choice(["value", "value", "value", "scale", "key", "delete", "tag", "text"])
    doc: Any = None
    if kind in ("value", "scale", "key", "delete"):
        try:  # a text mutated before may not parse: mutate its text instead
            doc = yaml.safe_load(text)
        except Exception:  # PyYAML raises more than YAMLError (the bug fixed in config/files.py)
            kind = "text"
        if not _paths(doc):
            kind = "text"
    if kind in ("value", "scale", "key", "delete"):
        path = rng.choice(_paths(doc))
        holder = doc
        for part in path[:-1]:
            holder = holder[part]
        if kind == "value":
            value = rng.choice(HOSTILE)
            _set(doc, path, value)
            what = f"{'.'.join(map(str, path))} = {value!r}"[:120]
        elif kind == "scale":
            value = _scaled(holder[path[-1]], rng)
            _set(doc, path, value)
            what = f"{'.'.join(map(str, path))} = {value!r}"[:120]
        elif kind == "key" and isinstance(holder, dict):
            new = rng.choice([f"{path[-1]}x", "bogus", 1, None, True, "name", "seed"])
            if new in holder:
                return text, "no-op"
            _set(doc, path, None, rename=new)
            what = f"rename {'.'.join(map(str, path))} -> {new!r}"
        else:
            _set(doc, path, _DELETE)
            what = f"delete {'.'.join(map(str, path))}"
        return yaml.safe_dump(doc, allow_unicode=True), what
    lines = text.splitlines(keepends=True)
    i = rng.randrange(len(lines))
    line = lines[i]
    if kind == "tag" and ": " in line:
        tag = rng.choice(TAGS)
        key, _, value = line.partition(": ")
        lines[i] = f"{key}: {tag} {value}"
        return "".join(lines), f"line {i + 1}: {tag}"
    bit = rng.choice(TEXT_BITS)
    at = rng.randrange(len(line) + 1)
    lines[i] = line[:at] + bit + line[at:]
    return "".join(lines), f"line {i + 1} col {at}: insert {bit!r}"


def check_one(path: Path) -> str:
    """Run what the CLI runs on one file; the refusal's kind, or raise AssertionError."""
    try:
        scenario = load_scenario(path)
    except ConfigError as exc:
        msg = str(exc)
        # the file that is wrong: the scenario, or a profile file it names (by its own name)
        assert "\n" not in msg and msg.startswith(f"{path.parent}"), msg
        return "load"
    try:
        check_plans(scenario, plan_scenario(scenario), MAX_REQUESTS)
    except FieldError as exc:
        assert "\n" not in str(exc), str(exc)
        return "plan"
    if any(d.engine == "torch" for d in scenario.deployments.values()):
        return "ok"  # prepare_run would calibrate the tiny model: tests/engine does that
    opts = RunOptions(
        substrate="sim",
        progress=False,
        out_dir=path.parent / "out",
        max_requests=MAX_REQUESTS,
        source=str(path),
    )
    try:
        prepare_run(scenario, opts)
    except UserError as exc:
        assert "\n" not in str(exc), str(exc)
        return "prepare"
    return "ok"


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """A directory where the library's relative paths (profiles, traces) resolve."""
    for sub in ("profiles", "traces"):
        (tmp_path / sub).symlink_to(LIBRARY_DIR / sub)
    return tmp_path


@pytest.mark.parametrize("chunk", range(CHUNKS))
def test_mutated_library_scenarios_end_in_one_line_or_plan(workdir: Path, chunk: int) -> None:
    texts = {p.stem: p.read_text() for p in SOURCES}
    names = sorted(texts)
    seen: dict[str, int] = {}
    for k in range(chunk * EXAMPLES // CHUNKS, (chunk + 1) * EXAMPLES // CHUNKS):
        rng = random.Random(k)
        name = rng.choice(names)
        text, what = mutate(texts[name], rng)
        if rng.random() < 0.3:  # a second mutation on top
            text, more = mutate(text, rng)
            what += f"; {more}"
        path = workdir / f"{name}.yaml"
        path.write_text(text, errors="surrogatepass")
        try:
            outcome = check_one(path)
        except AssertionError:
            raise
        except Exception as exc:  # what the fuzz looks for
            pytest.fail(f"example {k} ({name}: {what}): {type(exc).__name__}: {exc}"[:600])
        seen[outcome] = seen.get(outcome, 0) + 1
    # the mutator reaches every stage (so it tests more than the YAML reader)
    assert seen.get("load", 0) > 0 and seen.get("ok", 0) > 0, seen
