"""YAML text to plain data, refusing what a config file never needs.

safe_load, bounded: a key given twice is an error; nesting deeper than
:data:`MAX_DEPTH` (PyYAML composes recursively: 5,000 levels were a RecursionError) and
aliases that expand past :data:`MAX_NODES` values ("billion laughs": PyYAML shares the
object, but validation walks every copy) are refused before anything is built; an
integer longer than Python reads (4,300 digits) reads as infinity, so the field it is
in refuses it by name; a value no constructor can build (``2001-13-45``, ``!!int x``)
is an error at its line. Every error is a :class:`yaml.YAMLError` with a position, and
:func:`yaml_problem` says it without quoting the text (it may be a secret).

The checks sit in the composer and constructor, in Python, over either parser: libyaml's
(:class:`FastConfigLoader`, 3.9 times faster on a 1 MiB file) when PyYAML has it, else
PyYAML's own (:class:`SafeConfigLoader`); see docs/decisions.md.
"""

from __future__ import annotations

import math
import sys
from typing import TYPE_CHECKING, Any

import yaml
from yaml.composer import Composer
from yaml.constructor import SafeConstructor
from yaml.resolver import Resolver

if TYPE_CHECKING:
    # What _Bounded is mixed into: a loader's scanner, parser, composer and constructor.
    _Loader = yaml.SafeLoader
else:
    _Loader = object

#: Bytes of config text at most; a real config is a few KiB (config/gateway.yaml: 30).
MAX_BYTES = 1024 * 1024
#: Levels of nesting at most; the schema's deepest field is 6 levels down.
MAX_DEPTH = 64
#: Values (scalars, lists, mappings) once every alias is expanded: about what the
#: largest file (MAX_BYTES) holds without aliases, so aliases add no new worst case.
MAX_NODES = 1_000_000
#: The problem of a text (or file) past MAX_BYTES.
TOO_LARGE = f"larger than {MAX_BYTES // 1024} KiB: not a config file"


class Refused(yaml.YAMLError):
    """A document this loader refuses, at a position, in words of our own."""

    def __init__(self, message: str, mark: yaml.Mark | None) -> None:
        super().__init__(message)
        self.problem = message
        self.problem_mark = mark


class DuplicateKey(Refused):
    pass


def _expanded_size(root: yaml.Node) -> int:
    """How many values ``root`` is once its aliases are copied out, counted without
    copying (each shared node once) and without recursion; past :data:`MAX_NODES` or
    on an alias inside its own anchor, :class:`Refused`."""
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        children = _children(node)
        if children_done:
            open_nodes.discard(id(node))
            sizes[id(node)] = size = 1 + sum(sizes[id(c)] for c in children)
            if size > MAX_NODES:
                raise Refused(f"aliases expand to more than {MAX_NODES} values", node.start_mark)
            continue
        if id(node) in sizes:
            continue
        if id(node) in open_nodes:
            raise Refused("an alias refers to its own anchor (a cycle)", node.start_mark)
        open_nodes.add(id(node))
        stack.append((node, True))
        stack.extend((c, False) for c in children if id(c) not in sizes)
    return sizes[id(root)]


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return []


class _Bounded(_Loader):
    """The checks, over any scanner and parser: composed in Python (PyYAML's Composer),
    with the depth counted before each node is composed, and constructed by
    SafeConstructor with the refusals below."""

    _depth = 0
    _anchored = False

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                mark = self.peek_event().start_mark  # type: ignore[no-untyped-call]
                raise Refused(f"nested more than {MAX_DEPTH} levels deep", mark)
            node: yaml.Node | None = super().compose_node(parent, index)  # type: ignore[misc]
            if self._depth == 1:  # the root: every anchor is known; compose_document forgets
                self._anchored = bool(self.anchors)
            return node
        finally:
            self._depth -= 1

    def compose_document(self) -> yaml.Node | None:
        node: yaml.Node | None = super().compose_document()  # type: ignore[misc]
        if node is not None and self._anchored:
            # Only an alias shares a node: without an anchor each value is a node of its
            # own, at least a byte of the file, so no more than MAX_BYTES of them; the
            # walk was a third of the time of a 1 MiB file.
            _expanded_size(node)
        return node

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep)  # type: ignore[misc]
        except yaml.YAMLError:
            raise
        except (ValueError, TypeError, KeyError, OverflowError):
            # A scalar its tag's constructor cannot build (a date 2001-13-45, !!int x,
            # a list as a key): PyYAML lets Python's own exception through.
            kind = str(node.tag).rpartition(":")[2] or "value"
            raise Refused(f"not a valid {kind} (quote it to mean text)", node.start_mark) from None

    def construct_yaml_int(self, node: yaml.ScalarNode) -> Any:
        digits = str(node.value).lstrip("+-").replace("_", "")
        if digits.isdigit() and len(digits) > sys.get_int_max_str_digits():
            # Past what int() reads; as infinity, the field it is in refuses it by name.
            return -math.inf if str(node.value).startswith("-") else math.inf
        return super().construct_yaml_int(node)  # type: ignore[misc]

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        first: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=deep)
            line = key_node.start_mark.line + 1
            if not isinstance(key, str | int | float | bool):
                continue  # PyYAML refuses what cannot be a key
            if key in first:
                raise DuplicateKey(
                    f"key {key!r} given twice: at line {first[key]} and line {line}",
                    key_node.start_mark,
                )
            first[key] = line
        return super().construct_mapping(node, deep)  # type: ignore[misc,no-any-return]


