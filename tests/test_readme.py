"""The README is a landing page (issue #36): short, every relative link lands, and a newcomer's
first three questions are answered under headings its table of contents lists near the top.
(tests/test_readme_scenarios.py checks its scenario list against the library.)

The docs map (docs/README.md) and the pages issue #36 added are link-checked too: a link that
moves with a renamed file or heading should fail here, not in a reader's browser."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from testbed.scenario.reference import slug

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MAX_CHARS = 10_000
TOC_WITHIN = 3_000

QUESTIONS = {
    "how do I run on compose": "SUBSTRATE=compose",
    "how do I plug in my scheduler": "docs/policy-protocol.md",
    "what is a vacuous check": "exercised nothing",
}
"""Each question a newcomer asks and a phrase only its answer contains."""

LINK = re.compile(r"\]\(([^)\s]+)\)")
CODE = re.compile(r"```.*?```", re.S)


def headings(text: str) -> list[str]:
    return re.findall(r"^#{1,6} (.+?)\s*$", CODE.sub("", text), re.M)


def sections(text: str) -> dict[str, str]:
    """Heading -> the text under it, up to the next heading of any level."""
    parts = re.split(r"^#{1,6} (.+?)\s*$", text, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def anchors_of(path: Path) -> set[str]:
    return {slug(h) for h in headings(path.read_text(encoding="utf-8"))}


def broken_links(path: Path) -> list[str]:
    """Every relative link of a Markdown file whose file (or heading) does not exist."""
    text = path.read_text(encoding="utf-8")
    out = []
    for target in LINK.findall(CODE.sub("", text)):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        if not dest.exists():
            out.append(f"{path.name}: {target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors_of(dest):
            out.append(f"{path.name}: {target}: no such heading")
    return out


def table_of_contents(text: str) -> list[str]:
    """The anchors the contents list links to, if it sits within the first TOC_WITHIN chars."""
    head = text[:TOC_WITHIN]
    m = re.search(r"^## Contents\n(.*?)(?=^## )", head, re.S | re.M)
    assert m, f"no '## Contents' section ending within the README's first {TOC_WITHIN} chars"
    return re.findall(r"^- \[[^\]]+\]\(#([^)]+)\)", m[1], re.M)


def test_the_readme_is_short() -> None:
    size = len(README.read_text(encoding="utf-8"))
    assert size <= MAX_CHARS, f"README.md is {size} characters; at most {MAX_CHARS}"


LINKED_PAGES = (
    "running",
    "fidelity",
    "thesis",
    "transfer",
    "development",
    "sim",
    "sim-speed-log",
    "scheduler",
)
"""docs/ pages whose links are checked besides the README and the docs map."""

DOCS = [
    README,
    ROOT / "docs/README.md",
    *(ROOT / "docs" / f"{n}.md" for n in LINKED_PAGES),
]


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(path: Path) -> None:
    assert broken_links(path) == []


def test_the_contents_list_headings_that_exist() -> None:
    text = README.read_text(encoding="utf-8")
    anchors = {slug(h) for h in headings(text)}
    toc = table_of_contents(text)
    assert toc and set(toc) <= anchors, set(toc) - anchors


@pytest.mark.parametrize("question", sorted(QUESTIONS))
def test_a_newcomers_question_is_answered_under_a_listed_heading(question: str) -> None:
    text = README.read_text(encoding="utf-8")
    toc = set(table_of_contents(text))
    answering = [h for h, body in sections(text).items() if QUESTIONS[question] in body]
    assert answering, f"no section of README.md answers {question!r}"
    assert any(slug(h) in toc for h in answering), (
        f"{question!r} is answered under {answering}, none of them in the table of contents"
    )


def test_a_broken_link_and_a_missing_heading_are_caught(tmp_path: Path) -> None:
    (tmp_path / "b.md").write_text("# Title\n\n## A section\n", encoding="utf-8")
    page = tmp_path / "a.md"
    page.write_text(
        "[ok](b.md) [ok](b.md#a-section) [no](c.md) [no](b.md#nowhere) [web](https://x.y/z)\n"
        "```\n[in code](nowhere.md)\n```\n",
        encoding="utf-8",
    )
    assert broken_links(page) == ["a.md: c.md: no such file", "a.md: b.md#nowhere: no such heading"]
