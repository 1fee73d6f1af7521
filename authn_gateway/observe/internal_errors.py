"""Bugs of ours: answered as errors that blame no IdP, reported without secrets.

An exception that escapes a backend (or the review path itself) is never the IdP's
doing, so the answer is :class:`~backends.base.InternalError`: an error for kube-apiserver
(not cached, not "invalid token"), served stale for known users, and ignored by the
breaker, so no input can open it for everyone.

An exception's message can hold token material: a ``UnicodeEncodeError`` names the
character and its position, a ``KeyError`` its key. So the log line carries the
exception's type and the stack (files, lines, functions, our source lines: code,
never data), never its message or its chained causes. It is written once per kind
(where, type, raising line) per process; every occurrence is counted in
``authn_gateway_internal_errors_total``.
"""

from __future__ import annotations

import logging
import os
import traceback
from typing import Protocol

from backends.base import InternalError

log = logging.getLogger(__name__)

#: Kinds remembered per process; past this, new kinds are still counted but not logged.
MAX_KINDS = 256


class InternalErrorCounter(Protocol):
    def internal_error(self, where: str, error: str) -> None: ...


_seen: set[tuple[str, str, str]] = set()


def _raised_at(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return "?"
    last = frames[-1]
    return f"{last.filename}:{last.lineno}"


def unexpected(exc: BaseException) -> str:
    """An exception nothing classifies (a bug), in one line by type and place, for a
    command's or a reload's refusal: its message may quote a config value or a token."""
    frames = traceback.extract_tb(exc.__traceback__)
    at = f" at {os.path.basename(frames[-1].filename)}:{frames[-1].lineno}" if frames else ""
    return f"unexpected {type(exc).__name__}{at} (please report this)"


def internal_error(where: str, exc: BaseException, metrics: InternalErrorCounter) -> InternalError:
    """The answer for an unexpected exception in ``where`` (a backend name, or "gateway")."""
    error = type(exc).__name__
    metrics.internal_error(where, error)
    kind = (where, error, _raised_at(exc))
    if kind not in _seen and len(_seen) < MAX_KINDS:
        _seen.add(kind)
        stack = "".join(traceback.format_list(traceback.extract_tb(exc.__traceback__)))
        log.error(
            "%s: internal error %s at %s, answered as unavailable without counting against "
            "the breaker; this kind is logged once, every one is counted in "
            "authn_gateway_internal_errors_total (the message is left out: it may hold "
            "token material)\n%s",
            where,
            error,
            kind[2],
            stack.rstrip(),
        )
    return InternalError("internal error")
