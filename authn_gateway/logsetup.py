"""Process logging: plain text or JSON lines, on stderr."""

from __future__ import annotations

import logging
import sys
import time

import orjson


class JSONFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc = {
            "time": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(doc).decode()


class TextFormatter(logging.Formatter):
    """One record, one line: line breaks inside the message (a value from a client or
    an IdP) are escaped, so no value can forge a log line. Tracebacks stay as they are."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        line = super().formatMessage(record)
        if "\n" in line or "\r" in line:
            line = line.replace("\r", "\\r").replace("\n", "\\n")
        return line


def configure_logging(level: str = "info", fmt: str = "text") -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JSONFormatter())
    else:
        formatter = TextFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
        formatter.converter = time.gmtime
        handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # httpx logs every request line at INFO, with URLs; keep it quiet.
    logging.getLogger("httpx").setLevel(logging.WARNING)
