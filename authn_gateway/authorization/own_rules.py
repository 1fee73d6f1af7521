"""The gateway's own rules (``authorization.rules``) compiled to checks.

The same decisions as k8s-keystone-auth's policy can be written here more plainly
(docs/authorization.md maps each of its rule kinds): who (``users``, ``uids``,
``groups``, ``projects``, ``roles``, ``all_roles``: every key given must hold, any value
of each), what (``resources`` and ``non_resources`` blocks: any block), and the ``effect``. A
pattern is a name, ``*``, or ``~regex`` (RE2, the whole name). Roles and projects are
read from ``user.extra`` as the Keystone backend writes them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from authn_gateway.authorization.keystone_policy import PROJECT_ID, PROJECT_NAME, ROLES
from authn_gateway.authorization.rules import Check, Rule
from authn_gateway.authorization.sar import AccessReview
from authn_gateway.config.authorization import (
    NonResourceRule,
    ResourceRule,
    compile_regex,
)
from authn_gateway.config.authorization import Rule as RuleSettings

Test = Callable[[str], bool]

SOURCE = "authorization.rules"


def compile_rules(rules: Sequence[RuleSettings]) -> tuple[Rule, ...]:
    """The rules, in order; they were validated with the config (regexes included)."""
    compiled = []
    for i, rule in enumerate(rules):
        where = f"{SOURCE}[{i}]" + (f" ({rule.name})" if rule.name else "")
        compiled.append(Rule(where, rule.effect, _check(rule)))
    return tuple(compiled)


def name_test(patterns: Sequence[str]) -> Test:
    """Whether a name is one of ``patterns`` (a name, ``*``, ``~regex``)."""
    if "*" in patterns:
        return lambda name: True
    names = frozenset(p for p in patterns if not p.startswith("~"))
    regexes = [compile_regex(p[1:]) for p in patterns if p.startswith("~")]
    if not regexes:
        return names.__contains__
    return lambda name: name in names or any(r.fullmatch(name) for r in regexes)


def _any_of(values: Sequence[str], test: Test) -> bool:
    return any(test(v) for v in values)


def _check(rule: RuleSettings) -> Check:
    who: list[Check] = []
    if rule.users is not None:
        users = name_test(rule.users)
        who.append(lambda r: users(r.user))
    if rule.uids is not None:
        uids = name_test(rule.uids)
        who.append(lambda r: bool(r.uid) and uids(r.uid))
    if rule.groups is not None:
        groups = name_test(rule.groups)
        who.append(lambda r: _any_of(r.groups, groups))
    if rule.projects is not None:
        projects = name_test(rule.projects)
        who.append(
            lambda r: (
                _any_of(r.extra.get(PROJECT_ID, ()), projects)
                or _any_of(r.extra.get(PROJECT_NAME, ()), projects)
            )
        )
    if rule.roles is not None:
        roles = name_test(rule.roles)
        who.append(lambda r: _any_of(r.extra.get(ROLES, ()), roles))
    if rule.all_roles is not None:
        required = frozenset(rule.all_roles)
        who.append(lambda r: required.issubset(r.extra.get(ROLES, ())))
    on_resource = [_resource_check(block) for block in rule.resources]
    on_non_resource = [_non_resource_check(block) for block in rule.non_resources]

    def holds(review: AccessReview) -> bool:
        if not all(check(review) for check in who):
            return False
        checks = on_resource if review.resource is not None else on_non_resource
        return any(check(review) for check in checks)

    return holds


def _resource_check(block: ResourceRule) -> Check:
    verbs = frozenset(block.verbs)
    any_verb = "*" in verbs
    api_groups = name_test(block.api_groups)
    namespaces = name_test(block.namespaces)
    excluded_namespaces = name_test(block.except_namespaces) if block.except_namespaces else None
    resources = _resource_test(block.resources)
    excluded_resources = _resource_test(block.except_resources) if block.except_resources else None
    names = name_test(block.names)
    any_name = "*" in block.names

    def holds(review: AccessReview) -> bool:
        r = review.resource
        assert r is not None
        if not (any_verb or r.verb in verbs):
            return False
        if not api_groups(r.group) or not namespaces(r.namespace):
            return False
        if excluded_namespaces is not None and excluded_namespaces(r.namespace):
            return False
        if not resources(r.resource, r.subresource):
            return False
        if excluded_resources is not None and (
            excluded_resources(r.resource, r.subresource)
            or (r.subresource and excluded_resources(r.resource, ""))
        ):
            # An exception takes out the resource with its subresources: "except pods"
            # shuts out pods/exec too, as k8s-keystone-auth's "!['pods']" does.
            return False
        return any_name or names(r.name)

    return holds


def _resource_test(patterns: Sequence[str]) -> Callable[[str, str], bool]:
    """RBAC's reading of resources: ``pods`` (no subresource), ``pods/log``, ``pods/*``
    (any subresource of pods), ``*/scale``, ``*``; a regex sees ``resource[/sub]``."""
    if "*" in patterns:
        return lambda resource, subresource: True
    exact = frozenset(p for p in patterns if not p.startswith("~"))
    regexes = [compile_regex(p[1:]) for p in patterns if p.startswith("~")]

    def test(resource: str, subresource: str) -> bool:
        if not subresource:
            full = resource
        else:
            full = f"{resource}/{subresource}"
            if f"{resource}/*" in exact or f"*/{subresource}" in exact:
                return True
        return full in exact or any(r.fullmatch(full) for r in regexes)

    return test


def _nothing(name: str) -> bool:
    return False


def _non_resource_check(block: NonResourceRule) -> Check:
    verbs = frozenset(block.verbs)
    any_verb = "*" in verbs
    exact = [p for p in block.paths if not p.startswith("~") and not p.endswith("*")]
    # A trailing "*" (or several: "/api**" is "/api*") matches every path that starts
    # with what is before it, as k8s-keystone-auth's TrimRight(path, "*") does.
    prefixes = tuple(
        p.rstrip("*") for p in block.paths if p.endswith("*") and not p.startswith("~")
    )
    listed = [*exact, *(p for p in block.paths if p.startswith("~"))]
    paths = name_test(listed) if listed else _nothing

    def holds(review: AccessReview) -> bool:
        n = review.non_resource
        assert n is not None
        if not (any_verb or n.verb in verbs):
            return False
        return n.path.startswith(prefixes) or paths(n.path)

    return holds
