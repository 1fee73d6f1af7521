"""An LDAP backend's settings: the directory, the service account, how users and their
groups are found, the token's form, the service-account pool."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from backends.base import Backend
from backends.budget import UNLIMITED, CallBudget
from backends.durations import Interval, count
from backends.http import TLSClientSettings
from backends.registry import build_registered, register
from backends.settings import BackendSettings, Secret, Strict

TokenFormat = Literal["base64", "plain"]

#: LDAP_MATCHING_RULE_IN_CHAIN: Active Directory walks nested group membership.
AD_IN_CHAIN = "1.2.840.113556.1.4.1941"
AD_NESTED_FILTER = f"(member:{AD_IN_CHAIN}:={{dn}})"


class LDAPPoolSettings(Strict):
    # Service-account connections, and threads: one LDAP exchange in flight per connection.
    size: Annotated[int, count(ge=1, le=64)] = 4
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
        # The CA bundle is read (once, bounded) and checked as the backend is built
        # (bind.py), as the HTTP backends read theirs. LDAPBackend registers itself
        # (@builds): it imports this module, so this module does not import it.
        return build_registered(self, budget)
