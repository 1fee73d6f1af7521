"""The service account's connections: at most one per thread of the backend's pool,
reopened when stale (:class:`ServicePool`); closing one, whatever state it is in."""

from __future__ import annotations

import contextlib
import queue
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from ldap3 import Connection
from ldap3.core.exceptions import LDAPCommunicationError, LDAPException

T = TypeVar("T")


def no_delay(conn: Connection) -> None:
    # LDAP is small request/answer pairs. With Nagle's algorithm on, the first write
    # after a TLS handshake waits for the server's delayed ACK: 40 ms on every bind.
    with contextlib.suppress(OSError, AttributeError):
        conn.socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def close_quietly(conn: Connection | None) -> None:
    if conn is None:
        return
    # Unbind also closes the socket; a connection already gone has nothing to close.
    with contextlib.suppress(LDAPException, OSError):
        conn.unbind()


# --- the service-account pool -------------------------------------------------------


@dataclass
class _Slot:
    conn: Connection | None = None
    last_used: float = 0.0


class ServicePool:
    """At most ``size`` bound service-account connections, each used by one thread at
    a time (ldap3 connections are not thread-safe).

    Stale connections are replaced: one closed or idle past ``max_idle`` is reopened
    before use, and when a reused connection fails with a communication error (the
    server restarted, an idle timeout closed it) the operation runs once more on a
    fresh one. A timeout is not retried: the server is slow, and a retry doubles its load.
    """

    def __init__(
        self,
        open_bound: Callable[[], Connection],
        size: int,
        max_idle: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._open_bound = open_bound
        self._max_idle = max_idle
        self._clock = clock
        # LIFO: hot connections stay hot, cold ones age out and get replaced.
        self._slots: queue.LifoQueue[_Slot] = queue.LifoQueue()
        for _ in range(size):
            self._slots.put(_Slot())
        self._lock = threading.Lock()
        self.opened = 0

    def _open(self) -> Connection:
        conn = self._open_bound()
        with self._lock:
            self.opened += 1
        return conn

    def run(self, operation: Callable[[Connection], T]) -> T:
        # Never waits long: the executor has one thread per slot.
        slot = self._slots.get(timeout=60)
        conn = slot.conn
        try:
            if conn is not None and (
                conn.closed or self._clock() - slot.last_used > self._max_idle
            ):
                close_quietly(conn)
                conn = None
            reused = conn is not None
            if conn is None:
                conn = self._open()
            try:
                return operation(conn)
            except LDAPCommunicationError as exc:
                close_quietly(conn)
                conn = None
                if not reused or isinstance(exc, TimeoutError):
                    raise
            conn = self._open()
            return operation(conn)
        except LDAPException:
            close_quietly(conn)
            conn = None
            raise
        finally:
            self._slots.put(_Slot(conn, self._clock()))

    def close(self) -> None:
        while True:
            try:
                slot = self._slots.get_nowait()
            except queue.Empty:
                return
            close_quietly(slot.conn)
