"""The edge's protocol in process, over the real parser and loop: a transport that
records what the protocol asks of it, requests as bytes, and a way to run a test on
both loops the gateway may run on (tests/unit/test_edge_batching.py, test_edge_intake.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

import uvloop


def post(body: bytes, *headers: bytes) -> bytes:
    head = b"POST /authenticate HTTP/1.1\r\nhost: gw\r\ncontent-length: %d\r\n" % len(body)
    return head + b"".join(h + b"\r\n" for h in headers) + b"\r\n" + body


class RecordingTransport:
    """What the protocol asks of its transport, in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, bytes]] = []
        self.closing = False

    def write(self, data: bytes) -> None:
        self.calls.append(("write", bytes(data)))

    def write_eof(self) -> None:
        self.calls.append(("write_eof", b""))

    def close(self) -> None:
        self.closing = True
        self.calls.append(("close", b""))

    def abort(self) -> None:
        self.closing = True
        self.calls.append(("abort", b""))

    def is_closing(self) -> bool:
        return self.closing

    def can_write_eof(self) -> bool:
        return True

    def get_write_buffer_size(self) -> int:
        return 0

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 8080), "peername": ("127.0.0.1", 40000)}.get(
            name, default
        )

    def pause_reading(self) -> None: ...
    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None: ...
    def set_protocol(self, protocol: Any) -> None: ...
    def resume_reading(self) -> None: ...

    def writes(self) -> list[bytes]:
        return [data for call, data in self.calls if call == "write"]


async def turns(n: int = 5) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


LOOPS: list[Callable[[], asyncio.AbstractEventLoop]] = [
    asyncio.new_event_loop,
    uvloop.new_event_loop,
]


def run(
    loop_factory: Callable[[], asyncio.AbstractEventLoop], main: Coroutine[Any, Any, None]
) -> None:
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        runner.run(main)
