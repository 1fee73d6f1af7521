"""``@value``: an immutable record for the review's hot path.

A frozen dataclass sets each field through ``object.__setattr__`` and costs about
1.3 µs to build with seven fields, against 0.3 µs for a plain slots dataclass
(docs/decisions.md, "One review path, one coroutine"). A cache hit builds several (the
verdict, the parsed request, the route), so these are slots dataclasses at run time and
frozen dataclasses to mypy (``dataclass_transform(frozen_default=True)``): assigning to
a field is a type error, caught in CI, not at run time. Unlike a frozen dataclass, such a
record is not hashable at run time: do not make one a set member or a dict key.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar, dataclass_transform

T = TypeVar("T")


@dataclass_transform(frozen_default=True)
def value(cls: type[T]) -> type[T]:
    """A slots dataclass that mypy treats as frozen (see the module)."""
    return dataclass(slots=True)(cls)
