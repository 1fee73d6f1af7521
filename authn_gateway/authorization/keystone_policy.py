"""k8s-keystone-auth's authorization policy, read as it is.

The file is the JSON list k8s-keystone-auth takes as ``--policy-file`` (or as the
``policies`` key of its ConfigMap, mounted as a file), and each rule is decided as its
authorizer decides it: ``Authorize``, ``resourceMatches``, ``nonResourceMatches``,
``match``, ``resourcePermissionAllowed``, ``nonResourcePermissionAllowed`` and
``getAllowed`` in pkg/identity/keystone/authorizer.go of kubernetes/cloud-provider-openstack,
with the types of policy.go. docs/authorization.md has the table: each rule kind, its
behaviour there, ours. In short:

- a rule's ``users`` (``{"roles": [...], "projects": [...]}``) gates it: the user must
  hold every role listed and be in one of the projects (by id or name);
- for a resource request, ``resource_permissions`` (version 2) when present, else
  ``resource`` with ``match`` (version 1); for a non-resource request, likewise
  ``nonresource_permissions``, else ``nonresource`` with ``match``;
- ``match`` entries must all hold; each of type ``role``, ``project``, ``group`` or
  ``user`` holds when the user has one of its ``values`` (``"*"``: always);
- roles and projects come from ``user.extra`` (``alpha.kubernetes.io/identity/roles``,
  ``.../project/id``, ``.../project/name``), as the Keystone backend sets them: no
  rule kind needs Keystone itself.

What k8s-keystone-auth would fail on, or silently never match, is refused here at load
with the rule's index (:class:`PolicyError`): an unknown match type, a field of the
wrong type, a ``null`` rule (its authorizer dereferences it on every review reaching
it), a ``resource`` without ``version`` or ``namespace`` (its authorizer dereferences
both, once a request reaches it: refused here even where none would). What it
accepts and we accept too but that cannot match as written is kept, with a note for the
log (:attr:`KeystonePolicy.notes`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from authn_gateway.authorization.rules import Check, Rule
from authn_gateway.authorization.sar import AccessReview
from backends.keystone.identity import EXTRA

ROLES = EXTRA + "roles"
PROJECT_ID = EXTRA + "project/id"
PROJECT_NAME = EXTRA + "project/name"

MATCH_TYPES = ("role", "project", "group", "user")

# policy.go's field names; Go's decoder also takes them in any case ("Verbs").
RULE_FIELDS = (
    "users",
    "resource",
    "nonresource",
    "match",
    "resource_permissions",
    "nonresource_permissions",
)
RESOURCE_FIELDS = ("verbs", "resources", "version", "namespace")
NON_RESOURCE_FIELDS = ("verbs", "path")
MATCH_FIELDS = ("type", "values")


class PolicyError(ValueError):
    """A policy that cannot be used: one line naming the rule index and field."""


@dataclass(frozen=True, slots=True)
class KeystonePolicy:
    rules: tuple[Rule, ...]
    # Rules kept that cannot match as written, keys k8s-keystone-auth ignores: one line each.
    notes: tuple[str, ...]


def parse_keystone_policy(text: bytes, source: str) -> KeystonePolicy:
    """The rules of a k8s-keystone-auth policy file; :class:`PolicyError` if unusable.
    ``source`` names the file in each rule's reason (``policy.json [3]``)."""
    try:
        doc = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise PolicyError(f"not valid JSON ({_position(text, exc.pos)})") from None
    if doc is None:
        doc = []  # Go decodes null into an empty list: no rule
    if not isinstance(doc, list):
        raise PolicyError("must be a JSON list of rules")
    notes: list[str] = []
    rules = tuple(
        Rule(f"{source} [{i}]", "allow", _compile(item, f"[{i}]", notes))
        for i, item in enumerate(doc)
    )
    return KeystonePolicy(rules, tuple(notes))


def _position(text: bytes, pos: int) -> str:
    line = text.count(b"\n", 0, pos) + 1
    return f"line {line}"


# --- reading, with Go's decoding rules ----------------------------------------------


