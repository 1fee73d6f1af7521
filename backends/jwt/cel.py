"""CEL expressions, compiled once at config load.

The ``common-expression-language`` bindings (a Rust CEL) are used rather than the
pure-Python cel-python: 13x faster to evaluate and 7x faster to compile on the
expressions kube users write (docs/decisions.md, ``python -m loadtests.cel_compare``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import cel
from cel.stdlib import EXTENSIONS

# kube's JWT authenticator CEL environment has cel-go's strings, lists, sets and
# base64 extensions; the bindings ship those as Python functions, added per program
# only when it calls them (a Context costs ~8 us per evaluation).
KUBE_EXTENSIONS: dict[str, Any] = {
    name: func
    for library in ("strings", "lists", "sets", "encoders")
    for name, func in EXTENSIONS[library].items()
}


@dataclass(frozen=True, slots=True)
class Compiled:
    program: cel.Program
    functions: dict[str, Any]


class CelError(ValueError):
    """An expression that cannot be compiled; the message quotes the expression."""


class CelEvaluationError(Exception):
    """An expression that failed on one token's claims (a missing claim, a type error)."""


@functools.lru_cache(maxsize=4096)
def compile_expression(expression: str) -> Compiled:
    """Compile ``expression``; the same text is compiled once per process."""
    if not expression.strip():
        raise CelError("expression must not be empty")
    try:
        program = cel.compile(expression)
        wanted = {n: KUBE_EXTENSIONS[n] for n in program.functions() if n in KUBE_EXTENSIONS}
        return Compiled(program, wanted)
    except (ValueError, TypeError, RuntimeError) as exc:
        # The library's message echoes the expression with a caret; keep its first line.
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise CelError(f"cannot compile CEL {expression!r}: {first}") from None


def check_expression(expression: str) -> str:
    """Pydantic validator: compile now, so a bad expression is a config error."""
    compile_expression(expression)
    return expression


def evaluate(expression: str, variables: dict[str, Any]) -> Any:
    """Evaluate a compiled expression; any failure is a :class:`CelEvaluationError`."""
    compiled = compile_expression(expression)
    try:
        if compiled.functions:
            return compiled.program.execute(cel.Context(variables, compiled.functions))
        return compiled.program.execute(variables)
    except Exception as exc:
        # The bindings raise KeyError (missing claim), TypeError, ZeroDivisionError,
        # ValueError...: all mean "these claims do not fit the expression".
        raise CelEvaluationError(f"{type(exc).__name__} in {expression!r}") from None
