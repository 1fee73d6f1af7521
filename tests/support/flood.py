"""Clients that pipeline requests and never read the answers, and what they cost a
server process: its RSS, when each flooding connection was closed, and how another
client's requests fared meanwhile (tests/perf/test_edge_bound.py, loadtests/pipeflood.py)."""

from __future__ import annotations

import selectors
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path


def rss_kib(pid: int) -> int:
    """The process's resident set (VmRSS), in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for {pid}")


@dataclass
class FloodResult:
    """What a flood saw: bytes sent, when each connection was closed (seconds from the
    start, None if it never was), the server's RSS (KiB) before and at its peak, and the
    other client's latencies (seconds) and failures."""

    sent: int = 0
    closed_after: list[float | None] = field(default_factory=list)
    rss_before: int = 0
    rss_peak: int = 0
    latencies: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    @property
    def growth_kib(self) -> int:
        return self.rss_peak - self.rss_before

    def summary(self) -> str:
        closed = [c for c in self.closed_after if c is not None]
        latest = max(self.latencies, default=0.0)
        return (
            f"sent {self.sent / 2**20:.1f} MiB on {len(self.closed_after)} connections; "
            f"{len(closed)} closed by the server"
            + (f" after {min(closed):.1f}-{max(closed):.1f} s" if closed else "")
            + f"; RSS {self.rss_before / 1024:.1f} -> peak {self.rss_peak / 1024:.1f} MiB "
            f"(+{self.growth_kib} KiB, {self.growth_kib / max(1, len(self.closed_after)):.1f}"
            f" KiB per connection); other client: {len(self.latencies)} answered, "
            f"slowest {latest * 1000:.0f} ms, {len(self.failures)} failed"
        )


def flood(
    port: int,
    request: bytes,
    pid: int,
    seconds: float,
    connections: int = 1,
    other: Callable[[], None] | None = None,
    settle: float = 1.0,
    receive_buffer: int | None = None,
) -> FloodResult:
    """Pipeline ``request`` over ``connections`` connections to 127.0.0.1:``port`` for
    ``seconds``, never reading; meanwhile sample ``pid``'s RSS and, when given, call
    ``other`` (another client's request, which raises on a wrong answer) in a loop.
    Sending stops at the deadline; the RSS is sampled ``settle`` seconds longer.
    ``receive_buffer`` (SO_RCVBUF of the flooding sockets) makes the server's unsent
    answers back up sooner: the kernel's buffers hold megabytes before they do."""
    result = FloodResult(rss_before=rss_kib(pid))
    result.rss_peak = result.rss_before
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.1):
            result.rss_peak = max(result.rss_peak, rss_kib(pid))

    def other_client() -> None:
        assert other is not None
        while not stop.is_set():
            started = time.monotonic()
            try:
                other()
            except Exception as exc:
                result.failures.append(f"{type(exc).__name__}: {exc}")
                time.sleep(0.05)
                continue
            result.latencies.append(time.monotonic() - started)
            time.sleep(0.01)

    threads = [threading.Thread(target=sample, daemon=True)]
    if other is not None:
        threads.append(threading.Thread(target=other_client, daemon=True))
    for t in threads:
        t.start()
    blob = request * max(1, 65536 // len(request))
    socks: dict[socket.socket, int] = {}
    selector = selectors.DefaultSelector()
    for i in range(connections):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if receive_buffer is not None:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
        s.connect(("127.0.0.1", port))
        s.setblocking(False)
        socks[s] = i
        selector.register(s, selectors.EVENT_WRITE)
    offsets = dict.fromkeys(socks, 0)
    result.closed_after = [None] * connections
    started = time.monotonic()
    try:
        while socks and time.monotonic() - started < seconds:
            for key, _ in selector.select(timeout=0.05):
                s = key.fileobj
                assert isinstance(s, socket.socket)
                offset = offsets[s]
                try:
                    n = s.send(blob[offset:] if offset else blob)
                except BlockingIOError:
                    continue
                except OSError:  # reset by the server: it closed this connection
                    result.closed_after[socks.pop(s)] = time.monotonic() - started
                    selector.unregister(s)
                    s.close()
                    continue
                result.sent += n
                offsets[s] = (offset + n) % len(blob)
        # Connections whose send buffer stayed full never saw the reset: look once more.
        for s, i in socks.items():
            if _reset(s):
                result.closed_after[i] = time.monotonic() - started
        time.sleep(settle)
    finally:
        stop.set()
        for t in threads:
            t.join(10)
        selector.close()
        for s in socks:
            s.close()
    return result


def _reset(sock: socket.socket) -> bool:
    """Whether the peer reset or closed ``sock`` (its unread answers are dropped)."""
    try:
        while sock.recv(1 << 20):
            pass
        return True  # an orderly end of stream
    except BlockingIOError:
        return False
    except OSError:
        return True
