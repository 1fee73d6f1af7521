"""Connections to the directory and their binds, each made on a thread of the backend's
pool: a user's, to check a password, and the service account's, for the pool."""

from __future__ import annotations

import math
import ssl

from ldap3 import IP_SYSTEM_DEFAULT, NONE, SIMPLE, SYNC, Connection, Server, Tls
from ldap3.core.exceptions import LDAPSASLPrepError

from backends.base import Rejected, Unavailable
from backends.http import ca_bundle
from backends.ldap.failures import USER_REFUSALS, Done, result_failure
from backends.ldap.pool import close_quietly, no_delay
from backends.ldap.settings import LDAPSettings
from backends.ldap.token import SASLPREP_REFUSAL


class Binder:
    """Opens connections to one directory (TLS as configured) and binds them."""

    def __init__(self, settings: LDAPSettings) -> None:
        self._s = settings
        tls = settings.tls
        self._tls = Tls(
            validate=ssl.CERT_REQUIRED if tls.verify else ssl.CERT_NONE,
            # Read once, bounded, here: ldap3 would read the file again at every
            # connection, a FIFO or /dev/zero put in its place hanging the thread.
            ca_certs_data=ca_bundle(tls.ca_file) if tls.ca_file else None,
        )
        self._connect_timeout = settings.timeouts.connect_seconds
        # ldap3 also sets SO_RCVTIMEO from this, packed as an integer: whole seconds only.
        # The review deadline (total_seconds) still cuts a slow call short.
        self.read_timeout = max(1, math.ceil(settings.timeouts.read_seconds))

    def connection(self, dn: str, password: str) -> Connection:
        # A Server per connection: ldap3 keeps the current address and a 5 s "address
        # unavailable" mark on the Server, shared by every connection made from it, so
        # one thread's close or failure would fail another thread's open.
        server = Server(
            self._s.url,
            use_ssl=self._s.url.startswith("ldaps://"),
            tls=self._tls,
            get_info=NONE,
            connect_timeout=self._connect_timeout,
            mode=IP_SYSTEM_DEFAULT,
        )
        return Connection(
            server,
            user=dn,
            password=password,
            authentication=SIMPLE,
            client_strategy=SYNC,
            receive_timeout=self.read_timeout,
            raise_exceptions=False,
            read_only=True,
            auto_referrals=False,
        )

    def bound(self, dn: str, password: str, *, user: bool) -> Connection:
        """An open connection, TLS started, bound as ``dn``; raises Done when refused."""
        if not password:
            # Belt and braces: parse_token already refused it. Never an unauthenticated bind.
            raise Done(Rejected("empty password"))
        conn = self.connection(dn, password)
        try:
            conn.open()
            no_delay(conn)
            if self._s.start_tls:
                conn.start_tls()
            if conn.bind():
                return conn
            result = conn.result
        except LDAPSASLPrepError:
            # ldap3 checks the password as it builds the bind request: the password
            # can never be valid, which says nothing about the server.
            close_quietly(conn)
            if user:
                raise Done(SASLPREP_REFUSAL) from None
            raise Done(
                Unavailable("service account password fails SASLprep", misconfigured=True)
            ) from None
        except BaseException:
            close_quietly(conn)
            raise
        close_quietly(conn)
        if user and result.get("result") in USER_REFUSALS:
            raise Done(Rejected(f"bind refused: {result.get('description')}"))
        failure = result_failure(result, "user bind" if user else "service account bind")
        if not user:
            # Any refusal of the service account is a configuration problem.
            failure = Unavailable(failure.reason, misconfigured=True)
        raise Done(failure)

    def open_service(self) -> Connection:
        assert self._s.bind_dn is not None and self._s.bind_password is not None
        return self.bound(self._s.bind_dn, self._s.bind_password.get_secret_value(), user=False)

    def check_password(self, dn: str, password: str) -> None:
        close_quietly(self.bound(dn, password, user=True))
