"""One log line per review, cheap enough for the cache-hit path.

Formatting a stdlib ``logging`` record costs more than a cached review itself, so
review lines are rendered directly (logfmt text or JSON) and written in batches by
the event loop, at most every 100 ms. Lines carry a keyed-hash prefix of the token,
never the token.
"""

from __future__ import annotations

import asyncio
import re
import sys
import time
from typing import IO, Any

import orjson

FLUSH_INTERVAL = 0.1
MAX_BUFFERED = 512


# Anything that could end a line or start a fake field must be quoted and escaped.
_NEEDS_QUOTES = re.compile(r'[\s"=\\\x00-\x1f\x7f\u0085\u2028\u2029]')
_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"}
_TO_ESCAPE = re.compile(r'["\\\x00-\x1f\x7f\u0085\u2028\u2029]')


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    return _ESCAPES.get(char) or f"\\u{ord(char):04x}"


def _logfmt(text: str) -> str:
    """A logfmt value, quoted and escaped when it holds anything but plain characters,
    so that a value (a user name from an IdP) can never end the line or add a field."""
    if not text:
        return '""'
    if _NEEDS_QUOTES.search(text) is None:
        return text
    return '"' + _TO_ESCAPE.sub(_escape, text) + '"'


_second = -1
_second_text = ""


def _utc_now() -> str:
    """RFC 3339 UTC time with milliseconds; the date part is formatted once a second."""
    global _second, _second_text
    now = time.time()
    second = int(now)
    if second != _second:
        _second, _second_text = second, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
    return f"{_second_text}.{int((now - second) * 1000):03d}Z"


class BatchedWriter:
    """Lines written by the event loop in batches, at most every FLUSH_INTERVAL."""

    def __init__(self, stream: IO[str] | None = None) -> None:
        self._stream = stream
        self._buffer: list[str] = []
        self._flush_scheduled = False

    def append(self, line: str) -> None:
        self._buffer.append(line)
        if len(self._buffer) >= MAX_BUFFERED:
            self.flush()
        elif not self._flush_scheduled:
            try:
                asyncio.get_running_loop().call_later(FLUSH_INTERVAL, self.flush)
                self._flush_scheduled = True
            except RuntimeError:
                self.flush()

    def flush(self) -> None:
        self._flush_scheduled = False
        if not self._buffer:
            return
        lines, self._buffer = self._buffer, []
        stream = self._stream or sys.stderr
        try:
            stream.write("\n".join(lines) + "\n")
            stream.flush()
        except (OSError, ValueError):
            pass  # a closed log stream must not fail reviews


class ReviewLog:
    """The review line: logfmt text or a JSON object."""

    def __init__(self, fmt: str = "text", stream: IO[str] | None = None) -> None:
        self._json = fmt == "json"
        self._writer = BatchedWriter(stream)

    def write(
        self,
        *,
        token: str,
        answer: str,
        backend: str,
        ms: float,
        cached: bool,
        stale: bool = False,
        user: str | None = None,
        reason: str | None = None,
        caller: str | None = None,
    ) -> None:
        """Queue one review line; fields with no value are left out."""
        if self._json:
            doc: dict[str, Any] = {
                "time": round(time.time(), 3),
                "msg": "review",
                "token": token,
                "answer": answer,
                "backend": backend,
                "ms": ms,
                "cached": cached,
            }
            if stale:
                doc["stale"] = True
            for key, value in (("user", user), ("reason", reason), ("caller", caller)):
                if value is not None:
                    doc[key] = value
            line = orjson.dumps(doc).decode()
        else:
            # One expression: this runs on every review, cache hits included.
            line = (
                f"time={_utc_now()} level=info msg=review token={token} answer={answer} "
                f"backend={backend} ms={ms} cached={cached}"
                + (" stale=True" if stale else "")
                + (f" user={_logfmt(user)}" if user is not None else "")
                + (f" reason={_logfmt(reason)}" if reason is not None else "")
                + (f" caller={_logfmt(caller)}" if caller is not None else "")
            )
        self._writer.append(line)

    def flush(self) -> None:
        self._writer.flush()
