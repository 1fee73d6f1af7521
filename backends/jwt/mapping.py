"""Verified claims to a Kubernetes user, with kube's rules.

claimValidationRules, then claimMappings, then userValidationRules (kube maps first
and validates after; the decision is the same either way). Every failure is a
:class:`Rejected`: it is decided by the token's own claims, so it says nothing about
the issuer's health and must never count against it.

The rules are those of kube-apiserver's ``oidc.go`` (``getUsername``, ``getGroups``,
``getUID``, ``getExtra``, ``getCredentialID``, ``convertCELValueToStringList``), where
a claim is read with Go's ``json.Unmarshal`` into a string or a list of strings: a
``null`` reads as "" (in a list too), a missing claim is an error, a wrong type is an
error. docs/backends/jwt.md has the table, each row pinned by a test.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from backends.base import CREDENTIAL_ID_KEY, Rejected, UserInfo
from backends.jwt.cel import CelEvaluationError, evaluate
from backends.jwt.kube import ClaimOrExpression, ClaimRules, PrefixedClaimOrExpression


class MappingRefused(Exception):
    """The claims do not make a user; the message is safe for logs (no claim values)."""


def map_claims(
    rules: ClaimRules, claims: Mapping[str, Any], *, credential_id: bool = False
) -> UserInfo | Rejected:
    """``credential_id``: add kube's credential id from ``jti`` (the jwt backend does;
    introspection answers are not JWTs, and kube never sees them)."""
    try:
        return _map(rules, dict(claims), credential_id)
    except MappingRefused as exc:
        return Rejected(str(exc))
    except CelEvaluationError as exc:
        return Rejected(f"CEL evaluation failed: {exc}")


def _map(rules: ClaimRules, claims: dict[str, Any], credential_id: bool) -> UserInfo:
    variables = {"claims": claims}
    for i, rule in enumerate(rules.claim_validation_rules):
        if rule.claim is not None:
            if claims.get(rule.claim) != rule.required_value:
                raise MappingRefused(f"claimValidationRules[{i}]: claim {rule.claim!r} mismatch")
        elif rule.expression is not None and evaluate(rule.expression, variables) is not True:
            raise MappingRefused(rule.message or f"claimValidationRules[{i}] failed")

    m = rules.claim_mappings
    username = _username(m.username, claims, variables)
    groups = _groups(m.groups, claims, variables) if m.groups is not None else ()
    uid = _uid(m.uid, claims, variables) if m.uid is not None else ""
    extra: dict[str, tuple[str, ...]] = {}
    jti = claims.get("jti")
    if credential_id and isinstance(jti, str) and jti:
        # oidc.go getCredentialID -> CredentialIDForJTI: a jti that is not a string,
        # or is empty, gives none (and refuses nothing).
        extra[CREDENTIAL_ID_KEY] = (f"JTI={jti}",)
    for mapping in m.extra:
        values = _cel_strings(
            evaluate(mapping.value_expression, variables), f"extra[{mapping.key}]"
        )
        if values:
            extra[mapping.key] = values
    user = UserInfo(username=username, uid=uid, groups=groups, extra=extra)

    if rules.user_validation_rules:
        user_var = {
            "user": {
                "username": user.username,
                "uid": user.uid,
                "groups": list(user.groups),
                "extra": {k: list(v) for k, v in user.extra.items()},
            }
        }
        for i, urule in enumerate(rules.user_validation_rules):
            if evaluate(urule.expression, user_var) is not True:
                raise MappingRefused(urule.message or f"userValidationRules[{i}] failed")
    return user


def _username(
    spec: PrefixedClaimOrExpression, claims: dict[str, Any], variables: dict[str, Any]
) -> str:
    if spec.claim is not None:
        value = _string_claim(claims, spec.claim, "username")
        # kube: when present, email_verified must read as the boolean true ("true", a
        # string, does not parse; null reads as false).
        if spec.claim == "email" and claims.get("email_verified", True) is not True:
            raise MappingRefused("email_verified is not true")
        if not value:
            # Differs on purpose: kube lets an empty or null claim through as the prefix
            # alone (or ""), so every such token is one user. The gateway refuses it,
            # as kube itself refuses an empty username from an expression.
            raise MappingRefused(f"username claim {spec.claim!r} is empty")
        return (spec.prefix or "") + value
    assert spec.expression is not None
    value = evaluate(spec.expression, variables)
    if not isinstance(value, str):
        raise MappingRefused("username expression did not give a string")
    if not value:
        raise MappingRefused("username expression gave an empty string")
    return value


def _groups(
    spec: PrefixedClaimOrExpression, claims: dict[str, Any], variables: dict[str, Any]
) -> tuple[str, ...]:
    if spec.claim is not None:
        # oidc.go getGroups: a string or a list of strings (stringOrArray); null, or no
        # claim at all, is no groups; a null in the list reads as "".
        value = claims.get(spec.claim)
        if value is None:
            return ()
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not all(v is None or isinstance(v, str) for v in value):
            raise MappingRefused(
                f"groups claim {spec.claim!r} is not a string or a list of strings"
            )
        return tuple((spec.prefix or "") + (g or "") for g in value)
    assert spec.expression is not None
    return _cel_strings(evaluate(spec.expression, variables), "groups expression")


def _uid(spec: ClaimOrExpression, claims: dict[str, Any], variables: dict[str, Any]) -> str:
    if spec.claim is not None:
        # oidc.go getUID: unmarshalClaim, so a missing claim is refused ("claim not
        # present"); null reads as "".
        return _string_claim(claims, spec.claim, "uid") or ""
    assert spec.expression is not None
    value = evaluate(spec.expression, variables)
    if not isinstance(value, str):
        raise MappingRefused("uid expression did not give a string")
    return value


def _string_claim(claims: dict[str, Any], name: str, what: str) -> str | None:
    """Claim ``name``, a string or null (None); refused when missing or of another type,
    as kube's ``unmarshalClaim`` into a string refuses it."""
    if name not in claims:
        raise MappingRefused(f"{what} claim {name!r} not present")
    value = claims[name]
    if value is not None and not isinstance(value, str):
        raise MappingRefused(f"{what} claim {name!r} is not a string")
    return value


def _cel_strings(value: Any, what: str) -> tuple[str, ...]:
    """oidc.go ``convertCELValueToStringList``: a string or a list of strings, empty
    strings dropped; null, "" and [] are no values; anything else is an error."""
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,) if value else ()
    if isinstance(value, list | tuple) and all(isinstance(v, str) for v in value):
        return tuple(v for v in value if v)
    raise MappingRefused(f"{what} is not a string or a list of strings")
