"""Process logging: plain text or JSON lines, on stderr.

Records are formatted where they are logged and queued on the stderr sink, next to the
review lines (:mod:`authn_gateway.observe.logsink`): a log line never waits for its reader.
"""

from __future__ import annotations

import logging
import time

import orjson

from authn_gateway.observe.logsink import DEFAULT_CAPACITY, LogSink, sink_for


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


class SinkHandler(logging.Handler):
    """Queues formatted records on a sink; a full queue drops and counts them."""

    def __init__(self, sink: LogSink) -> None:
        super().__init__()
        self.sink = sink

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.sink.put(self.format(record), "process")
            # Process lines are rare and often looked for at once: no batching delay.
            self.sink.wake()
        except Exception:
            self.handleError(record)


class TextFormatter(logging.Formatter):
    """One record, one line: line breaks inside the message (a value from a client or
    an IdP) are escaped, so no value can forge a log line. Tracebacks stay as they are."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        line = super().formatMessage(record)
        if "\n" in line or "\r" in line:
            line = line.replace("\r", "\\r").replace("\n", "\\n")
        return line


def configure_logging(
    level: str = "info", fmt: str = "text", queue_lines: int = DEFAULT_CAPACITY
) -> None:
    handler: logging.Handler = SinkHandler(sink_for("stderr", queue_lines))
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
