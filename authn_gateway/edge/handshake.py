"""TLS handshake failures, classified for metric labels and logs.

The label set is fixed (labels must not grow with what clients send); the detail that
goes to the log is OpenSSL's own words.
"""

from __future__ import annotations

import asyncio
import ssl
from asyncio import sslproto
from collections.abc import Callable

from authn_gateway.edge.intake import WRITE_HIGH_WATER

# OpenSSL's reason for a failed handshake, as a Prometheus label value.
_HANDSHAKE_REASONS = {
    "CERTIFICATE_VERIFY_FAILED": "bad_client_certificate",
    "PEER_DID_NOT_RETURN_A_CERTIFICATE": "no_client_certificate",
    "UNSUPPORTED_PROTOCOL": "protocol_version",
    "TLSV1_ALERT_PROTOCOL_VERSION": "protocol_version",
    "WRONG_VERSION_NUMBER": "not_tls",
    "HTTP_REQUEST": "not_tls",
    "HTTPS_PROXY_REQUEST": "not_tls",
    "NO_SHARED_CIPHER": "no_shared_cipher",
    "TLSV1_ALERT_UNKNOWN_CA": "client_refused_server_certificate",
    "SSLV3_ALERT_BAD_CERTIFICATE": "client_refused_server_certificate",
    "SSLV3_ALERT_CERTIFICATE_UNKNOWN": "client_refused_server_certificate",
    "TLSV1_ALERT_DECRYPT_ERROR": "client_refused_server_certificate",
}
HANDSHAKE_REASONS = (*sorted(set(_HANDSHAKE_REASONS.values())), "timeout", "closed", "other")
# Counted, not logged: a TCP probe or port scan opens and closes without a handshake.
QUIET_REASONS = frozenset({"closed"})


def handshake_reason(exc: BaseException) -> tuple[str, str]:
    """(label, detail) for a failed handshake; the detail is OpenSSL's own words."""
    if isinstance(exc, TimeoutError | asyncio.TimeoutError):
        return "timeout", "no complete handshake in time"
    if isinstance(exc, ssl.SSLError):
        reason = str(exc.reason or exc.__class__.__name__)
        verify = getattr(exc, "verify_message", None)
        return _HANDSHAKE_REASONS.get(reason, "other"), f"{reason}: {verify}" if verify else reason
    if isinstance(exc, ConnectionError | OSError):
        return "closed", "connection closed during the handshake"
    return "other", exc.__class__.__name__


class _EdgeSSLProtocol(sslproto.SSLProtocol):
    # asyncio's reads TLS bytes into a buffer of this size made for each connection:
    # 256 KiB of RSS each, busy or idle (measured: 636 KiB per flooding TLS connection,
    # against 40-60 for a plain one). A read needs no more than a TLS record (16 KiB);
    # the bytes go on to the TLS object's own buffer.
    max_size = 16 * 1024


def wrap_tls(
    loop: asyncio.AbstractEventLoop,
    protocol: asyncio.BaseProtocol,
    transport: asyncio.Transport,
    context: ssl.SSLContext,
    timeout: float,
    on_failure: Callable[[BaseException], None],
) -> None:
    """Run the server side of a TLS handshake on ``transport`` before any byte is read;
    ``protocol`` gets ``connection_made`` with the TLS transport once it is complete.

    What loop.start_tls does, but before any byte is read (uvloop's start_tls loses a
    handshake now and then when the ClientHello is already there), and with the
    handshake's outcome in our hands. asyncio's SSLProtocol runs on uvloop."""
    handshake = loop.create_future()

    def done(future: asyncio.Future[None]) -> None:
        exc = None if future.cancelled() else future.exception()
        if exc is not None:
            on_failure(exc)

    handshake.add_done_callback(done)
    # The encrypted answers waiting in the socket's transport count against the bound
    # too (intake.py): its mark, not uvloop's 64 KiB.
    transport.set_write_buffer_limits(high=WRITE_HIGH_WATER)
    tls = _EdgeSSLProtocol(
        loop,
        protocol,
        context,
        handshake,
        server_side=True,
        ssl_handshake_timeout=timeout,  # type: ignore[arg-type]
    )
    transport.set_protocol(tls)
    tls.connection_made(transport)
