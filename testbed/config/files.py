"""Reading a configuration file: YAML, bounded in size, every error one line naming the file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from testbed.errors import ConfigError

__all__ = ["MAX_YAML_BYTES", "load_yaml", "read_text"]

MAX_YAML_BYTES = 16 << 20
"""Scenario and profile files are small; anything bigger is a mistake (or hostile)."""


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in one mapping: plain YAML keeps the last one,
    so `policy:` written twice would silently drop the first (a no-op setting by another name).

    It also marks a value its tag cannot read: PyYAML's constructors raise a bare ValueError for
    `!!int 12abc` or `!!float 1x` (int() and float() of the text), a KeyError for `!!bool 13`,
    an AttributeError for `!!timestamp x`, none of which a YAMLError handler catches; here each
    becomes a ConstructorError at the value's line."""

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep)
        except (ValueError, TypeError, OverflowError, KeyError, IndexError, AttributeError) as exc:
            # `!!bool 13` is a KeyError, `!!timestamp x` an AttributeError: the constructors
            # index and match the text without checking it
            text = node.value if isinstance(node, yaml.ScalarNode) else type(node).__name__
            shown = text if len(text) <= 40 else text[:37] + "..."
            tag = node.tag.replace("tag:yaml.org,2002:", "!!")
            raise yaml.constructor.ConstructorError(
                None, None, f"{tag} cannot read {shown!r} ({exc})", node.start_mark
            ) from None


def _mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node)
        try:
            duplicate = key in seen
        except TypeError:  # a list or a mapping as a key: not a field name, whatever it says
            raise yaml.constructor.ConstructorError(
                None, None, f"a key must be a name, not a {key_node.id}", key_node.start_mark
            ) from None
        if duplicate:
            shown = repr(key) if len(repr(key)) <= 40 else repr(key)[:37] + "..."
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {shown}", key_node.start_mark
            )
        seen.add(key)
    return loader.construct_mapping(node)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)


def read_text(path: Path, limit: int = MAX_YAML_BYTES, what: str = "a scenario file") -> str:
    """A small UTF-8 file's text, refusing what could block (a FIFO, a device), what is too big
    and what is not text, each in one line naming the file."""
    try:
        if path.exists() and not path.is_file():  # a FIFO or a device could block or never end
            raise ConfigError(f"{path}: not a regular file")
        with path.open("rb") as f:
            raw = f.read(limit + 1)
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    if len(raw) > limit:
        raise ConfigError(f"{path}: larger than {limit >> 20} MiB; not {what}")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start + 1})") from None


def load_yaml(path: Path) -> Any:
    """Read a YAML file; syntax errors become one line naming the file and line."""
    text = read_text(path)
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader: no arbitrary objects
    except RecursionError:
        raise ConfigError(f"{path}: YAML nested too deeply") from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f":{mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{path}{where}: YAML syntax error: {exc.problem}") from None
    except yaml.YAMLError as exc:
        one_line = " ".join(part.strip() for part in str(exc).splitlines())
        raise ConfigError(f"{path}: YAML error: {one_line}") from None
