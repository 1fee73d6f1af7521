"""Log lines leave the event loop through a bounded queue, written by a thread.

A log reader that stops reading (a full pipe, a stuck log agent, a slow disk) blocks
whoever writes to it. Reviews must never wait for logs, so every log line (review,
audit and process lines) is put on a :class:`LogSink`'s queue, which only appends or,
when full, drops the line and counts it. One thread per destination does the writing,
to its own duplicate of the file descriptor, so a write blocked in that thread holds
no lock the event loop or the interpreter's exit needs.

Sinks are shared per destination ("stderr", "stdout" or a file path) for the life of
the process, so a config reload keeps the same queue and its counts.
"""

from __future__ import annotations

import atexit
import io
import os
import sys
import threading
from collections import deque
from typing import IO

# How often the writer thread wakes to write what has queued up: batches keep the
# number of write calls small (one per interval) at any review rate.
FLUSH_INTERVAL = 0.1
DEFAULT_CAPACITY = 10_000
# On exit, how long queued lines may take to go out before they are abandoned.
EXIT_PATIENCE = 2.0


class LogSink:
    """A bounded queue of lines for one destination, emptied by a writer thread."""

    def __init__(
        self,
        destination: str,
        capacity: int = DEFAULT_CAPACITY,
        stream: IO[str] | None = None,
        interval: float = FLUSH_INTERVAL,
    ) -> None:
        self.destination = destination
        self.capacity = capacity
        # Lines dropped because the queue was full, by log name ("review", "audit", ...).
        self.dropped: dict[str, int] = {}
        self._lines: deque[str] = deque()
        self._fd = -1
        if stream is None:
            try:
                self._fd = _open(destination)
            except io.UnsupportedOperation:
                # A std stream replaced by one without a descriptor (a test harness).
                stream = sys.stdout if destination == "stdout" else sys.stderr
        self._stream = stream
        self._interval = interval
        self._wake = threading.Event()
        self._idle = threading.Event()
        self._idle.set()
        self._closing = False
        self._thread = threading.Thread(
            target=self._run, name=f"log-writer-{destination}", daemon=True
        )
        self._thread.start()

    def put(self, line: str, log: str) -> None:
        """Queue one line (without its newline); never waits. Runs on every review."""
        if len(self._lines) >= self.capacity:
            self.dropped[log] = self.dropped.get(log, 0) + 1
            return
        self._lines.append(line)

    def queued(self) -> int:
        return len(self._lines)

    def wake(self) -> None:
        """Have the writer write what is queued now rather than at its next interval."""
        self._wake.set()

    def flush(self, timeout: float) -> bool:
        """Wake the writer and wait up to ``timeout`` for the queue to be written.
        For tests and exit only: the event loop never calls it."""
        self._idle.clear()
        self._wake.set()
        return self._idle.wait(timeout) and not self._lines

    def close(self, timeout: float = EXIT_PATIENCE) -> None:
        self._closing = True
        self._wake.set()
        self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            self._wake.wait(self._interval)
            self._wake.clear()
            self._write_queued()
            self._idle.set()
            if self._closing:
                return

    def _write_queued(self) -> None:
        lines = self._lines
        while lines:
            batch = [lines.popleft() for _ in range(min(len(lines), 4096))]
            text = "\n".join(batch) + "\n"
            try:
                if self._stream is not None:
                    self._stream.write(text)
                    self._stream.flush()
                else:
                    _write_all(self._fd, text.encode("utf-8", "replace"))
            except (OSError, ValueError):
                pass  # a closed log stream must not stop the writer, nor fail reviews


def _open(destination: str) -> int:
    if destination == "stderr":
        return os.dup(sys.stderr.fileno())
    if destination == "stdout":
        return os.dup(sys.stdout.fileno())
    # A FIFO (a log agent's) with no reader yet would block the open, and the start,
    # until one comes: O_NONBLOCK makes it an error at once (ENXIO). Writes then block
    # again, in the writer thread only.
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
    fd = os.open(destination, flags, 0o640)
    os.set_blocking(fd, True)
    return fd


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


_sinks: dict[str, LogSink] = {}
_lock = threading.Lock()


def sink_for(destination: str, capacity: int = DEFAULT_CAPACITY) -> LogSink:
    """The process's sink for ``destination`` ("-" means stdout); its queue bound is
    set to ``capacity``. A file that cannot be opened raises OSError."""
    key = "stdout" if destination == "-" else destination
    with _lock:
        sink = _sinks.get(key)
        if sink is None:
            sink = _sinks[key] = LogSink(key, capacity)
        sink.capacity = capacity
        return sink


def all_sinks() -> list[LogSink]:
    with _lock:
        return list(_sinks.values())


@atexit.register
def _close_all() -> None:
    # Bounded: a reader that never reads again must not keep the process alive.
    for sink in all_sinks():
        sink.close(EXIT_PATIENCE)
