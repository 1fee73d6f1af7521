"""The jwt backend's configuration: kube's AuthenticationConfiguration.jwt shape and
rules, CEL compiled at load, errors that name the entry and the expression."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml

from authn_gateway.config import ConfigError, parse_config
from backends.base import Rejected, UserInfo
from backends.jwt.kube import ClaimRules
from backends.jwt.mapping import map_claims

# Pasted from the Kubernetes documentation's AuthenticationConfiguration example
# (structured authentication configuration), one jwt entry, unchanged.
KUBE_ENTRY = """
issuer:
  url: https://example.com
  discoveryURL: https://discovery.example.com/.well-known/openid-configuration
  audiences:
  - my-app
  - my-other-app
  audienceMatchPolicy: MatchAny
claimValidationRules:
- expression: 'claims.hd == "example.com"'
  message: the hd claim must be set to example.com
- claim: tenant
  requiredValue: acme
claimMappings:
  username:
    expression: 'claims.username + ":external-user"'
  groups:
    expression: 'claims.roles.split(",")'
  uid:
    expression: 'claims.sub'
  extra:
  - key: 'example.com/tenant'
    valueExpression: 'claims.tenant'
userValidationRules:
- expression: "!user.username.startsWith('system:')"
  message: 'username cannot used reserved system: prefix'
- expression: "user.groups.all(group, !group.startsWith('system:'))"
  message: 'groups cannot used reserved system: prefix'
"""


def gateway_yaml(entry: dict[str, Any]) -> str:
    backend = {"name": "oidc", "type": "jwt", **entry}
    return yaml.safe_dump({"backends": [backend]})


def problems(entry: dict[str, Any]) -> list[str]:
    with pytest.raises(ConfigError) as err:
        parse_config(gateway_yaml(entry), "gw.yaml")
    return err.value.problems


def entry() -> dict[str, Any]:
    return copy.deepcopy(yaml.safe_load(KUBE_ENTRY))


def test_a_kube_jwt_entry_is_accepted_unchanged() -> None:
    config = parse_config(gateway_yaml(entry()), "gw.yaml")
    backend = config.backends[0]
    assert backend.type == "jwt"
    assert backend.issuer.audiences == ["my-app", "my-other-app"]  # type: ignore[union-attr]


def test_the_kube_example_maps_claims_as_kube_does() -> None:
    rules = ClaimRules.model_validate({k: v for k, v in entry().items() if k != "issuer"})
    claims = {"hd": "example.com", "tenant": "acme", "username": "jane", "roles": "a,b", "sub": "1"}
    assert map_claims(rules, claims) == UserInfo(
        username="jane:external-user",
        uid="1",
        groups=("a", "b"),
        extra={"example.com/tenant": ("acme",)},
    )
    assert isinstance(map_claims(rules, {**claims, "hd": "evil.com"}), Rejected)
    assert isinstance(map_claims(rules, {**claims, "tenant": "other"}), Rejected)
    assert isinstance(map_claims(rules, {**claims, "roles": "system:masters"}), Rejected)
    # A missing claim in an expression refuses; it is never an error of the issuer.
    no_roles = {k: v for k, v in claims.items() if k != "roles"}
    assert isinstance(map_claims(rules, no_roles), Rejected)


def test_a_bad_cel_expression_names_the_field_and_quotes_the_expression() -> None:
    e = entry()
    e["claimMappings"]["groups"]["expression"] = "claims.roles.split(,"
    [problem] = problems(e)
    assert problem.startswith("backends[0].claimMappings.groups.expression:")
    assert "claims.roles.split(," in problem


def test_username_claim_needs_an_explicit_prefix() -> None:
    e = entry()
    e["claimMappings"]["username"] = {"claim": "sub"}
    [problem] = problems(e)
    assert "backends[0].claimMappings.username" in problem
    assert "prefix" in problem


def test_a_username_expression_on_email_must_look_at_email_verified() -> None:
    e = entry()
    e["claimMappings"]["username"] = {"expression": "claims.email"}
    assert "email_verified" in problems(e)[0]
    e["claimValidationRules"].append({"expression": "claims.?email_verified.orValue(true)"})
    # The bindings do not parse optional syntax (.?): that is a documented difference.
    assert "cannot compile CEL" in problems(e)[0]
    e["claimValidationRules"][-1] = {"expression": "claims.email_verified == true"}
    parse_config(gateway_yaml(e), "gw.yaml")


def test_username_claim_email_requires_email_verified_true_when_present() -> None:
    rules = ClaimRules.model_validate(
        {"claimMappings": {"username": {"claim": "email", "prefix": ""}}}
    )
    assert map_claims(rules, {"email": "a@x"}) == UserInfo(username="a@x")
    assert isinstance(map_claims(rules, {"email": "a@x", "email_verified": False}), Rejected)
    assert isinstance(map_claims(rules, {"email": "a@x", "email_verified": "true"}), Rejected)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda e: e["issuer"].update(url="http://example.com"), "issuer.url"),
        (lambda e: e["issuer"].update(audiences=[]), "issuer.audiences"),
        (lambda e: e["issuer"].pop("audienceMatchPolicy"), "issuer"),
        (lambda e: e["issuer"].update(certificateAuthority="not pem"), "issuer"),
        (lambda e: e["claimMappings"]["extra"][0].update(key="tenant"), "extra[0]"),
        (lambda e: e["claimMappings"]["extra"][0].update(key="kubernetes.io/x"), "extra[0]"),
        (lambda e: e["claimMappings"]["extra"][0].update(key="example.com/t\n"), "extra[0]"),
        (lambda e: e["claimValidationRules"][1].pop("requiredValue"), "claimValidationRules[1]"),
        (lambda e: e.update(egressSelectorType="controlplane"), "egressSelectorType"),
    ],
)
def test_kube_validation_rules_are_config_errors(change: Any, field: str) -> None:
    e = entry()
    change(e)
    assert any(field in p for p in problems(e)), problems(e)
