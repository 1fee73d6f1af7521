"""YAML text to plain data, refusing what a config file never needs.

safe_load, bounded: a key given twice is an error; nesting deeper than
:data:`MAX_DEPTH` (PyYAML composes recursively: 5,000 levels were a RecursionError) and
a document of more than :data:`MAX_NODES` nodes, each alias counted as the copy it
stands for ("billion laughs": PyYAML shares the object, but validation walks every
copy, and reports a problem in each), are refused while composing, before more is
built; an
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
#: Nodes (scalars, keys among them, lists, mappings) a document may compose, each alias
#: counted as the size of what it stands for. Every document is held to it, with aliases
#: or without, so aliases add no new worst case: at the bound a file costs about 2 s and
#: 180 MB to read, validate and report (a 1 MiB list of 500,000 invalid items cost 6 s,
#: 590 MB and 500,000 problem lines; aliases expanding to 480,000 items, 774 MB). A
#: 1 MiB file of inline static tokens (loadtests/config_parse.py) is ~135,000 nodes.
MAX_NODES = 200_000
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


class _Bounded(_Loader):
    """The checks, over any scanner and parser: composed in Python (PyYAML's Composer),
    with the depth and the nodes counted before each node is composed, and constructed
    by SafeConstructor with the refusals below."""

    _depth = 0
    #: Nodes composed so far in this document, each alias counted as its anchor's size.
    _nodes = 0
    #: Each anchor's node once composed, as (nodes, levels): names are unique in a
    #: document (PyYAML refuses a duplicate anchor). The anchors still being composed.
    _anchored: dict[str, tuple[int, int]]
    _open_anchors: set[str]
    #: The deepest level reached inside the anchors being composed, aliases' copies
    #: counted (kept only while one is open).
    _reach = 0

    def compose_document(self) -> yaml.Node | None:
        self._nodes, self._anchored, self._open_anchors, self._reach = 0, {}, set(), 0
        return super().compose_document()  # type: ignore[misc,no-any-return]

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        event: Any = self.peek_event()  # type: ignore[no-untyped-call]
        anchor, mark = event.anchor, event.start_mark
        if anchor is None:
            # Most nodes: one more, one level deeper.
            self._depth = depth = self._depth + 1
            try:
                self._count(1, depth, mark)
                return super().compose_node(parent, index)  # type: ignore[misc,no-any-return]
            finally:
                self._depth -= 1
        if event.__class__ is yaml.AliasEvent:
            if anchor in self._open_anchors:
                raise Refused("an alias refers to its own anchor (a cycle)", mark)
            # An undefined alias is PyYAML's error, raised by the Composer below.
            nodes, levels = self._anchored.get(anchor, (0, 0))
            self._count(nodes, self._depth + levels, mark)
            return super().compose_node(parent, index)  # type: ignore[misc,no-any-return]
        # An anchor: its size is what is counted while it is composed.
        self._depth = depth = self._depth + 1
        before, reach = self._nodes, self._reach
        self._open_anchors.add(anchor)
        self._reach = depth
        try:
            self._count(1, depth, mark)
            node: yaml.Node | None = super().compose_node(parent, index)  # type: ignore[misc]
        finally:
            self._depth -= 1
            self._open_anchors.discard(anchor)
        self._anchored[anchor] = (self._nodes - before, self._reach - depth + 1)
        self._reach = max(reach, self._reach)
        return node

    def _count(self, nodes: int, deepest: int, mark: yaml.Mark) -> None:
        """``nodes`` more (a node, or an alias's copy), reaching level ``deepest``: past
        :data:`MAX_DEPTH` or :data:`MAX_NODES`, :class:`Refused` at ``mark``."""
        if deepest > MAX_DEPTH:
            raise Refused(f"nested more than {MAX_DEPTH} levels deep", mark)
        self._nodes += nodes
        if self._nodes > MAX_NODES:
            raise Refused(
                f"expands to more than {MAX_NODES} nodes (an alias counts as a copy of its anchor)",
                mark,
            )
        if self._open_anchors and deepest > self._reach:
            self._reach = deepest

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
        if not isinstance(node, yaml.MappingNode):
            # !!map or !!set on a list or a scalar: PyYAML's own check comes after a
            # loop that fails on it (a TypeError without a position).
            raise Refused(f"expected a mapping, but found {_KIND[node.id]}", node.start_mark)
        first: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            if isinstance(key_node, yaml.ScalarNode) and key_node.tag != _STR:
                # No mapping of the config takes a key that is not text: `yes: 1` was
                # "[1]: Keys should be strings", as if a list's second item.
                raise Refused(_not_text(key_node), key_node.start_mark)
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


_STR = "tag:yaml.org,2002:str"
_KIND = {"scalar": "a single value", "sequence": "a list", "mapping": "a mapping"}
#: What a key reads as, by its tag, in words.
_READS_AS = {
    "bool": "a boolean",
    "int": "a number",
    "float": "a number",
    "null": "null",
    "timestamp": "a date",
    "binary": "bytes",
}
#: A key written longer than this is not quoted (it may be a secret pasted as a key).
_SHOWN_KEY = 16


def _not_text(key: yaml.ScalarNode) -> str:
    """Why a plain key that YAML reads as no text is refused, with the key as written."""
    kind = str(key.tag).rpartition(":")[2]
    reads = _READS_AS.get(kind, f"a {kind}" if kind.isalpha() else "a value that is not text")
    text = str(key.value)
    written = repr(text) if len(text) <= _SHOWN_KEY else f"of {len(text)} characters"
    return f"key {written} reads as {reads}, not text: quote it to mean the text"


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
