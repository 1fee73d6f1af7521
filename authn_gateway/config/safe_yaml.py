"""YAML text to plain data, refusing what a config file never needs."""

from __future__ import annotations

from typing import Any

import yaml


class DuplicateKey(yaml.YAMLError):
    def __init__(self, message: str, mark: yaml.Mark) -> None:
        super().__init__(message)
        self.problem = message
        self.problem_mark = mark


class UniqueKeyLoader(yaml.SafeLoader):
    """safe_load, except that a key given twice in one mapping is an error."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        first: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=deep)  # type: ignore[no-untyped-call]
            line = key_node.start_mark.line + 1
            if isinstance(key, str | int | float | bool) and key in first:
                raise DuplicateKey(
                    f"key {key!r} given twice: at line {first[key]} and line {line}",
                    key_node.start_mark,
                )
            first[key] = line
        return super().construct_mapping(node, deep)  # type: ignore[no-untyped-call,no-any-return]


def yaml_problem(exc: yaml.YAMLError) -> str:
    """The YAML error without the text it stumbled on (that may be a secret)."""
    mark = getattr(exc, "problem_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    if isinstance(exc, DuplicateKey):
        return f"{where.split(',')[0]}: {exc.problem}" if where else str(exc.problem)
    problem = str(getattr(exc, "problem", None) or "invalid YAML")
    if "alias" in problem:
        problem = "undefined alias: quote a value that starts with '*'"
    elif "tag" in problem:
        problem = "unknown tag: quote a value that starts with '!'"
    elif "'" in problem or '"' in problem:
        # PyYAML quotes the offending text; it may be part of a secret.
        problem = "invalid YAML here (check the quoting)"
    return f"{where}{problem}"
