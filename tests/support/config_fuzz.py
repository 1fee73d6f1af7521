"""Config files to fuzz check-config and reloads with (issue 36, "Fuzz the config"):
arbitrary YAML documents, and valid documents with arbitrary values set in one to three
settings fields, found by walking the schema (tests/support/config_schema.py). Each
document also holds a static backend first in the chain, so that a config check-config
accepts can be asked to serve a review of :data:`TOKEN`.

The property the tests hold these to: check-config answers "invalid configuration" with
lines that each name a field or a position, or it accepts, and then the config serves
that review without an internal error."""

from __future__ import annotations

import copy
import math
import re
import string
import types
from pathlib import Path
from typing import Annotated, Any, Union, get_args, get_origin

import httpx
import yaml
from hypothesis import strategies as st
from pydantic import BaseModel, SecretStr
from pydantic.fields import FieldInfo

from authn_gateway.config import GatewayConfig
from tests.support.config_schema import (
    BACKENDS,
    SECTIONS,
    Spot,
    _plain,
    literal_values,
    place,
    spots,
)
from tests.support.hostile_files import hostile_paths
from tests.support.procs import review_body

TOKEN = "fuzz-static-token"
SERVING = {"type": "static", "name": "fuzz-serving", "tokens": [{"token": TOKEN, "username": "fz"}]}
SPOTS = spots()

#: How a problem line of check-config starts, after "<file>: ": a position in the text,
#: one of the few whole-file problems (the count of problems past the first 50 among
#: them), or (anything else) a field's path and ": ".
WHOLE = re.compile(
    r"^(line \d+(, column \d+)?: \S"
    r"|character 0x[0-9a-f]{4} at offset \d+ "
    r"|larger than \d+ KiB"
    r"|\.\.\. and \d+ more problems?$"
    r"|top level must be a mapping$)"
)


def named(problem: str, doc: Any = None) -> bool:
    """Whether ``problem`` is one line that says where: a position, or a field path
    (in ``doc``'s own keys, when it is given); never the unexpected-error line."""
    if "\n" in problem or "cannot be checked: unexpected" in problem or not problem.strip():
        return False
    if WHOLE.match(problem):
        return True
    where, sep, what = problem.partition(": ")
    if not sep or not where or not what.strip():
        return False
    if isinstance(doc, dict) and not where.startswith("'"):  # quoted: an odd key of the file
        top = re.split(r"[.\[]", where, maxsplit=1)[0]
        return top in {str(k) for k in doc}
    return True


# Values no field takes, and values near what some take.
SPECIAL: list[Any] = [
    math.inf,
    -math.inf,
    math.nan,
    10**100,
    -(10**100),
    2**63,
    -1,
    0,
    1,
    0.5,
    "",
    " ",
    "\x00",
    "1e400",
    "inf",
    "nan",
    "50/second",
    "3000/minute",
    None,
    True,
    False,
    [],
    {},
    [None],
    {"a": 1},
]
JSONISH = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text(max_size=16)
    | st.sampled_from(SPECIAL),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)


def _nest(depth: int) -> Any:
    value: Any = "x"
    for i in range(depth):
        value = [value] if i % 2 else {"k": value}
    return value


HOSTILE = st.one_of(
    st.sampled_from(SPECIAL),
    JSONISH,
    st.integers(1, 120).map(_nest),
    st.text(max_size=40),
    st.integers(4301, 6000).map(lambda n: "9" * n),  # past what int() reads
)


def _constraints(spot: Spot) -> dict[str, float]:
    """The spot's numeric bounds (ge, gt, le, lt), wherever pydantic keeps them: on the
    field, or in the Annotated type under an Optional."""
    found: dict[str, float] = {}

    def read(items: list[Any]) -> None:
        for item in items:
            if isinstance(item, FieldInfo):
                read(list(item.metadata))
            for name in ("ge", "gt", "le", "lt"):
                value = getattr(item, name, None)
                if isinstance(value, int | float) and not isinstance(value, bool):
                    found[name] = float(value)

    read(list(spot.field.metadata))
    annotation = spot.annotation
    while get_origin(annotation) in (Annotated, Union, types.UnionType):
        args = [a for a in get_args(annotation) if a is not type(None)]
        if get_origin(annotation) is Annotated:
            annotation, *extra = get_args(annotation)
            read(extra)
        elif len(args) == 1:
            annotation = args[0]
        else:
            break
    return found


#: Fields that name a file the gateway reads: a path, or a secret given as file:PATH.
READ_FILES = frozenset({Path, SecretStr})


def hostile_files(spot: Spot) -> st.SearchStrategy[str]:
    """A file no reader may take (a device, a FIFO, a directory, a huge sparse file:
    tests/support/hostile_files.py), named as the spot names a file."""
    paths = st.sampled_from(hostile_paths())
    return paths.map(lambda p: f"file:{p}") if spot.kind is SecretStr else paths


