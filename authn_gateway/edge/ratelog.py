"""A log that says a thing once per interval, and how often it held it back."""

from __future__ import annotations

import logging
import time
from typing import Any


class RateLimitedLog:
    """At most one line per key per interval; the next line says how many were held back."""

    def __init__(self, logger: logging.Logger, interval: float = 10.0) -> None:
        self.logger = logger
        self.interval = interval
        self._last: dict[str, float] = {}
        self._held: dict[str, int] = {}

    def warning(self, key: str, msg: str, *args: Any) -> None:
        now = time.monotonic()
        last = self._last.get(key)
        if last is not None and now - last < self.interval:
            self._held[key] = self._held.get(key, 0) + 1
            return
        self._last[key] = now
        held = self._held.pop(key, 0)
        if held:
            msg += " (and %d more like it in the last %.0f s)"
            args = (*args, held, now - last if last is not None else self.interval)
        self.logger.warning(msg, *args)