def _fields(doc: Any, known: tuple[str, ...], where: str, notes: list[str]) -> dict[str, Any]:
    """``doc``'s known fields, matched as encoding/json matches them (any case; a later
    key wins); unknown keys are ignored there and noted here."""
    if not isinstance(doc, dict):
        raise PolicyError(f"{where}: must be an object")
    found: dict[str, Any] = {}
    for key, item in doc.items():
        name = key if key in known else next((k for k in known if k == key.lower()), None)
        if name is None:
            notes.append(f"{where}: key {key!r} is not part of the policy format (ignored)")
            continue
        found[name] = item
    return found


def _strings(item: Any, where: str) -> tuple[str, ...] | None:
    """A ``[]string``: None for a missing or null one, as Go's nil slice."""
    if item is None:
        return None
    if not isinstance(item, list) or not all(isinstance(s, str) for s in item):
        raise PolicyError(f"{where}: must be a list of strings")
    return tuple(item)


def _string(item: Any, where: str) -> str | None:
    if item is None:
        return None
    if not isinstance(item, str):
        raise PolicyError(f"{where}: must be a string")
    return item


def _string_lists(item: Any, where: str) -> dict[str, tuple[str, ...]] | None:
    """A ``map[string][]string``."""
    if item is None:
        return None
    if not isinstance(item, dict):
        raise PolicyError(f"{where}: must be an object of string lists")
    return {k: _strings(v, f"{where}[{k!r}]") or () for k, v in item.items()}


# --- one rule -------------------------------------------------------------------------


def _compile(item: Any, where: str, notes: list[str]) -> Check:
    if item is None:
        raise PolicyError(f"{where}: must be an object (null is not a rule)")
    doc = _fields(item, RULE_FIELDS, where, notes)
    gate = _users_gate(_string_lists(doc.get("users"), f"{where}.users"), where, notes)
    match = _match(doc.get("match"), f"{where}.match", notes)
    resource_permissions = _string_lists(
        doc.get("resource_permissions"), f"{where}.resource_permissions"
    )
    nonresource_permissions = _string_lists(
        doc.get("nonresource_permissions"), f"{where}.nonresource_permissions"
    )
    # The version 2 maps take precedence over the version 1 specs (Authorize).
    on_resource: Check | None = None
    if resource_permissions is not None:
        on_resource = _resource_permissions(resource_permissions, where, notes)
        _shadowed(doc.get("resource"), RESOURCE_FIELDS, f"{where}.resource", notes)
    elif doc.get("resource") is not None:
        on_resource = _resource_spec(doc["resource"], match, f"{where}.resource", notes)
    on_non_resource: Check | None = None
    if nonresource_permissions is not None:
        on_non_resource = _non_resource_permissions(nonresource_permissions)
        _shadowed(doc.get("nonresource"), NON_RESOURCE_FIELDS, f"{where}.nonresource", notes)
    elif doc.get("nonresource") is not None:
        on_non_resource = _non_resource_spec(
            doc["nonresource"], match, f"{where}.nonresource", notes
        )
    if on_resource is None and on_non_resource is None:
        notes.append(f"{where}: no resource, nonresource or permissions: never matches")

    def holds(review: AccessReview) -> bool:
        if gate is not None and not gate(review):
            return False
        check = on_resource if review.resource is not None else on_non_resource
        return check is not None and check(review)

    return holds


def _shadowed(item: Any, known: tuple[str, ...], where: str, notes: list[str]) -> None:
    """A ``resource`` or ``nonresource`` beside its permissions map: never read there
    (Authorize takes the map), but decoded all the same, so a field of the wrong type
    fails the whole file there as here; a missing ``version`` is not refused, since
    nothing dereferences it."""
    if item is None:
        return
    doc = _fields(item, known, where, notes)
    for name in ("verbs", "resources"):
        _strings(doc.get(name), f"{where}.{name}")
    for name in ("version", "namespace", "path"):
        _string(doc.get(name), f"{where}.{name}")
    kind = where.rsplit(".", 1)[1]
    notes.append(f"{where}: never read ({kind}_permissions takes precedence)")