def typed(spot: Spot) -> st.SearchStrategy[Any]:
    """Values of the spot's own type: in its bounds, at them and just past them; for a
    file the gateway reads, also a file it must refuse."""
    literals = literal_values(spot.annotation)
    if literals:
        return st.sampled_from(literals)
    kind = spot.kind
    if kind in READ_FILES:
        return hostile_files(spot) | _shaped(_plain(spot.annotation))
    bounds = _constraints(spot)
    low = bounds.get("ge", bounds.get("gt", -1e6))
    high = bounds.get("le", bounds.get("lt", 1e6))
    edges = [low, high, low - 1, high + 1, (low + high) / 2]
    if kind is bool:
        return st.booleans()
    if kind is int:
        lo, hi = math.ceil(low), math.floor(high)
        return st.integers(lo, hi) | st.sampled_from([int(e) for e in edges])
    if kind is float:
        inside = st.floats(low, high, allow_nan=False, allow_infinity=False)
        return inside | st.sampled_from(edges)
    if kind is str:
        return st.text(max_size=40) | st.sampled_from(["x", "a-b", "http://127.0.0.1:9/"])
    return _shaped(_plain(spot.annotation))


def _shaped(annotation: Any) -> st.SearchStrategy[Any]:
    """A section or a list as the schema has it: the fewest keys a section takes, lists
    of short strings or of such sections."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return st.just(copy.deepcopy(SECTIONS.get(annotation.__name__, {})))
    if get_origin(annotation) is list:
        item = _plain(get_args(annotation)[0])
        if item is str:
            return st.lists(st.text(string.ascii_lowercase + "-:/.", max_size=12), max_size=3)
        return st.lists(_shaped(item), max_size=2)
    return HOSTILE


#: The fields naming a file the gateway writes (relative names land in its cwd).
WRITTEN = frozenset({"server.audit_log", "deny_list.file"})


#: The fields that name a file the gateway reads, found by the walk.
FILE_SPOTS = [s for s in SPOTS if s.kind in READ_FILES]


@st.composite
def field_documents(
    draw: st.DrawFn,
    leave_out: frozenset[str] = frozenset(),
    among: list[Spot] | None = None,
) -> dict[str, Any]:
    """A valid document with arbitrary values in one or two fields (but those named in
    ``leave_out``; the first one ``among`` these when given): the serving static backend
    first, then (for a backend's fields) a backend of that type."""
    fields = [s for s in (among or SPOTS) if s.name not in leave_out]
    first = draw(st.sampled_from(fields))
    same = [s for s in SPOTS if s.name not in leave_out and s.backend in (None, first.backend)]
    chosen = [first, *draw(st.lists(st.sampled_from(same), max_size=1))]
    doc: dict[str, Any] = {"backends": [copy.deepcopy(SERVING)]}
    backend = next((s.backend for s in chosen if s.backend), None)
    if backend is not None:
        doc["backends"].append(copy.deepcopy(BACKENDS[backend]))
    for spot in chosen:
        # Mostly values of the field's type, so that many files are valid and served.
        value = draw(st.one_of(typed(spot), typed(spot), typed(spot), HOSTILE))
        place(doc, spot, value, backend=1)
    return doc


def dump(doc: dict[str, Any]) -> str:
    """``doc`` as YAML text; numbers no YAML writer spells are written as their text."""
    try:
        return yaml.safe_dump(doc, allow_unicode=True)
    except (ValueError, yaml.YAMLError):
        return yaml.safe_dump(_printable(doc), allow_unicode=True)


def _printable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _printable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_printable(v) for v in value]
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 10**4000:
        return str(value)[:100]
    return value


_YAML_CHARS = "abcxyz019.:-_ {}[],&*!|>'\"#%@?\n\t<=+/\\e"


@st.composite
def yaml_texts(draw: st.DrawFn) -> str:
    """Arbitrary YAML text: noise, a valid file mutated, deep nesting, alias fans."""
    base = dump({"backends": [copy.deepcopy(SERVING)]})
    kind = draw(st.sampled_from(["noise", "mutated", "nested", "aliases", "json"]))
    if kind == "noise":
        return draw(st.text(_YAML_CHARS, max_size=200))
    if kind == "mutated":
        text = base
        for _ in range(draw(st.integers(1, 4))):
            at = draw(st.integers(0, len(text)))
            cut = draw(st.integers(0, 3))
            text = text[:at] + draw(st.text(_YAML_CHARS, max_size=6)) + text[at + cut :]
        return text
    if kind == "nested":
        depth = draw(st.integers(1, 300))
        opener, closer = draw(st.sampled_from([("[", "]"), ("{a: ", "}")]))
        return base + "audiences: " + opener * depth + "x" + closer * depth + "\n"
    if kind == "aliases":
        levels, fan = draw(st.integers(1, 9)), draw(st.integers(1, 12))
        lines = [f"l0: &l0 [{', '.join(['lol'] * fan)}]"]
        lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * fan)}]" for i in range(1, levels)]
        return base + "\n".join(lines) + f"\naudiences: *l{levels - 1}\n"
    return dump(
        {
            "backends": draw(JSONISH),
            **draw(st.dictionaries(st.text(max_size=8), JSONISH, max_size=3)),
        }
    )


def review_request(config: GatewayConfig) -> tuple[str, dict[str, str]]:
    """The path and headers of a review of :data:`TOKEN` that ``config`` lets in."""
    headers = {"content-type": "application/json"}
    if config.server.caller_tokens:
        headers["authorization"] = (
            f"Bearer {config.server.caller_tokens[0].token.get_secret_value()}"
        )
    return config.server.review_path, headers


def check_answer(answer: httpx.Response) -> None:
    """A review answer that is no internal error: 200 (or 429, the inbound limit's)."""
    assert answer.status_code in (200, 429), (answer.status_code, answer.text)
    assert "internal error" not in answer.text, answer.text


REVIEW = review_body(TOKEN)
