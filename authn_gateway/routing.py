"""Which backends may see a token.

* A token that starts with a backend's ``prefix`` goes to that backend only
  (longest prefix wins), with the prefix removed when ``strip_prefix`` is set.
* Any other token goes through the *chain*: the backends with no prefix (or with
  ``in_chain: true``), in the order of the config file.

The chain's answer:

* the first backend that authenticates the token wins;
* if every backend rejected it, it is rejected;
* if any backend was unavailable and none authenticated, the answer is
  *unavailable*, never "invalid": the backend that was down might have accepted it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from backends.base import Unavailable

B = TypeVar("B")


@dataclass(frozen=True, slots=True)
class Route(Generic[B]):
    backends: tuple[B, ...]
    # The token as these backends must see it (prefix stripped where configured).
    token: str


@dataclass(frozen=True, slots=True)
class PrefixRule(Generic[B]):
    prefix: str
    strip: bool
    backend: B


class Router(Generic[B]):
    def __init__(self, prefixed: Sequence[PrefixRule[B]], chain: Sequence[B]) -> None:
        self._prefixed = sorted(prefixed, key=lambda r: len(r.prefix), reverse=True)
        self._chain = tuple(chain)

    def route(self, token: str) -> Route[B]:
        for rule in self._prefixed:
            if token.startswith(rule.prefix):
                routed = token[len(rule.prefix) :] if rule.strip else token
                return Route((rule.backend,), routed)
        return Route(self._chain, token)


def unavailable_in_chain(unanswered: Sequence[tuple[str, Unavailable]]) -> Unavailable:
    """The chain's answer when none authenticated and some could not answer.

    The verdict names the first backend that could not answer, and the answer renders
    as ``<backend>: <reason>``; so the first reason goes bare and each further one
    carries its backend's name: ``sso: timeout; ldap: server down``."""
    (_, first), rest = unanswered[0], unanswered[1:]
    return Unavailable("; ".join([first.reason, *(f"{name}: {u.reason}" for name, u in rest)]))
