"""Verified claims to a Kubernetes user, in kube's order and with kube's rules.

claimValidationRules, then claimMappings, then userValidationRules. Every failure
is a :class:`Rejected`: it is decided by the token's own claims, so it says nothing
about the issuer's health and must never count against it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from backends.base import Rejected, UserInfo

from .cel import CelEvaluationError, evaluate
from .kube import ClaimOrExpression, ClaimRules, PrefixedClaimOrExpression


class MappingRefused(Exception):
    """The claims do not make a user; the message is safe for logs (no claim values)."""


def map_claims(rules: ClaimRules, claims: Mapping[str, Any]) -> UserInfo | Rejected:
    try:
        return _map(rules, dict(claims))
    except MappingRefused as exc:
        return Rejected(str(exc))
    except CelEvaluationError as exc:
        return Rejected(f"CEL evaluation failed: {exc}")


def _map(rules: ClaimRules, claims: dict[str, Any]) -> UserInfo:
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
    for mapping in m.extra:
        values = _strings(evaluate(mapping.value_expression, variables), f"extra[{mapping.key}]")
        values = tuple(v for v in values if v)  # kube drops empty values
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
        value = claims.get(spec.claim)
        # kube applies claims.?email_verified.orValue(true) == true for this claim.
        if spec.claim == "email" and claims.get("email_verified", True) is not True:
            raise MappingRefused("email_verified is not true")
        if not isinstance(value, str) or not value:
            raise MappingRefused(f"username claim {spec.claim!r} missing or not a string")
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
        value = claims.get(spec.claim)
        if value is None:
            return ()
        return tuple((spec.prefix or "") + g for g in _strings(value, "groups claim"))
    assert spec.expression is not None
    return _strings(evaluate(spec.expression, variables), "groups expression")


def _uid(spec: ClaimOrExpression, claims: dict[str, Any], variables: dict[str, Any]) -> str:
    if spec.claim is not None:
        value = claims.get(spec.claim)
        if value is None:
            return ""
        if not isinstance(value, str):
            raise MappingRefused(f"uid claim {spec.claim!r} is not a string")
        return value
    assert spec.expression is not None
    value = evaluate(spec.expression, variables)
    if not isinstance(value, str):
        raise MappingRefused("uid expression did not give a string")
    return value


def _strings(value: Any, what: str) -> tuple[str, ...]:
    """kube accepts a string or a list of strings wherever a list of strings goes."""
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list | tuple) and all(isinstance(v, str) for v in value):
        return tuple(value)
    raise MappingRefused(f"{what} is not a string or a list of strings")
