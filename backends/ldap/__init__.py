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

By job: :mod:`.settings`, :mod:`.token` (the token and its one spelling),
:mod:`.entries` (escaping, values), :mod:`.failures` (results and exceptions as
outcomes), :mod:`.bind` (connections and binds), :mod:`.pool` (the service account's
connections), :mod:`.search` (user and group searches), :mod:`.backend` (the review).
"""

from backends.ldap.backend import LDAPBackend
from backends.ldap.entries import dn_with, filter_with, group_name, text_values
from backends.ldap.failures import result_failure
from backends.ldap.settings import AD_IN_CHAIN, LDAPGroupSettings, LDAPPoolSettings, LDAPSettings
from backends.ldap.token import Credentials, canonical_token, folded_name, parse_token

__all__ = [
    "AD_IN_CHAIN",
    "Credentials",
    "LDAPBackend",
    "LDAPGroupSettings",
    "LDAPPoolSettings",
    "LDAPSettings",
    "canonical_token",
    "dn_with",
    "filter_with",
    "folded_name",
    "group_name",
    "parse_token",
    "result_failure",
    "text_values",
]