class SafeConfigLoader(_Bounded, yaml.SafeLoader):
    """safe_load with the bounds above, and a key given twice in one mapping is an error:
    PyYAML's scanner and parser, in Python (the reference)."""


SafeConfigLoader.add_constructor(
    "tag:yaml.org,2002:int",
    SafeConfigLoader.construct_yaml_int,  # type: ignore[arg-type]
)

#: The loader :func:`load` uses: libyaml's parser when PyYAML was built with it.
LOADER: type[_Bounded] = SafeConfigLoader

if yaml.__with_libyaml__:
    from yaml._yaml import CParser

    class FastConfigLoader(_Bounded, Composer, CParser, SafeConstructor, Resolver):  # type: ignore[misc]
        """The same checks, the same Composer and SafeConstructor, over libyaml's
        scanner and parser (CParser's events): a 1 MiB file in a third of the time
        (docs/decisions.md). Composer comes before CParser, whose own composer (in C)
        would build the nodes past the depth check."""

        def __init__(self, stream: str) -> None:
            CParser.__init__(self, stream)
            Composer.__init__(self)  # type: ignore[no-untyped-call]
            SafeConstructor.__init__(self)  # type: ignore[no-untyped-call]
            Resolver.__init__(self)  # type: ignore[no-untyped-call]

    FastConfigLoader.add_constructor(
        "tag:yaml.org,2002:int",
        FastConfigLoader.construct_yaml_int,  # type: ignore[arg-type]
    )
    LOADER = FastConfigLoader


def load(text: str) -> Any:
    """The document ``text`` holds, or a :class:`yaml.YAMLError` (see :func:`yaml_problem`)."""
    if len(text) > MAX_BYTES:
        raise Refused(TOO_LARGE, None)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        # A lone surrogate: said as PyYAML's reader says a character it refuses (libyaml
        # reads UTF-8, and the text would not encode to it).
        raise Refused(
            f"character {ord(text[exc.start]):#06x} at offset {exc.start} is not allowed "
            "in YAML text",
            None,
        ) from None
    try:
        return yaml.load(text, Loader=LOADER)  # noqa: S506 - SafeConstructor only
    except (ValueError, TypeError, KeyError, OverflowError, RecursionError) as exc:
        # What a constructor raised after construct_object returned (PyYAML fills
        # lists and mappings afterwards): no position is known.
        raise Refused(f"cannot be read as YAML ({type(exc).__name__})", None) from None


def yaml_problem(exc: yaml.YAMLError) -> str:
    """The YAML error without the text it stumbled on (that may be a secret)."""
    mark = getattr(exc, "problem_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    if isinstance(exc, DuplicateKey):
        return f"{where.split(',')[0]}: {exc.problem}" if where else str(exc.problem)
    if isinstance(exc, Refused):
        return f"{where}{exc.problem}"
    if isinstance(exc, yaml.reader.ReaderError):
        # A control character or an unpaired surrogate; its code names it, not the text.
        code = exc.character if isinstance(exc.character, int) else ord(str(exc.character)[:1])
        return f"character {code:#06x} at offset {exc.position} is not allowed in YAML text"
    problem = str(getattr(exc, "problem", None) or "invalid YAML")
    if "maximum nesting depth" in problem:
        # libyaml's own bound (1,000 levels), met by its scanner reading ahead of ours.
        problem = f"nested more than {MAX_DEPTH} levels deep"
    elif "alias" in problem:
        problem = "undefined alias: quote a value that starts with '*'"
    elif "tag" in problem:
        problem = "unknown tag: quote a value that starts with '!'"
    elif "'" in problem or '"' in problem:
        # PyYAML quotes the offending text; it may be part of a secret.
        problem = "invalid YAML here (check the quoting)"
    return f"{where}{problem}"
