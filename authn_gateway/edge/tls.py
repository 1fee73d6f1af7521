"""The review port's TLS: a server context rebuilt whenever its files change.

cert-manager (or any rotation) replaces the certificate, key and client-CA files
while the gateway runs. Each change builds a *new* SSLContext from the new files,
checked completely before it replaces the current one; every later handshake uses
it (see :mod:`authn_gateway.edge`, which runs handshakes with ``current()``), and
established connections keep the one they started with. A fresh context is what
lets a *removed* client CA stop being trusted: OpenSSL can add CAs to a live
context's store but never remove them. Nothing needs a restart and the listening
socket stays.

A failed reload never touches the current context: the old certificate and CAs stay
in use, the error is logged, and the next tick tries again.

The expiry time of the serving certificate and of each client CA is kept for the
``authn_gateway_tls_certificate_expiry_timestamp_seconds`` gauge.
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509

from authn_gateway.config import TLSSettings
from backends.files import CA_BUNDLE_BYTES, PEM_BYTES, FileRefused, read_file, shown
from backends.http import ssl_reason

log = logging.getLogger(__name__)

MIN_VERSIONS = {"1.2": ssl.TLSVersion.TLSv1_2, "1.3": ssl.TLSVersion.TLSv1_3}


@dataclass(frozen=True)
class CertificateExpiry:
    """One certificate's role ("serving" or "client_ca"), subject and notAfter."""

    role: str
    subject: str
    not_after: float


class TLSError(Exception):
    """A certificate, key or CA file that cannot be used; names the file, no key material."""


def _read(path: Path, what: str, limit: int = PEM_BYTES) -> bytes:
    try:
        return read_file(path, limit)
    except FileRefused as exc:
        raise TLSError(f"tls.{what}: {exc}") from None


def _load_pair(context: ssl.SSLContext, cert: bytes, key: bytes) -> None:
    # load_cert_chain only takes paths; the bytes go through a private temporary
    # directory so that what is checked is exactly what is loaded.
    with tempfile.TemporaryDirectory(prefix="authn-gateway-tls-") as tmp:
        cert_path, key_path = os.path.join(tmp, "tls.crt"), os.path.join(tmp, "tls.key")
        for path, data in ((cert_path, cert), (key_path, key)):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
        # Without a password callable OpenSSL asks for an encrypted key's passphrase on
        # the terminal: check-config would wait for a keystroke.
        context.load_cert_chain(cert_path, key_path, password=_no_passphrase)


def _no_passphrase() -> bytes:
    raise TLSError("the private key is encrypted (a passphrase is not supported)")


def _expiries(pem: bytes, role: str, path: Path, what: str) -> list[CertificateExpiry]:
    try:
        certs = x509.load_pem_x509_certificates(pem)
    except ValueError:
        raise TLSError(f"tls.{what}: {shown(path)}: holds no PEM certificate") from None
    return [
        CertificateExpiry(role, c.subject.rfc4514_string(), c.not_valid_after_utc.timestamp())
        for c in certs
    ]


class ServerTLS:
    """The current server context, plus the watcher that rebuilds it when files change."""

    def __init__(self, settings: TLSSettings, client_cert_optional: bool = False) -> None:
        self.settings = settings
        self.client_cert_optional = client_cert_optional
        self.expiries: list[CertificateExpiry] = []
        self._stamp = self._file_stamp()
        self.context = self._build()

    def current(self) -> ssl.SSLContext:
        """The context a new handshake uses."""
        return self.context

    def _paths(self) -> list[Path]:
        s = self.settings
        return [s.cert_file, s.key_file] + ([s.client_ca_file] if s.client_ca_file else [])

    def _file_stamp(self) -> tuple[tuple[int, int, int], ...]:
        stamps = []
        for path in self._paths():
            try:
                st = os.stat(path)
            except OSError:
                stamps.append((0, 0, 0))
                continue
            # Kubernetes secret volumes swap a symlink, which changes inode and mtime.
            stamps.append((st.st_mtime_ns, st.st_ino, st.st_size))
        return tuple(stamps)

    def _build(self) -> ssl.SSLContext:
        """A complete new context from the files as they are now, or TLSError."""
        s = self.settings
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = MIN_VERSIONS[s.min_version]
        # Only the HTTP/1.1 stack is served; say so in ALPN so clients do not try h2.
        context.set_alpn_protocols(["http/1.1"])
        cert = _read(s.cert_file, "cert_file")
        key = _read(s.key_file, "key_file")
        expiries = _expiries(cert, "serving", s.cert_file, "cert_file")[:1]
        try:
            _load_pair(context, cert, key)
        except TLSError as exc:
            raise TLSError(f"tls.key_file: {shown(s.key_file)}: {exc}") from None
        except ssl.SSLError as exc:
            raise TLSError(
                f"tls: {shown(s.cert_file)} and {shown(s.key_file)} are not a "
                f"matching PEM certificate and key ({ssl_reason(exc)})"
            ) from None
        if s.client_ca_file is not None:
            ca = _read(s.client_ca_file, "client_ca_file", CA_BUNDLE_BYTES)
            try:
                # ssl takes PEM as ASCII text; past ASCII can only be in comments.
                context.load_verify_locations(cadata=ca.decode("ascii", "ignore"))
            except (ssl.SSLError, ValueError) as exc:
                raise TLSError(
                    f"tls.client_ca_file: {shown(s.client_ca_file)}: not a PEM CA bundle "
                    f"({ssl_reason(exc)})"
                ) from None
            expiries += _expiries(ca, "client_ca", s.client_ca_file, "client_ca_file")
            # Optional only when callers may use a bearer token instead; the review
            # endpoint then refuses callers that have neither (401).
            context.verify_mode = (
                ssl.CERT_OPTIONAL if self.client_cert_optional else ssl.CERT_REQUIRED
            )
        self.expiries = expiries
        return context

    def reload_if_changed(self) -> bool:
        """Rebuild when the files changed; a bad new set is logged and the old one kept."""
        stamp = self._file_stamp()
        if stamp == self._stamp:
            return False
        try:
            self.context = self._build()
        except TLSError as exc:
            # Half-written files during a rotation look like this too: retry next tick
            # (the stamp is not recorded), serving the old context meanwhile.
            log.error("TLS reload failed, still serving the previous certificate and CA: %s", exc)
            return False
        self._stamp = stamp
        log.info(
            "TLS certificate%s reloaded from %s",
            " and client CA" if self.settings.client_ca_file else "",
            ", ".join(str(p) for p in self._paths() if p != self.settings.key_file),
        )
        return True

    async def watch(self) -> None:
        while True:
            await asyncio.sleep(self.settings.reload_interval_seconds)
            self.reload_if_changed()


def _names(pairs: Iterable[Any], wanted: tuple[str, ...]) -> list[str]:
    return [str(value) for kind, value in pairs if kind in wanted]


def certificate_names(peercert: dict[str, Any] | None) -> tuple[str, ...]:
    """Common Names, then DNS and URI SANs, of a verified client certificate."""
    if not peercert:
        return ()
    names: list[str] = []
    for rdn in peercert.get("subject", ()):
        names += _names(rdn, ("commonName",))
    names += _names(peercert.get("subjectAltName", ()), ("DNS", "URI"))
    return tuple(names)
