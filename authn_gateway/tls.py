"""The review port's TLS: one SSLContext for the server's life, reloaded in place.

cert-manager (or any rotation) replaces the certificate and key files while the
gateway runs. Calling ``load_cert_chain`` again on the *same* context makes every
later handshake use the new pair; established connections keep the old one until
they close. Nothing needs a restart and uvicorn keeps its listening socket.

A failed reload must never leave the live context half-updated (OpenSSL drops the
certificate when a mismatched key is loaded after it), so a new pair is read once,
checked on a throwaway context, and only then loaded into the live one, from the
same bytes.
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .config import TLSSettings

log = logging.getLogger(__name__)

MIN_VERSIONS = {"1.2": ssl.TLSVersion.TLSv1_2, "1.3": ssl.TLSVersion.TLSv1_3}


class TLSError(Exception):
    """A certificate, key or CA file that cannot be used; names the file, no key material."""


def _read(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise TLSError(f"tls.{what}: cannot read {path}: {exc.strerror}") from None


def _load_pair(context: ssl.SSLContext, cert: bytes, key: bytes) -> None:
    # load_cert_chain only takes paths; the bytes go through a private temporary
    # directory so that what is checked is exactly what is loaded.
    with tempfile.TemporaryDirectory(prefix="authn-gateway-tls-") as tmp:
        cert_path, key_path = os.path.join(tmp, "tls.crt"), os.path.join(tmp, "tls.key")
        for path, data in ((cert_path, cert), (key_path, key)):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
        context.load_cert_chain(cert_path, key_path)


class ServerTLS:
    """The server context plus the watcher that keeps its certificate current."""

    def __init__(self, settings: TLSSettings, client_cert_optional: bool = False) -> None:
        self.settings = settings
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.minimum_version = MIN_VERSIONS[settings.min_version]
        # Only the HTTP/1.1 stack is served; say so in ALPN so clients do not try h2.
        self.context.set_alpn_protocols(["http/1.1"])
        if settings.client_ca_file is not None:
            ca = _read(settings.client_ca_file, "client_ca_file").decode("ascii", "replace")
            try:
                self.context.load_verify_locations(cadata=ca)
            except (ssl.SSLError, ValueError) as exc:
                raise TLSError(
                    f"tls.client_ca_file: {settings.client_ca_file} is not a PEM CA bundle "
                    f"({exc.__class__.__name__})"
                ) from None
            # Optional only when callers may use a bearer token instead; the review
            # endpoint then refuses callers that have neither (401).
            self.context.verify_mode = (
                ssl.CERT_OPTIONAL if client_cert_optional else ssl.CERT_REQUIRED
            )
        self._stamp = self._file_stamp()
        self._load(initial=True)

    def _file_stamp(self) -> tuple[tuple[int, int, int], ...]:
        stamps = []
        for path in (self.settings.cert_file, self.settings.key_file):
            try:
                st = os.stat(path)
            except OSError:
                stamps.append((0, 0, 0))
                continue
            # Kubernetes secret volumes swap a symlink, which changes inode and mtime.
            stamps.append((st.st_mtime_ns, st.st_ino, st.st_size))
        return tuple(stamps)

    def _load(self, initial: bool = False) -> None:
        cert = _read(self.settings.cert_file, "cert_file")
        key = _read(self.settings.key_file, "key_file")
        try:
            _load_pair(ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER), cert, key)
        except ssl.SSLError as exc:
            raise TLSError(
                f"tls: {self.settings.cert_file} and {self.settings.key_file} are not a "
                f"matching PEM certificate and key ({exc.reason or exc.__class__.__name__})"
            ) from None
        _load_pair(self.context, cert, key)
        if not initial:
            log.info("TLS certificate reloaded from %s", self.settings.cert_file)

    def reload_if_changed(self) -> bool:
        """Reload when the files changed; a bad new pair is logged and the old one kept."""
        stamp = self._file_stamp()
        if stamp == self._stamp:
            return False
        try:
            self._load()
        except TLSError as exc:
            # Half-written files during a rotation look like this too: retry next tick
            # (the stamp is not recorded), serving the old certificate meanwhile.
            log.error("TLS reload failed, still serving the previous certificate: %s", exc)
            return False
        self._stamp = stamp
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
