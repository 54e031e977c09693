"""docs/reference/ is what the code gives now: a field, a nemesis action, a checker or a command
line option added without `make docs` fails here, with the command to run."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from testbed.cli.docgen import DEFAULT_DIR, REFERENCES, main, stale
from testbed.config import LinkConfig
from testbed.scenario.reference import scenario_reference, slug


@pytest.mark.parametrize("name", sorted(REFERENCES))
def test_the_generated_reference_is_up_to_date(name: str) -> None:
    path = DEFAULT_DIR / name
    assert path.is_file(), f"{path} is missing: run `make docs`"
    assert path.read_text(encoding="utf-8") == REFERENCES[name](), (
        f"{path} is stale: run `make docs` (python -m testbed.cli.docgen) and commit the result"
    )


def test_every_field_of_a_model_is_in_the_reference_with_its_unit_and_default() -> None:
    text = scenario_reference()
    section = text.split("## LinkConfig\n", 1)[1].split("\n## ", 1)[0]
    for name in LinkConfig.model_fields:
        assert f"| `{name}` |" in section
    assert "| `bandwidth` | bandwidth | `100Gbps`, `12.5MB/s` | `100Gbps` |" in section
    assert "| `connections` | integer (>= 1, <= 64) |  | `4` | parallel TCP connections" in section


def test_every_nemesis_action_and_checker_has_a_section() -> None:
    from testbed.checkers import CHECKERS
    from testbed.nemesis import ACTIONS

    headings = re.findall(r"^### (\w+): (.*)$", scenario_reference(), re.M)
    actions = {t.strip() for k, ts in headings if k == "action" for t in ts.split(",")}
    checks = {t.strip() for k, ts in headings if k == "check" for t in ts.split(",")}
    assert actions == set(ACTIONS)
    assert checks == set(CHECKERS)


def test_every_link_in_the_references_lands_on_a_heading() -> None:
    for render in REFERENCES.values():
        text = render()
        anchors = {slug(h) for h in re.findall(r"^#+ (.*)$", text, re.M)}
        for target in re.findall(r"\]\(#([^)]+)\)", text):
            assert target in anchors, target


def test_check_names_a_stale_file_and_writing_makes_it_fresh(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert sorted(stale(tmp_path)) == sorted(str(tmp_path / n) for n in REFERENCES)
    assert main(["--check", "--out", str(tmp_path)]) == 1
    assert "run `make docs`" in capsys.readouterr().err
    assert main(["--out", str(tmp_path)]) == 0
    assert stale(tmp_path) == []
    (tmp_path / "cli.md").write_text("edited by hand\n", encoding="utf-8")
    assert stale(tmp_path) == [str(tmp_path / "cli.md")]
