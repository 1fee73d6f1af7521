"""One log line per review, cheap enough for the cache-hit path.

Formatting a stdlib ``logging`` record costs more than a cached review itself, so
review lines are rendered directly (logfmt text or JSON) and queued for a writer
thread (:mod:`authn_gateway.observe.logsink`): a log reader that stops reading costs dropped,
counted lines, never a waiting review. Unavailable answers are summarised per backend
and reason (:class:`OutageSummary`). Lines carry a keyed-hash prefix of the token,
never the token.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable
from typing import IO, Any

import orjson

from authn_gateway.observe.logsink import DEFAULT_CAPACITY, LogSink, sink_for

# Anything that could end a line or start a fake field must be quoted and escaped.
_NEEDS_QUOTES = re.compile(r'[\s"=\\\x00-\x1f\x7f\u0085\u2028\u2029]')
_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"}
_TO_ESCAPE = re.compile(r'["\\\x00-\x1f\x7f\u0085\u2028\u2029]')


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    return _ESCAPES.get(char) or f"\\u{ord(char):04x}"


def _quoted(text: str) -> str:
    if not text:
        return '""'
    if _NEEDS_QUOTES.search(text) is None:
        return text
    return '"' + _TO_ESCAPE.sub(_escape, text) + '"'


# User names and callers repeat from line to line: each is quoted once, then looked up
# (a regex search per value was a tenth of a cache hit's log line). Bounded: cleared
# when full. Only names and callers go in, never a token; reasons are quoted as they
# come, so that a run of distinct ones cannot keep clearing it.
_QUOTED: dict[str, str] = {}
_QUOTED_MAX = 4096


def _logfmt(text: str) -> str:
    """A logfmt value, quoted and escaped when it holds anything but plain characters,
    so that a value (a user name from an IdP) can never end the line or add a field."""
    known = _QUOTED.get(text)
    if known is None:
        if len(_QUOTED) >= _QUOTED_MAX:
            _QUOTED.clear()
        known = _QUOTED[text] = _quoted(text)
    return known


_second = -1
_second_text = ""
_stamp_ms = -1
_stamp = ""


def _utc_now() -> str:
    """RFC 3339 UTC time with milliseconds, formatted once a millisecond (the date part
    once a second): at thousands of reviews a second most lines share a millisecond."""
    global _second, _second_text, _stamp_ms, _stamp
    now_ms = int(time.time() * 1000)
    if now_ms != _stamp_ms:
        second, ms = divmod(now_ms, 1000)
        if second != _second:
            _second = second
            _second_text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        _stamp_ms, _stamp = now_ms, f"{_second_text}.{ms:03d}Z"
    return _stamp


class OutageSummary:
    """Unavailable answers, by backend and reason: the first in each window is logged
    in full, the rest are counted and logged as one line when the window ends.

    During an outage every review that cannot be served stale says the same thing;
    at hundreds of reviews a second those lines would be most of the log.
    """

    # Reasons come from the backends' own classification, so they are few; past this
    # many distinct ones in a window, lines are logged in full rather than tracked.
    MAX_KEYS = 1000

    def __init__(self, seconds: float, emit: Callable[[str, str, int, float], None]) -> None:
        self.seconds = seconds
        self._emit = emit
        self._counts: dict[tuple[str, str], int] = {}
        self._window_open = False

    def admit(self, backend: str, reason: str) -> bool:
        """True: log this answer in full. False: it was counted for the summary."""
        key = (backend, reason)
        count = self._counts.get(key)
        if count is not None:
            self._counts[key] = count + 1
            return False
        if self.seconds <= 0 or len(self._counts) >= self.MAX_KEYS:
            return True
        if not self._window_open:
            try:
                asyncio.get_running_loop().call_later(self.seconds, self.end_window)
            except RuntimeError:
                return True  # no event loop to end the window: log every line
            self._window_open = True
        self._counts[key] = 0
        return True

    def end_window(self) -> None:
        self._window_open = False
        counts, self._counts = self._counts, {}
        for (backend, reason), count in counts.items():
            if count:
                self._emit(backend, reason, count, self.seconds)


class ReviewLog:
    """The review line: logfmt text or a JSON object."""

    def __init__(
        self,
        fmt: str = "text",
        stream: IO[str] | None = None,
        *,
        queue_lines: int = DEFAULT_CAPACITY,
        summary_seconds: float = 1.0,
    ) -> None:
        self._json = fmt == "json"
        # stderr, shared with the process log; a stream of its own in tests.
        self.sink = (
            LogSink("stream", queue_lines, stream) if stream is not None else sink_for("stderr")
        )
        if stream is None:
            self.sink.capacity = queue_lines
        self.outages = OutageSummary(summary_seconds, self._write_summary)

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
        cluster: str | None = None,
    ) -> None:
        """Queue one review line; fields with no value are left out (``cluster`` is
        given only when clusters are configured)."""
        if answer == "unavailable" and not self.outages.admit(backend, reason or ""):
            return
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
            for key, value in (
                ("user", user),
                ("reason", reason),
                ("caller", caller),
                ("cluster", cluster),
            ):
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
                + (f" reason={_quoted(reason)}" if reason is not None else "")
                + (f" caller={_logfmt(caller)}" if caller is not None else "")
                + (f" cluster={cluster}" if cluster is not None else "")
            )
        self.sink.put(line, "review")

    def _write_summary(self, backend: str, reason: str, count: int, seconds: float) -> None:
        if self._json:
            doc = {
                "time": round(time.time(), 3),
                "msg": "review_summary",
                "answer": "unavailable",
                "backend": backend,
                "reason": reason,
                "count": count,
                "seconds": seconds,
            }
            line = orjson.dumps(doc).decode()
        else:
            line = (
                f"time={_utc_now()} level=info msg=review_summary answer=unavailable "
                f"backend={backend} reason={_quoted(reason)} count={count} seconds={seconds:g}"
            )
        self.sink.put(line, "review")

    def flush(self) -> None:
        """Log the open window's summaries and wake the writer; never waits for it."""
        self.outages.end_window()
        self.sink.wake()
