"""The README's list of the scenario library ("Scenarios and chaos") is what `testbed scenarios`
prints: every scenario of testbed/library/ named once, with its description, and none that does
not exist (it showed 13 of 15 once, issue #30)."""

from __future__ import annotations

import re
from pathlib import Path

from testbed.scenario.library import library_scenarios
from testbed.scenario.schema import load_scenario

README = Path(__file__).resolve().parents[1] / "README.md"
INTRO = "`make scenarios` lists the library:"


def readme_list(text: str) -> list[tuple[str, str]]:
    """The README's list, (name, description) per line of the code block after INTRO."""
    m = re.search(re.escape(INTRO) + r"\s*```\n(.*?)```", text, re.S)
    assert m, f"README.md has no code block after {INTRO!r}"
    rows = [line.split(None, 1) for line in m[1].splitlines() if line.strip()]
    return [(r[0], " ".join(r[1].split()) if len(r) > 1 else "") for r in rows]


def differences(text: str) -> list[str]:
    """What the README's list gets wrong against the library (empty when it matches)."""
    listed = readme_list(text)
    names = [n for n, _ in listed]
    shown = dict(listed)
    library = {p.stem: " ".join(load_scenario(p).description.split()) for p in library_scenarios()}
    out = [f"missing from the README: {n}" for n in sorted(set(library) - set(shown))]
    out += [f"not in the library: {n}" for n in sorted(set(shown) - set(library))]
    out += [f"listed twice: {n}" for n in sorted({n for n in names if names.count(n) > 1})]
    out += [
        f"{n}: the README says {shown[n]!r}, `testbed scenarios` {d!r}"
        for n, d in sorted(library.items())
        if n in shown and shown[n] != d
    ]
    return out


def test_the_readme_lists_the_library_as_testbed_scenarios_does() -> None:
    assert differences(README.read_text()) == []


def test_a_missing_or_invented_scenario_is_a_difference() -> None:
    text = README.read_text()
    line = next(ln for ln in text.splitlines() if ln.startswith("thesis "))
    assert differences(text.replace(line + "\n", "")) == ["missing from the README: thesis"]
    invented = text.replace(line, line + "\nno-such   a scenario nobody wrote")
    assert differences(invented) == ["not in the library: no-such"]
    assert differences(text.replace(line, line + "\n" + line)) == ["listed twice: thesis"]