def _users_gate(
    users: dict[str, tuple[str, ...]] | None, where: str, notes: list[str]
) -> Check | None:
    """``users``: every role listed, and one of the projects (Authorize: ``IsSuperset``
    and ``HasAny``; no projects listed: ``HasAny`` of nothing, never)."""
    if users is None:
        return None
    roles = frozenset(users.get("roles", ()))
    projects = frozenset(users.get("projects", ()))
    if not projects:
        notes.append(f"{where}.users: no projects listed: never matches")

    def gate(review: AccessReview) -> bool:
        extra = review.extra
        if not roles.issubset(extra.get(ROLES, ())):
            return False
        return not projects.isdisjoint(extra.get(PROJECT_NAME, ())) or not projects.isdisjoint(
            extra.get(PROJECT_ID, ())
        )

    return gate


def _match(item: Any, where: str, notes: list[str]) -> Check:
    """``match``: every entry must hold (authorizer.go ``match``); none listed: always."""
    if item is None:
        return _always
    if not isinstance(item, list):
        raise PolicyError(f"{where}: must be a list of {{type, values}} (version 1's format)")
    checks = [_match_entry(entry, f"{where}[{j}]", notes) for j, entry in enumerate(item)]
    checks = [c for c in checks if c is not _always]
    if not checks:
        return _always
    if len(checks) == 1:
        return checks[0]
    return lambda review: all(check(review) for check in checks)


def _always(review: AccessReview) -> bool:
    return True


def _match_entry(item: Any, where: str, notes: list[str]) -> Check:
    doc = _fields(item, MATCH_FIELDS, where, notes)
    kind = _string(doc.get("type"), f"{where}.type")
    if kind not in MATCH_TYPES:
        # k8s-keystone-auth logs "unknown type" and the whole rule never matches.
        shown = "missing" if kind is None else repr(kind)
        raise PolicyError(f"{where}.type: unknown match type {shown} (role, project, group, user)")
    values = frozenset(_strings(doc.get("values"), f"{where}.values") or ())
    if "*" in values:
        return _always
    if kind == "group":
        return lambda review: not values.isdisjoint(review.groups)
    if kind == "user":
        if "" in values:
            notes.append(
                f'{where}.values: "" matches every user (the uid compared is always empty: '
                "k8s-keystone-auth's webhook never reads spec.uid)"
            )
        # Its webhook builds the user from spec.user alone: the uid compared is "".
        return lambda review: review.user in values or "" in values
    if kind == "project":
        return lambda review: (
            not values.isdisjoint(review.extra.get(PROJECT_ID, ()))
            or not values.isdisjoint(review.extra.get(PROJECT_NAME, ()))
        )
    return lambda review: not values.isdisjoint(review.extra.get(ROLES, ()))


# --- version 1: resource and nonresource with match ---------------------------------


def _resource_spec(item: Any, match: Check, where: str, notes: list[str]) -> Check:
    doc = _fields(item, RESOURCE_FIELDS, where, notes)
    verbs = frozenset(_strings(doc.get("verbs"), f"{where}.verbs") or ())
    resources = frozenset(_strings(doc.get("resources"), f"{where}.resources") or ())
    api_group = _string(doc.get("version"), f"{where}.version")
    namespace = _string(doc.get("namespace"), f"{where}.namespace")
    for name, found in (("version", api_group), ("namespace", namespace)):
        if found is None:
            # resourceMatches dereferences both: the request fails there.
            raise PolicyError(f'{where}.{name}: required (a string, "*" for any)')
    if not verbs or not resources:
        notes.append(f"{where}: no verbs or no resources listed: never matches")
    any_verb, any_resource = "*" in verbs, "*" in resources

    def holds(review: AccessReview) -> bool:
        r = review.resource
        assert r is not None
        if api_group != "*" and api_group != r.group:  # "version" is the API group
            return False
        if namespace != "*" and namespace != r.namespace:
            return False
        if not any_resource:
            if r.subresource:
                if (
                    f"{r.resource}/*" not in resources
                    and f"{r.resource}/{r.subresource}" not in resources
                ):
                    return False
            elif r.resource not in resources:
                return False
        if not any_verb and r.verb not in verbs:
            return False
        return match(review)

    return holds


