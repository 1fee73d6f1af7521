"""One log line per review, cheap enough for the cache-hit path.

Formatting a stdlib ``logging`` record costs more than a cached review itself, so
review lines are rendered directly (logfmt text or JSON) and written in batches by
the event loop, at most every 100 ms. Lines carry a keyed-hash prefix of the token,
never the token.
"""

from __future__ import annotations

import asyncio
import sys
import time
from typing import IO, Any

import orjson

FLUSH_INTERVAL = 0.1
MAX_BUFFERED = 512


def _logfmt(text: str) -> str:
    """A logfmt value: quoted when it holds spaces, quotes or equals signs."""
    if " " in text or '"' in text or "=" in text:
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return text


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
                f"review token={token} answer={answer} backend={backend} ms={ms} cached={cached}"
                + (" stale=True" if stale else "")
                + (f" user={_logfmt(user)}" if user is not None else "")
                + (f" reason={_logfmt(reason)}" if reason is not None else "")
                + (f" caller={_logfmt(caller)}" if caller is not None else "")
            )
        self._writer.append(line)

    def flush(self) -> None:
        self._writer.flush()
