"""One answer per request on a pooled IdP connection (issue 29, finding 3).

HTTP/1.1 has no request ids: an answer belongs to a request only by its place on the
connection. aiohttp's pool reuses a connection after checking only that it is open, and
its protocol parses whatever arrives while the connection sits idle into a queued answer.
One extra response from a buggy IdP or proxy then becomes the next request's answer,
and every later request on that connection gets the previous one's: another user's
identity, cached. An extra response appended to a correct one is queued the same way,
because aiohttp hands the connection back to the pool from inside the parser, at the
end of the first answer's body, before the rest of that read is parsed. (httpx's own
transport, httpcore with h11, keeps bytes read past an answer for the next request too:
docs/decisions.md, "An IdP answer belongs to exactly one request".)

:class:`OneAnswerHandler` is aiohttp's protocol for one connection with the rule put
back: a connection is fit for another request only when its last answer arrived whole
and nothing came after it. A byte while no request is waiting, a second final answer to
one request, or the start of one after the answer's end in the same read, and the
connection is closed at once, so the pool never hands it out again. An answer that did
not end (a timeout, a cancelled request, a body left unread) closes it too.

What no HTTP/1.1 client can tell: a stray response still in flight at the moment a
request is written arrives after it, and is that request's answer. The real answer
then comes after the end of it, which closes the connection: the shift stops at one.

This subclasses aiohttp's ``ResponseHandler`` and sets the connector's protocol factory
(``TCPConnector._factory``), neither of which is aiohttp's public API; it also reads the
parser the handler holds. It is pinned to the aiohttp releases it is tested with
(:data:`TESTED_AIOHTTP_MINORS`, pyproject.toml): ``tests/unit/test_wire_one_answer.py`` fails
on any other, the wire logs a warning on one, and where the hooks are missing the wire
falls back to a connection per request (:func:`guarded_connector`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from importlib.metadata import version
from typing import Any

import aiohttp
from aiohttp import client_proto
from aiohttp.client_proto import ResponseHandler
from aiohttp.streams import EMPTY_PAYLOAD

log = logging.getLogger(__name__)

#: Minor versions ("3.14") every wire test has passed on. Add one only with a full run
#: of tests/{process,unit}/test_wire.py and tests/unit/test_wire_one_answer.py on it.
TESTED_AIOHTTP_MINORS = ("3.14",)


def aiohttp_minor(installed: str | None = None) -> str:
    """The installed aiohttp's ``major.minor``."""
    major, minor, *_ = (installed or version("aiohttp")).split(".")
    return f"{major}.{minor}"


def untested_aiohttp(installed: str | None = None) -> str | None:
    """The installed aiohttp's version when it is not one the wire is tested with."""
    full = installed or version("aiohttp")
    return None if aiohttp_minor(full) in TESTED_AIOHTTP_MINORS else full


def c_parser() -> bool:
    """Whether aiohttp parses answers with its C parser (llhttp), whose ``feed_eof``
    tells a begun message; the pure-Python one (AIOHTTP_NO_EXTENSIONS) does not."""
    parser: type = getattr(client_proto, "HttpResponseParser", object)
    return parser.__module__ == "aiohttp._http_parser"


def _interim(status: int) -> bool:
    # 1xx answers (100 Continue, 103 Early Hints) come before the final one, which
    # aiohttp reads after them; 101 would switch protocols and is final.
    return 100 <= status < 200 and status != 101


class OneAnswerHandler(ResponseHandler):
    """aiohttp's protocol for one IdP connection, kept in step with its requests."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(loop)
        # A request went out (aiohttp sets the answer's parameters just before writing
        # it) and the end of its answer has not arrived.
        self._waiting = False
        self._final_seen = False
        #: Set once: the connection is out of step and is never used again.
        self.out_of_step = False

    @property
    def should_close(self) -> bool:
        # Read when the connection goes back to the pool: an answer that did not end
        # (timed out, cancelled, left unread) leaves the stream at an unknown place.
        return self.out_of_step or self._waiting or super().should_close

    def set_response_params(self, **params: Any) -> None:
        self._waiting = True
        self._final_seen = False
        super().set_response_params(**params)

    def data_received(self, data: bytes) -> None:
        if data and not self._waiting:
            # Nothing asked for these bytes: an idle pooled connection, or the read
            # after an answer's end. Not parsed, never anyone's answer.
            self._close_out_of_step(f"{len(data)} bytes while no request was waiting")
            return
        super().data_received(data)
        if self.out_of_step or (
            data and self._final_seen and not self._waiting and self._next_begun()
        ):
            self._close_out_of_step(f"more after the answer, in a read of {len(data)} bytes")

    def feed_data(self, data: Any, size: int = 0) -> None:
        # Each parsed answer head, with its body stream, on its way to the reader.
        message, payload = data
        if self._final_seen or not self._waiting:
            # A second answer to one request (or a 1xx after it): kept from every reader.
            self.out_of_step = True
            return
        if _interim(message.code):
            super().feed_data(data, size)
            return
        self._final_seen = True
        super().feed_data(data, size)
        if payload is EMPTY_PAYLOAD:
            self._answer_ended()
        else:
            # Before aiohttp's own callback, which hands the connection back to the
            # pool from inside the parser the moment the body ends.
            payload.on_eof(self._answer_ended)

    def _answer_ended(self) -> None:
        self._waiting = False

    def _next_begun(self) -> bool:
        """Whether the parser began another message after the answer's end in the same
        read (a partial one; a whole one came through :meth:`feed_data`)."""
        parser = self._parser
        if parser is None:
            return False
        try:
            # llhttp's parser returns the message begun and not completed, else None.
            return parser.feed_eof() is not None
        except Exception:  # it refuses a begun message it cannot complete
            return True

    def _close_out_of_step(self, what: str) -> None:
        self.out_of_step = True
        self.force_close()
        transport = self.transport
        if transport is None:  # closed already
            return
        peer = transport.get_extra_info("peername") or ("?", 0)
        log.warning("IdP connection to %s:%s sent %s; closed, never reused", peer[0], peer[1], what)
        self.close()


def _one_request_each(options: dict[str, Any]) -> dict[str, Any]:
    return {**options, "force_close": True, "keepalive_timeout": None}


def guarded_connector(**options: Any) -> aiohttp.TCPConnector:
    """A ``TCPConnector`` whose connections are :class:`OneAnswerHandler`; one that
    closes every connection after its request when the hooks are not there."""
    if not c_parser():
        log.warning(
            "aiohttp runs without its C parser: every IdP request takes a connection of "
            "its own (the pool cannot prove a connection clean)"
        )
        return aiohttp.TCPConnector(**_one_request_each(options))
    connector = aiohttp.TCPConnector(**options)
    factory = getattr(connector, "_factory", None)
    if not isinstance(factory, functools.partial) or factory.func is not ResponseHandler:
        log.warning(
            "aiohttp %s builds connections differently: every IdP request takes a "
            "connection of its own",
            version("aiohttp"),
        )
        # Nothing was connected through the first one: dropped, it leaves nothing open.
        return aiohttp.TCPConnector(**_one_request_each(options))
    # A subclass of what the partial made before, with the same arguments.
    connector._factory = functools.partial(  # type: ignore[assignment]
        OneAnswerHandler, loop=factory.keywords["loop"]
    )
    return connector