def _non_resource_spec(item: Any, match: Check, where: str, notes: list[str]) -> Check:
    doc = _fields(item, NON_RESOURCE_FIELDS, where, notes)
    verbs = frozenset(_strings(doc.get("verbs"), f"{where}.verbs") or ())
    path = _string(doc.get("path"), f"{where}.path")
    if "" in verbs or path is None:
        # nonResourceMatches skips the rule: "verb is empty" / "path should be set".
        notes.append(f"{where}: an empty verb or no path: never matches")
        return _never
    any_verb = "*" in verbs
    # A trailing "*" matches every path that starts with what is before it.
    prefix = path.rstrip("*") if path.endswith("*") else None

    def holds(review: AccessReview) -> bool:
        n = review.non_resource
        assert n is not None
        if not any_verb and n.verb not in verbs:
            return False
        if (
            path != "*"
            and path != n.path
            and not (prefix is not None and n.path.startswith(prefix))
        ):
            return False
        return match(review)

    return holds


def _never(review: AccessReview) -> bool:
    return False


# --- version 2: the permission maps ---------------------------------------------------


def _resource_permissions(spec: dict[str, tuple[str, ...]], where: str, notes: list[str]) -> Check:
    """resourcePermissionAllowed: any key ``namespace/resource`` whose sides allow the
    request's namespace and resource (never its subresource) and whose verbs its verb."""
    entries: list[tuple[Callable[[str], bool], Callable[[str], bool], frozenset[str]]] = []
    for key, verbs in spec.items():
        sides = key.split("/")
        if len(sides) != 2:
            notes.append(f"{where}.resource_permissions[{key!r}]: not namespace/resource (skipped)")
            continue
        namespaces, resources = (_allowed(side.strip().lower()) for side in sides)
        entries.append((namespaces, resources, frozenset(v.lower() for v in verbs)))

    def holds(review: AccessReview) -> bool:
        r = review.resource
        assert r is not None
        return any(
            namespaces(r.namespace) and resources(r.resource) and (r.verb in verbs or "*" in verbs)
            for namespaces, resources, verbs in entries
        )

    return holds


def _allowed(definition: str) -> Callable[[str], bool]:
    """getAllowed for one side of a key, as a test of a name: the name itself or ``*``;
    ``!name``: any but it (``!*``: none); ``['a', 'b']``: those (``'*'`` among them:
    any); ``!['a', 'b']``: any but those; an empty name (cluster-scoped, or every
    namespace) always. A list that is not JSON once its quotes are doubled, or any other
    spelling, allows nothing but the empty name (getAllowed's error skips the key)."""
    last = len(definition) - 1

    def always(name: str) -> bool:
        return name in ("", definition) or definition == "*"

    if definition.startswith("!") and definition.find("[") != 1:
        excluded = definition[1:]
        return lambda name: always(name) or excluded not in (name, "*")
    if definition.startswith("[") and definition.find("]") == last:
        listed = _quoted_list(definition)
        if listed is None:
            return always
        return lambda name: always(name) or "*" in listed or name in listed
    if definition.startswith("![") and definition.find("]") == last:
        refused = _quoted_list(definition[1:])
        if refused is None:
            return always
        return lambda name: always(name) or not (name in refused or "*" in refused)
    return always


def _quoted_list(definition: str) -> frozenset[str] | None:
    """``['a', 'b']`` read as getAllowed reads it: single quotes made double, then JSON."""
    try:
        items = json.loads(definition.replace("'", '"'))
    except ValueError:
        return None
    if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
        return None
    return frozenset(items)


def _non_resource_permissions(spec: Mapping[str, tuple[str, ...]]) -> Check:
    """nonResourcePermissionAllowed: the path exactly (no wildcard), and the verb (as
    written: these verbs are not lowered) or ``*``."""
    verbs_by_path = {path: frozenset(verbs) for path, verbs in spec.items()}

    def holds(review: AccessReview) -> bool:
        n = review.non_resource
        assert n is not None
        verbs = verbs_by_path.get(n.path)
        return verbs is not None and (n.verb in verbs or "*" in verbs)

    return holds
