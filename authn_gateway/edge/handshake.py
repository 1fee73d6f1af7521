"""TLS handshake failures, classified for metric labels and logs.

The label set is fixed (labels must not grow with what clients send); the detail that
goes to the log is OpenSSL's own words.
"""

from __future__ import annotations

import asyncio
import ssl

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
