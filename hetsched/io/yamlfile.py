"""Reading a user's YAML file safely: bounded size and depth, no duplicate keys.

* The file's size is checked before it is read (:data:`~hetsched.core.limits.MAX_YAML_BYTES`),
  so a 50 MB file is refused at once instead of scanned for a minute.
* Nesting is checked on libyaml's event stream before anything is built
  (:data:`~hetsched.core.limits.MAX_YAML_DEPTH`): a 5,000-deep document is refused
  instead of ending in RecursionError.
* A key given twice in one mapping is an error naming the key and its line
  (PyYAML would silently keep the last one).
* A UTF-8 byte-order mark is accepted.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from hetsched.core import limits
from hetsched.errors import InputError
from hetsched.io.files import read_text

_Loader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _DuplicateKey(Exception):
    def __init__(self, key: object, line: int) -> None:
        super().__init__(key, line)
        self.key, self.line = key, line


class UniqueKeyLoader(_Loader):
    """The safe loader, refusing a mapping that gives one key twice."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=deep)
            try:
                dup = key in seen
            except TypeError:
                continue  # an unhashable key: the base class reports it
            if dup:
                raise _DuplicateKey(key, key_node.start_mark.line + 1)
            seen.add(key)
        mapping: dict[Any, Any] = super().construct_mapping(node, deep=deep)
        return mapping


def _check_depth(text: str, source: str) -> None:
    depth = 0
    for event in yaml.parse(text, Loader=_Loader):
        if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            depth += 1
            if depth > limits.MAX_YAML_DEPTH:
                line = event.start_mark.line + 1 if event.start_mark else None
                raise InputError(source, f"nested more than {limits.MAX_YAML_DEPTH} levels "
                                 "deep; that is hetsched's limit",
                                 f"line {line}" if line else None)
        elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            depth -= 1


def parse_yaml(text: str, source: str) -> Any:
    """Parse YAML text, turning every failure into one InputError line naming ``source``."""
    text = text.removeprefix("\ufeff")
    try:
        _check_depth(text, source)
        return yaml.load(text, Loader=UniqueKeyLoader)  # noqa: S506 - a safe loader
    except _DuplicateKey as e:
        raise InputError(source, f"key {str(e.key)[:80]!r} is given twice in one mapping",
                         f"line {e.line}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark is not None else None
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise InputError(source, f"not valid YAML: {problem}", where) from None
    except RecursionError:
        raise InputError(source, "not valid YAML: nested too deeply") from None
    except (ValueError, TypeError, OverflowError) as e:  # int("9"*5000), bad timestamps
        raise InputError(source, f"not valid YAML: {str(e).splitlines()[0][:120]}") from None


def read_yaml(path: str | Path) -> Any:
    """Read a YAML file, turning every failure into one InputError line."""
    p = Path(path)
    text = read_text(p, "a YAML file", max_bytes=limits.MAX_YAML_BYTES)
    return parse_yaml(text, str(p))
