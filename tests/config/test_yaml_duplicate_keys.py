"""A key given twice in a scenario or profile file is an error naming the file and line: plain
YAML keeps the last, which silently drops the first setting."""

from __future__ import annotations

from pathlib import Path

import pytest

from testbed.config import load_yaml
from testbed.errors import ConfigError
from testbed.scenario.schema import load_scenario


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "s.yaml"
    p.write_text(text)
    return p


def test_a_duplicate_top_level_key_names_file_and_line(tmp_path: Path) -> None:
    path = write(tmp_path, "seed: 1\nduration: 10s\nseed: 2\n")
    with pytest.raises(ConfigError, match=rf"^{path}:3: YAML syntax error: duplicate key 'seed'$"):
        load_yaml(path)


def test_a_duplicate_nested_key_is_refused_by_the_scenario_loader(tmp_path: Path) -> None:
    text = (
        "deployments:\n"
        "  a: {kind: homogeneous, local: {hardware: h20x8, instances: 2}}\n"
        "policy:\n"
        "  name: homogeneous\n"
        "  name: naive\n"
    )
    with pytest.raises(ConfigError, match=r":5: YAML syntax error: duplicate key 'name'"):
        load_scenario(write(tmp_path, text))


def test_the_same_key_in_different_mappings_is_fine(tmp_path: Path) -> None:
    data = load_yaml(write(tmp_path, "a: {x: 1}\nb: {x: 2}\nc: [{x: 3}, {x: 4}]\n"))
    assert data == {"a": {"x": 1}, "b": {"x": 2}, "c": [{"x": 3}, {"x": 4}]}
