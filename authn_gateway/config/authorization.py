"""``authorization:``: the SubjectAccessReview webhook (docs/authorization.md).

Off unless the section is there. Its rules are k8s-keystone-auth's policy file, read as
is (``keystone_policy_file``), and the gateway's own ``rules``, or both: the own rules
are tried first, then the file's, and the first rule that holds decides.
"""

from __future__ import annotations

from typing import Annotated, Literal, Protocol

import re2
from pydantic import AfterValidator, Field, model_validator

from backends.durations import Age, Interval, count
from backends.settings import FilePath, Strict

#: How a pattern is compiled: RE2 matches in time linear in the name, whatever the
#: pattern, and names (namespaces, paths) come from whoever sends the API request.
RE2_OPTIONS = re2.Options()
RE2_OPTIONS.log_errors = False
# A pattern compiles to at most this much memory (RE2's own bound; its default is 8 MiB).
RE2_OPTIONS.max_mem = 1 << 20


class Regex(Protocol):
    def fullmatch(self, text: str) -> object | None: ...


def compile_regex(pattern: str) -> Regex:
    """``~pattern``'s regex, matched against the whole name. ValueError if invalid."""
    try:
        regex: Regex = re2.compile(pattern, RE2_OPTIONS)
    except re2.error as exc:
        detail = exc.args[0] if exc.args else "invalid"
        text = detail.decode(errors="replace") if isinstance(detail, bytes) else str(detail)
        raise ValueError(f"bad regex: {text}") from None
    return regex


def _check_pattern(value: str) -> str:
    if value.startswith("~"):
        compile_regex(value[1:])
    return value


#: A name, ``*`` for any, or ``~regex`` (RE2 syntax, matched against the whole name).
Pattern = Annotated[str, AfterValidator(_check_pattern)]
Patterns = Annotated[list[Pattern], Field(min_length=1)]


class ResourceRule(Strict):
    """Resource requests this rule covers: every key must hold."""

    # get, list, watch, create, update, patch, delete, deletecollection, ...; "*": any.
    verbs: Annotated[list[str], Field(min_length=1)]
    # API groups; "" is the core group (pods, secrets, ...).
    api_groups: Patterns = Field(default_factory=lambda: ["*"])
    # "pods", "pods/log" (a subresource), "pods/*" (any subresource of pods, not pods
    # itself), "*/scale" (that subresource of any resource), "*" (everything); a regex
    # is matched against "resource" or "resource/subresource".
    resources: Patterns = Field(default_factory=lambda: ["*"])
    # "*": any namespace, and cluster-scoped requests; "": cluster-scoped requests (and
    # requests across all namespaces) only.
    namespaces: Patterns = Field(default_factory=lambda: ["*"])
    # Namespaces and resources taken out of the above (k8s-keystone-auth's "!"). A
    # resource taken out goes with its subresources: "pods" takes out pods/exec and
    # pods/log too ("pods/exec": that one only; a regex is tried on "pods" as well).
    except_namespaces: list[Pattern] = Field(default_factory=list)
    except_resources: list[Pattern] = Field(default_factory=list)
    # Object names; "*": any, and requests for no one object (list, create).
    names: Patterns = Field(default_factory=lambda: ["*"])


class NonResourceRule(Strict):
    """Non-resource requests (/healthz, /version, /api, ...) this rule covers."""

    # HTTP verbs in lower case: get, post, ...; "*": any.
    verbs: Annotated[list[str], Field(min_length=1)]
    # "/healthz", "/apis/*" (every path under /apis/; "/apis**" is "/apis*"), "*", or
    # "~regex".
    paths: Patterns


class Rule(Strict):
    """One rule: who, what, and the answer when both hold."""

    # In the answer's reason and the logs: "allowed by authorization.rules[0] (name)".
    name: str = Field(default="", max_length=63)
    # allow: allowed. deny: denied, and kube-apiserver asks no other authorizer.
    effect: Literal["allow", "deny"] = "allow"
    # Who: every key given must hold; within a key, any of its patterns.
    # User names (spec.user), as RBAC's User subjects and k8s-keystone-auth's "user"
    # match; uids (spec.uid: the Keystone user id) only under uids, so that a name
    # never matches someone else's id.
    users: list[Pattern] | None = None
    uids: list[Pattern] | None = None
    groups: list[Pattern] | None = None
    projects: list[Pattern] | None = None  # Keystone project name or id (user.extra)
    roles: list[Pattern] | None = None  # Keystone roles (user.extra): any of these
    all_roles: list[str] | None = None  # ... every one of these
    # What: any of these blocks.
    resources: list[ResourceRule] = Field(default_factory=list)
    non_resources: list[NonResourceRule] = Field(default_factory=list)

    @model_validator(mode="after")
    def _covers_something(self) -> Rule:
        if not self.resources and not self.non_resources:
            raise ValueError("needs resources or non_resources (a rule for nothing never holds)")
        return self


class DecisionCacheSettings(Strict):
    """Decisions kept, as kube-apiserver keeps them (its webhook authorizer's cache)."""

    # kube-apiserver's --authorization-webhook-cache-authorized-ttl default.
    authorized_ttl_seconds: Age = 300.0
    # Denied and no-opinion answers (-unauthorized-ttl's default). 0: not kept.
    unauthorized_ttl_seconds: Age = 30.0
    # Per process, least recently used first out. 0: no cache.
    max_entries: Annotated[int, count(ge=0, le=10_000_000)] = 10_000


class AuthorizationSettings(Strict):
    # kube-apiserver's authorization webhook kubeconfig names this path.
    path: str = Field(default="/authorize", pattern=r"^/[^?#]*$")
    # k8s-keystone-auth's --policy-file (or its ConfigMap's "policies" key, mounted):
    # JSON, read as is, read again when it changes.
    keystone_policy_file: FilePath | None = None
    # The gateway's own rules, tried before the file's: docs/authorization.md.
    rules: list[Rule] = Field(default_factory=list)
    # How often the file's modification time is checked.
    reload_interval_seconds: Interval = 2.0
    # The answer when no policy can decide (the file unreadable or invalid since
    # start-up): no_opinion, so that the next authorizer (RBAC) decides; or deny.
    on_error: Literal["no_opinion", "deny"] = "no_opinion"
    cache: DecisionCacheSettings = Field(default_factory=DecisionCacheSettings)

    @model_validator(mode="after")
    def _has_rules(self) -> AuthorizationSettings:
        if self.keystone_policy_file is None and not self.rules:
            raise ValueError("needs keystone_policy_file or rules")
        return self
