"""One log line per review, cheap enough for the cache-hit path.

Formatting a stdlib ``logging`` record costs more than a cached review itself, so
review lines are rendered directly (text or JSON) and written in batches by the
event loop, at most every 100 ms. Lines carry a keyed-hash prefix of the token,
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


def _logfmt(value: Any) -> str:
    text = str(value)
    if " " in text or '"' in text or "=" in text:
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return text


class ReviewLog:
    def __init__(self, fmt: str = "text", stream: IO[str] | None = None) -> None:
        self._json = fmt == "json"
        self._stream = stream
        self._buffer: list[str] = []
        self._flush_scheduled = False

    def write(self, **fields: Any) -> None:
        if self._json:
            line = orjson.dumps({"time": round(time.time(), 3), "msg": "review", **fields}).decode()
        else:
            line = "review " + " ".join(
                f"{k}={_logfmt(v)}" for k, v in fields.items() if v is not None
            )
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
