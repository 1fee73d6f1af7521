"""LDAP backend for OpenLDAP and Active Directory, via ldap3 in a bounded thread pool.

The bearer token is ``base64("username:password")``. One uncached review:

1. decode and check the token locally. An empty username or password never reaches
   the server: a bind with a DN and an empty password is an *unauthenticated bind*,
   and many servers answer it with success;
2. find the user's entry as the service account (exactly one entry must match), or
   build the DN from ``user_dn_template``;
3. bind as that DN with the password, on a short-lived connection of its own, so
   pooled service connections never change identity;
4. read the groups: the entry's ``memberOf``, or a group search.

Every user-supplied value is escaped: RFC 4515 in filters, RFC 4514 in DNs.

ldap3 is synchronous. Every exchange runs on a dedicated thread pool with one thread
per pooled service connection; a slot is held until the thread is really finished,
so a hung server can never collect more threads than the pool has (see
docs/decisions.md, "LDAP: ldap3 in a bounded thread pool").
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import logging
import math
import queue
import re
import socket
import ssl
import threading
import time
import unicodedata
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from ldap3 import BASE, IP_SYSTEM_DEFAULT, NONE, SIMPLE, SUBTREE, SYNC, Connection, Server, Tls
from ldap3.core.exceptions import (
    LDAPCertificateError,
    LDAPCommunicationError,
    LDAPException,
    LDAPResponseTimeoutError,
    LDAPSASLPrepError,
    LDAPSocketOpenError,
    LDAPStartTLSError,
)
from ldap3.protocol.sasl.sasl import validate_simple_password
from ldap3.utils.conv import escape_filter_chars
from ldap3.utils.dn import escape_rdn, parse_dn
from pydantic import Field, model_validator

from backends.base import (
    Authenticated,
    Backend,
    BackendConfigError,
    Outcome,
    Rejected,
    Unavailable,
    UserInfo,
)
from backends.budget import UNLIMITED, CallBudget
from backends.context import WireTime
from backends.durations import Interval
from backends.http import TLSClientSettings
from backends.registry import register
from backends.settings import BackendSettings, Secret, Strict

log = logging.getLogger(__name__)

T = TypeVar("T")
TokenFormat = Literal["base64", "plain"]

#: LDAP_MATCHING_RULE_IN_CHAIN: Active Directory walks nested group membership.
AD_IN_CHAIN = "1.2.840.113556.1.4.1941"
AD_NESTED_FILTER = f"(member:{AD_IN_CHAIN}:={{dn}})"
PAGED_RESULTS = "1.2.840.113556.1.4.319"
GROUP_PAGE_SIZE = 500
MAX_GROUP_PAGES = 20

# A user bind refused for reasons of that user: invalidCredentials (AD adds locked,
# disabled and expired as sub-codes), constraintViolation and unwillingToPerform (389 DS:
# lockout, inactivated account), noSuchObject and invalidDNSyntax (a DN built from what
# the user typed). These are rejections, never "unavailable": whatever a caller sends
# must not be able to open the breaker for everyone.
USER_REFUSALS = frozenset({19, 32, 34, 49, 53})
SIZE_LIMIT_EXCEEDED = 4
# Result codes that mean our configuration is wrong rather than the server being down:
# authMethodNotSupported, strongerAuthRequired, confidentialityRequired, noSuchObject
# (a wrong base), invalidDNSyntax, inappropriateAuthentication, insufficientAccessRights,
# unwillingToPerform, filterError.
MISCONFIGURED_CODES = frozenset({7, 8, 13, 32, 34, 48, 50, 53, 87})


# --- settings -----------------------------------------------------------------------


class LDAPPoolSettings(Strict):
    # Service-account connections, and threads: one LDAP exchange in flight per connection.
    size: int = Field(default=4, ge=1, le=64)
    # A service connection idle this long is replaced before use: firewalls, and AD
    # (MaxConnIdleTime, 900 s), drop idle connections silently, and a silent drop
    # would cost a whole read timeout to notice.
    max_idle_seconds: Interval = 300.0


class LDAPGroupSettings(Strict):
    # member_of: the user entry's memberOf values; search: a search under `base`; none.
    mode: Literal["member_of", "search", "none"] = "member_of"
    member_of_attribute: str = "memberOf"
    base: str | None = None
    # {dn} is the user's DN, {username} the user's username_attribute value; both escaped.
    # posixGroup: "(&(objectClass=posixGroup)(memberUid={username}))".
    filter: str = "(&(objectClass=groupOfNames)(member={dn}))"
    # The group's name; in member_of mode, read from the first RDN when it has this type.
    name_attribute: str = "cn"
    # Active Directory nested groups (matching rule in chain); implies a group search.
    ad_nested: bool = False

    @model_validator(mode="after")
    def _check(self) -> LDAPGroupSettings:
        if self.ad_nested:
            if self.mode != "search":
                raise ValueError("ad_nested: needs mode: search")
            if "filter" in self.model_fields_set:
                raise ValueError("ad_nested: set either ad_nested or filter, not both")
        if self.mode == "search":
            if not self.base:
                raise ValueError("base: required when mode is search")
            if "{dn}" not in self.filter and "{username}" not in self.filter:
                raise ValueError("filter: must contain {dn} or {username}")
        return self

    @property
    def search_filter(self) -> str:
        return AD_NESTED_FILTER if self.ad_nested else self.filter


@register
class LDAPSettings(BackendSettings):
    type: Literal["ldap"]
    # ldap://host[:port] or ldaps://host[:port]
    url: str = Field(pattern=r"^ldaps?://[^/?#\s]+/?$")
    # Upgrade ldap:// with StartTLS (RFC 4513) before anything else is sent.
    start_tls: bool = False
    # ldap:// without StartTLS sends every password in clear; refused unless this is set.
    allow_plaintext: bool = False
    tls: TLSClientSettings = Field(default_factory=TLSClientSettings)
    # The service account that searches users and groups.
    bind_dn: str | None = None
    bind_password: Secret | None = None
    # Search mode: find the user under user_base with user_filter ({username} is escaped).
    user_base: str | None = None
    user_filter: str = "(uid={username})"
    # Direct mode: bind this DN ({username} is escaped as an RDN value), no search.
    user_dn_template: str | None = None
    username_attribute: str = "uid"
    # Stable id for kube-apiserver's user.uid; AD: objectGUID.
    uid_attribute: str = "entryUUID"
    # extra key -> LDAP attribute, e.g. {"example.org/mail": "mail"}.
    extra_attributes: dict[str, str] = Field(default_factory=dict)
    groups: LDAPGroupSettings = Field(default_factory=LDAPGroupSettings)
    # base64 of "username:password" (the usual form), or "username:password" as is.
    token_format: TokenFormat = "base64"
    pool: LDAPPoolSettings = Field(default_factory=LDAPPoolSettings)

    @model_validator(mode="after")
    def _check_ldap(self) -> LDAPSettings:
        ldaps = self.url.startswith("ldaps://")
        if self.start_tls and ldaps:
            raise ValueError("start_tls: not with ldaps:// (TLS is already on)")
        if not ldaps and not self.start_tls and not self.allow_plaintext:
            raise ValueError(
                "url: ldap:// without start_tls sends passwords in clear; use ldaps://, "
                "start_tls: true, or allow_plaintext: true"
            )
        if (self.bind_dn is None) != (self.bind_password is None):
            raise ValueError("bind_dn: bind_dn and bind_password go together")
        if (self.user_base is None) == (self.user_dn_template is None):
            raise ValueError("user_base: set exactly one of user_base or user_dn_template")
        if self.user_base is not None:
            if self.bind_dn is None:
                raise ValueError("bind_dn: required to search users under user_base")
            if "{username}" not in self.user_filter:
                raise ValueError("user_filter: must contain {username}")
        if self.user_dn_template is not None and "{username}" not in self.user_dn_template:
            raise ValueError("user_dn_template: must contain {username}")
        return self

    def build(self, budget: CallBudget = UNLIMITED) -> Backend:
        if self.tls.ca_file is not None:
            _check_ca_file(self.tls)
        return LDAPBackend(self)


def _check_ca_file(tls: TLSClientSettings) -> None:
    """Load ``tls.ca_file`` as the HTTP backends do (backends/http.py), so a missing file
    is one config error line (ldap3's Tls raises its own exception, a traceback in
    check-config) and a file with no certificate is refused at check-config, not found
    at the first connection that cannot verify the server."""
    try:
        ssl.create_default_context(cafile=str(tls.ca_file))
    except (OSError, ssl.SSLError) as exc:
        reason = getattr(exc, "strerror", None) or getattr(exc, "reason", None) or exc
        raise BackendConfigError(f"tls.ca_file: cannot load {tls.ca_file}: {reason}") from None


# --- the token ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Credentials:
    username: str
    password: str = field(repr=False)


def parse_token(token: str, token_format: TokenFormat = "base64") -> Credentials | None:  # noqa: S107
    """``username:password`` from the token, or None when it can never be valid."""
    if token_format == "base64":
        try:
            text = base64.b64decode(token, validate=True).decode("utf-8")
        except (binascii.Error, ValueError):
            return None
    else:
        text = token
    username, sep, password = text.partition(":")
    if not sep or not username.strip() or not password:
        return None
    # No directory name holds control characters, and a NUL would cut the name short
    # in C servers.
    if not username.isprintable():
        return None
    return Credentials(username, password)


def folded_name(username: str) -> str:
    """``username`` folded the way directories match a login name, and further: case
    (OpenLDAP's ``caseIgnoreMatch`` on ``uid`` and ``cn``, Active Directory), width and
    compatibility forms (NFKC, RFC 4518), spaces at either end and runs of them (RFC
    4518's insignificant spaces), and every combining mark (OpenLDAP takes ``ALİCE``,
    a dotted capital I, for ``alice``). Folding too far only gives two names the same
    token id when their passwords are the same too."""
    if username.isascii():
        name = username.lower()
    else:
        # Decomposed both before and after case folding, so no mark survives either.
        folded = unicodedata.normalize("NFKD", unicodedata.normalize("NFKD", username).casefold())
        bare = "".join(c for c in folded if not unicodedata.category(c).startswith("M"))
        name = unicodedata.normalize("NFKC", bare)
    return " ".join(name.split())


def canonical_token(token: str, token_format: TokenFormat = "base64") -> str:  # noqa: S107
    """The one spelling of the credential in ``token`` (``Backend.credential``): the
    name folded (:func:`folded_name`), the password as the bind sends it (SASLprep,
    RFC 4013: a full-width ``alice`` binds as ``alice``), base64 in its canonical form (the
    decoder ignores non-zero trailing bits). ``token`` itself when it is no credential."""
    creds = parse_token(token, token_format)
    if creds is None:
        return token
    password = creds.password
    if not (password.isascii() and password.isprintable()):
        # SASLprep leaves printable ASCII as it is; anything else costs ~20 us, so only here.
        try:
            password = validate_simple_password(password).decode("utf-8")
        except (LDAPException, UnicodeDecodeError):
            return token  # no bind can carry it: never valid, nothing to fold
    text = f"{folded_name(creds.username)}:{password}"
    if token_format == "plain":
        return text
    return base64.b64encode(text.encode("utf-8")).decode("ascii")


#: Why a password can never be valid: a simple bind sends it through SASLprep (RFC 4013,
#: RFC 4513 section 5.1.2), which refuses control characters, unassigned and private
#: code points, and mixed right-to-left and left-to-right text.
SASLPREP_REFUSAL = Rejected("password is not valid under SASLprep (RFC 4013)", "unsendable")


def sendable_password(password: str) -> bool:
    """Whether a simple bind can carry ``password`` (ldap3's own SASLprep check)."""
    try:
        validate_simple_password(password)
    except LDAPSASLPrepError:
        return False
    return True


# --- escaping and values ------------------------------------------------------------


def filter_with(template: str, **values: str) -> str:
    """Fill ``{name}`` placeholders with RFC 4515-escaped values (no str.format: a
    filter may hold other braces)."""
    for name, value in values.items():
        template = template.replace("{" + name + "}", escape_filter_chars(value))
    return template


def dn_with(template: str, username: str) -> str:
    # ldap3 escapes NUL as a backslash before a raw NUL; RFC 4514 wants \00.
    value = escape_rdn(username).replace("\\\x00", "\\00")
    return template.replace("{username}", value)


_DN_ESCAPE = re.compile(r"\\([0-9a-fA-F]{2}|.)")


def unescape_dn_value(value: str) -> str:
    """RFC 4514 attribute value to text: ``\\,`` -> ``,``, ``\\2C`` -> ``,``."""
    raw = bytearray()
    pos = 0
    for m in _DN_ESCAPE.finditer(value):
        raw += value[pos : m.start()].encode()
        token = m.group(1)
        raw += bytes.fromhex(token) if len(token) == 2 else token.encode()
        pos = m.end()
    raw += value[pos:].encode()
    return raw.decode("utf-8", errors="replace")


def group_name(dn: str, name_attribute: str) -> str:
    """The group's name from its DN: the first RDN's value when it has the name type."""
    try:
        attr, value, _ = parse_dn(dn)[0]
    except (LDAPException, IndexError):
        return dn
    return unescape_dn_value(value) if attr.lower() == name_attribute.lower() else dn


def text_values(attribute: str, values: list[bytes]) -> list[str]:
    out = []
    for value in values:
        try:
            out.append(value.decode("utf-8"))
        except UnicodeDecodeError:
            if attribute.lower() == "objectguid" and len(value) == 16:
                # AD's canonical GUID string is the little-endian UUID form.
                out.append(str(uuid.UUID(bytes_le=value)))
            else:
                out.append(base64.b64encode(value).decode())
    return out


@dataclass(frozen=True, slots=True)
class Entry:
    dn: str
    # Lower-cased attribute name -> values as text.
    attributes: dict[str, list[str]]

    def first(self, attribute: str) -> str:
        values = self.attributes.get(attribute.lower())
        return values[0] if values else ""

    def all(self, attribute: str) -> list[str]:
        return self.attributes.get(attribute.lower(), [])


def _entries(response: list[dict[str, Any]] | None) -> list[Entry]:
    # Referrals (AD answers searches at a domain root with some) are not entries.
    return [
        Entry(
            r["dn"],
            {k.lower(): text_values(k, list(v)) for k, v in r.get("raw_attributes", {}).items()},
        )
        for r in response or []
        if r.get("type") == "searchResEntry"
    ]


# --- failures -----------------------------------------------------------------------


class _Done(Exception):
    """Ends an exchange early with its outcome."""

    def __init__(self, outcome: Outcome) -> None:
        super().__init__(type(outcome).__name__)
        self.outcome = outcome


def result_failure(result: dict[str, Any], during: str) -> Unavailable:
    """A non-success LDAP result (other than a user's invalid credentials)."""
    code = result.get("result")
    return Unavailable(
        f"{during}: {result.get('description', 'error')} ({code})",
        misconfigured=code in MISCONFIGURED_CODES,
    )


def _causes(exc: BaseException) -> list[BaseException]:
    # ldap3 raises LDAPSocketOpenError("unable to open socket", [(exc, address), ...])
    # when every address of a host failed; the real reasons are in that list.
    causes = [exc]
    if len(exc.args) > 1 and isinstance(exc.args[1], list):
        causes += [item[0] for item in exc.args[1] if isinstance(item, tuple) and item]
    return causes


def connection_failure(exc: LDAPException) -> Unavailable:
    """Map an ldap3 exception to a short, secret-free reason.

    ldap3 builds its socket exceptions as subclasses of both its own class and the
    original one (ssl.SSLCertVerificationError, TimeoutError, ...), so types tell.
    """
    causes = _causes(exc)

    def any_of(*types: type[BaseException]) -> bool:
        return any(isinstance(c, types) for c in causes)

    if any_of(ssl.SSLCertVerificationError, LDAPCertificateError):
        return Unavailable("TLS certificate verification failed", misconfigured=True)
    if any_of(TimeoutError, LDAPResponseTimeoutError):
        return Unavailable("timed out", timed_out=True)
    if any_of(ssl.SSLError):
        return Unavailable("TLS handshake failed", misconfigured=True)
    if any_of(LDAPStartTLSError):
        return Unavailable("StartTLS refused", misconfigured=True)
    if any_of(LDAPSocketOpenError):
        return Unavailable("connection failed")
    if any_of(LDAPCommunicationError):
        return Unavailable("connection dropped")
    return Unavailable(f"LDAP client error ({type(exc).__name__})")


def _no_delay(conn: Connection) -> None:
    # LDAP is small request/answer pairs. With Nagle's algorithm on, the first write
    # after a TLS handshake waits for the server's delayed ACK: 40 ms on every bind.
    with contextlib.suppress(OSError, AttributeError):
        conn.socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def _close(conn: Connection | None) -> None:
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
                _close(conn)
                conn = None
            reused = conn is not None
            if conn is None:
                conn = self._open()
            try:
                return operation(conn)
            except LDAPCommunicationError as exc:
                _close(conn)
                conn = None
                if not reused or isinstance(exc, TimeoutError):
                    raise
            conn = self._open()
            return operation(conn)
        except LDAPException:
            _close(conn)
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
            _close(slot.conn)


# --- the backend --------------------------------------------------------------------


class LDAPBackend(Backend):
    kind = "ldap"

    def __init__(self, settings: LDAPSettings) -> None:
        super().__init__(settings.name)
        self._s = settings
        timeouts = settings.timeouts
        tls = settings.tls
        self._tls = Tls(
            validate=ssl.CERT_REQUIRED if tls.verify else ssl.CERT_NONE,
            ca_certs_file=str(tls.ca_file) if tls.ca_file else None,
        )
        self._connect_timeout = timeouts.connect_seconds
        # ldap3 also sets SO_RCVTIMEO from this, packed as an integer: whole seconds only.
        # The review deadline (total_seconds) still cuts a slow call short.
        self._read_timeout = max(1, math.ceil(timeouts.read_seconds))
        # Server-side limit on each search (0 would mean none).
        self._time_limit = self._read_timeout
        size = settings.pool.size
        self._executor = ThreadPoolExecutor(
            max_workers=size, thread_name_prefix=f"ldap-{self.name}"
        )
        self._slots = asyncio.Semaphore(size)
        self.pool: ServicePool | None = None
        if settings.bind_dn is not None:
            self.pool = ServicePool(self._open_service, size, settings.pool.max_idle_seconds)
        groups = settings.groups
        self._attributes = sorted(
            {
                settings.username_attribute,
                settings.uid_attribute,
                *settings.extra_attributes.values(),
            }
            | ({groups.member_of_attribute} if groups.mode == "member_of" else set())
        )
        self._warm_up: asyncio.Task[None] | None = None

    # -- lifecycle

    async def start(self) -> None:
        if not self._s.tls.verify:
            log.warning("backend %s: TLS certificate verification is OFF", self.name)
        if self._s.allow_plaintext and not self._s.start_tls and self._s.url.startswith("ldap:"):
            log.warning("backend %s: passwords go to the LDAP server in clear", self.name)
        if self.pool is not None:
            # Early word on a wrong bind DN or CA, without delaying start-up.
            self._warm_up = asyncio.create_task(self._check_service(), name=f"ldap-{self.name}")

    async def _check_service(self) -> None:
        problem = await self._in_thread(self._service_problem)
        if problem is not None:
            log.warning("backend %s: service account not usable yet: %s", self.name, problem)

    def _service_problem(self) -> str | None:
        assert self.pool is not None
        try:
            self.pool.run(lambda conn: None)
        except _Done as done:
            return getattr(done.outcome, "reason", "refused")
        except LDAPException as exc:
            return connection_failure(exc).reason
        return None

    async def close(self) -> None:
        if self._warm_up is not None:
            self._warm_up.cancel()
        await asyncio.to_thread(self._shutdown)

    def _shutdown(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=True)
        if self.pool is not None:
            self.pool.close()

    # -- the review

    def could_accept(self, token: str) -> bool:
        creds = parse_token(token, self._s.token_format)
        return creds is not None and sendable_password(creds.password)

    def credential(self, token: str) -> str:
        return canonical_token(token, self._s.token_format)

    async def authenticate(self, token: str, wire: WireTime | None = None) -> Outcome:
        creds = parse_token(token, self._s.token_format)
        if creds is None:
            return Rejected("token is not username:password with both parts set")
        if not sendable_password(creds.password):
            # Refused here, before a thread or a connection: no such password can be valid.
            return SASLPREP_REFUSAL
        return await self._in_thread(lambda: self._guarded(lambda: self._exchange(creds)))

    async def _in_thread(self, fn: Callable[[], T]) -> T:
        await self._slots.acquire()
        try:
            future = asyncio.get_running_loop().run_in_executor(self._executor, fn)
        except BaseException:
            self._slots.release()
            raise
        # The slot is freed when the thread is done, not when the caller gives up: a
        # review cancelled by its deadline must not let a hung server collect threads.
        future.add_done_callback(lambda _: self._slots.release())
        return await asyncio.shield(future)

    def _guarded(self, exchange: Callable[[], Outcome]) -> Outcome:
        try:
            return exchange()
        except _Done as done:
            return done.outcome
        except LDAPException as exc:
            return connection_failure(exc)

    def _exchange(self, creds: Credentials) -> Outcome:
        template = self._s.user_dn_template
        if template is None:
            assert self.pool is not None
            entry = self.pool.run(lambda c: self._find_user(c, creds.username))
            self._check_password(entry.dn, creds.password)
            return self._identity(entry, self.pool.run)
        dn = dn_with(template, creds.username)
        if self.pool is not None:
            self._check_password(dn, creds.password)
            entry = self.pool.run(lambda c: self._read_entry(c, dn))
            return self._identity(entry, self.pool.run)
        # No service account: the user reads their own entry and groups.
        conn = self._bound(dn, creds.password, user=True)
        try:
            entry = self._read_entry(conn, dn)
            return self._identity(entry, lambda op: op(conn))
        finally:
            _close(conn)

    # -- connections (in worker threads)

    def _connection(self, dn: str, password: str) -> Connection:
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
            receive_timeout=self._read_timeout,
            raise_exceptions=False,
            read_only=True,
            auto_referrals=False,
        )

    def _bound(self, dn: str, password: str, *, user: bool) -> Connection:
        """An open connection, TLS started, bound as ``dn``; raises _Done when refused."""
        if not password:
            # Belt and braces: parse_token already refused it. Never an unauthenticated bind.
            raise _Done(Rejected("empty password"))
        conn = self._connection(dn, password)
        try:
            conn.open()
            _no_delay(conn)
            if self._s.start_tls:
                conn.start_tls()
            if conn.bind():
                return conn
            result = conn.result
        except LDAPSASLPrepError:
            # ldap3 checks the password as it builds the bind request: the password
            # can never be valid, which says nothing about the server.
            _close(conn)
            if user:
                raise _Done(SASLPREP_REFUSAL) from None
            raise _Done(
                Unavailable("service account password fails SASLprep", misconfigured=True)
            ) from None
        except BaseException:
            _close(conn)
            raise
        _close(conn)
        if user and result.get("result") in USER_REFUSALS:
            raise _Done(Rejected(f"bind refused: {result.get('description')}"))
        failure = result_failure(result, "user bind" if user else "service account bind")
        if not user:
            # Any refusal of the service account is a configuration problem.
            failure = Unavailable(failure.reason, misconfigured=True)
        raise _Done(failure)

    def _open_service(self) -> Connection:
        assert self._s.bind_dn is not None and self._s.bind_password is not None
        return self._bound(self._s.bind_dn, self._s.bind_password.get_secret_value(), user=False)

    def _check_password(self, dn: str, password: str) -> None:
        _close(self._bound(dn, password, user=True))

    # -- searches

    def _find_user(self, conn: Connection, username: str) -> Entry:
        assert self._s.user_base is not None
        conn.search(
            self._s.user_base,
            filter_with(self._s.user_filter, username=username),
            SUBTREE,
            attributes=self._attributes,
            size_limit=2,
            time_limit=self._time_limit,
        )
        entries = _entries(conn.response)
        code = conn.result.get("result")
        if code == SIZE_LIMIT_EXCEEDED or len(entries) > 1:
            raise _Done(Rejected("more than one entry matches"))
        if code != 0:
            raise _Done(result_failure(conn.result, "user search"))
        if not entries:
            raise _Done(Rejected("no such user"))
        return entries[0]

    def _read_entry(self, conn: Connection, dn: str) -> Entry:
        conn.search(
            dn,
            "(objectClass=*)",
            BASE,
            attributes=self._attributes,
            time_limit=self._time_limit,
        )
        entries = _entries(conn.response)
        if conn.result.get("result") != 0 or len(entries) != 1:
            # The bind succeeded, so the entry exists: we are not allowed to read it.
            failure = result_failure(conn.result, "reading the user entry")
            raise _Done(Unavailable(failure.reason, misconfigured=True))
        return entries[0]

    def _search_groups(self, conn: Connection, entry: Entry, username: str) -> list[str]:
        groups = self._s.groups
        assert groups.base is not None
        flt = filter_with(groups.search_filter, dn=entry.dn, username=username)
        names: list[str] = []
        cookie: bytes | None = None
        for _ in range(MAX_GROUP_PAGES):
            conn.search(
                groups.base,
                flt,
                SUBTREE,
                attributes=[groups.name_attribute],
                time_limit=self._time_limit,
                paged_size=GROUP_PAGE_SIZE,
                paged_cookie=cookie,
            )
            if conn.result.get("result") != 0:
                raise _Done(result_failure(conn.result, "group search"))
            names += [e.first(groups.name_attribute) or e.dn for e in _entries(conn.response)]
            control = (conn.result.get("controls") or {}).get(PAGED_RESULTS) or {}
            cookie = (control.get("value") or {}).get("cookie")
            if not cookie:
                return names
        # This user's groups, not the directory's health (the filter must name the user):
        # a refusal, as GitLab's backend does. Unavailable would let one user's own
        # reviews open the breaker for everyone.
        most = MAX_GROUP_PAGES * GROUP_PAGE_SIZE
        log.warning("backend %s: user %s is in more than %d groups", self.name, username, most)
        raise _Done(Rejected(f"user is in more than {most} groups", "unmapped"))

    def _identity(
        self, entry: Entry, run: Callable[[Callable[[Connection], list[str]]], list[str]]
    ) -> Outcome:
        s = self._s
        username = entry.first(s.username_attribute)
        if not username:
            # The password was right, so the directory is healthy: a refusal (an entry
            # with a password but no name, such as a service entry), never "unavailable".
            return Rejected(
                f"user entry has no {s.username_attribute!r} attribute (username_attribute)",
                "unmapped",
            )
        groups = s.groups
        names: list[str] = []
        if groups.mode == "member_of":
            names = [
                group_name(dn, groups.name_attribute)
                for dn in entry.all(groups.member_of_attribute)
            ]
        elif groups.mode == "search":
            names = run(lambda c: self._search_groups(c, entry, username))
        extra = {key: tuple(entry.all(attr)) for key, attr in s.extra_attributes.items()}
        return Authenticated(
            UserInfo(
                username=username,
                uid=entry.first(s.uid_attribute),
                groups=tuple(sorted(set(names))),
                extra={k: v for k, v in extra.items() if v},
            )
        )
