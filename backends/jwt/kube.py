"""kube-apiserver's ``AuthenticationConfiguration.jwt`` entry, with kube's field names.

A block can be pasted between a kube AuthenticationConfiguration and the gateway's
config unchanged. Validation follows kube's documented rules (apiserver.config.k8s.io
/v1 ``JWTAuthenticator``); the differences are listed in docs/backends/jwt.md.
Every CEL expression is compiled here, at load, so a bad one is a config error that
names its field and quotes the expression.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from backends.jwt.cel import check_expression

Expression = Annotated[str, AfterValidator(check_expression)]

# kube: extra keys are lowercase domain-prefixed paths ("example.com/tenant").
_EXTRA_KEY = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[a-z0-9][-a-z0-9._~/]*")
_RESERVED_EXTRA_DOMAINS = ("kubernetes.io", "k8s.io")


class KubeShape(BaseModel):
    """kube's camelCase names; unknown keys are errors, as in the rest of the config."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class Issuer(KubeShape):
    url: str = Field(pattern=r"^https://[^?#]+$")
    # Where discovery is fetched from, when not {url}/.well-known/openid-configuration.
    # The document's "issuer" must still equal url (kube's rule).
    discovery_url: str | None = Field(default=None, alias="discoveryURL", pattern=r"^https://")
    # PEM bundle trusted for discovery and JWKS; the system store when unset.
    certificate_authority: str | None = Field(default=None, alias="certificateAuthority")
    audiences: list[Annotated[str, Field(min_length=1)]] = Field(min_length=1)
    audience_match_policy: Literal["MatchAny", ""] = Field(default="", alias="audienceMatchPolicy")

    @model_validator(mode="after")
    def _check(self) -> Issuer:
        if self.discovery_url is not None and self.discovery_url.rstrip("/") == self.url.rstrip(
            "/"
        ):
            raise ValueError("discoveryURL: must differ from url (omit it instead)")
        if len(set(self.audiences)) != len(self.audiences):
            raise ValueError("audiences: duplicate entries")
        if len(self.audiences) > 1 and self.audience_match_policy != "MatchAny":
            raise ValueError("audienceMatchPolicy: must be MatchAny when audiences has several")
        if self.certificate_authority is not None and (
            "-----BEGIN CERTIFICATE-----" not in self.certificate_authority
        ):
            raise ValueError("certificateAuthority: must be PEM-encoded certificates")
        return self


class ClaimValidationRule(KubeShape):
    claim: str | None = None
    required_value: str | None = Field(default=None, alias="requiredValue")
    expression: Expression | None = None
    message: str = ""

    @model_validator(mode="after")
    def _check(self) -> ClaimValidationRule:
        if (self.claim is None) == (self.expression is None):
            raise ValueError("set exactly one of claim or expression")
        if self.claim is not None and self.required_value is None:
            raise ValueError("requiredValue: required when claim is set")
        if self.claim is not None and self.message:
            raise ValueError("message: only with expression")
        if self.expression is not None and self.required_value is not None:
            raise ValueError("requiredValue: only with claim")
        return self


class PrefixedClaimOrExpression(KubeShape):
    claim: str | None = None
    prefix: str | None = None
    expression: Expression | None = None

    @model_validator(mode="after")
    def _check(self) -> PrefixedClaimOrExpression:
        if (self.claim is None) == (self.expression is None):
            raise ValueError("set exactly one of claim or expression")
        if self.claim is not None and self.prefix is None:
            # kube: explicit, so nobody gets an unprefixed namespace by accident.
            raise ValueError('prefix: required when claim is set (use "" for none)')
        if self.expression is not None and self.prefix is not None:
            raise ValueError("prefix: only with claim")
        return self


class ClaimOrExpression(KubeShape):
    claim: str | None = None
    expression: Expression | None = None

    @model_validator(mode="after")
    def _check(self) -> ClaimOrExpression:
        if (self.claim is None) == (self.expression is None):
            raise ValueError("set exactly one of claim or expression")
        return self


class ExtraMapping(KubeShape):
    key: str
    value_expression: Expression = Field(alias="valueExpression")

    @model_validator(mode="after")
    def _check(self) -> ExtraMapping:
        if not _EXTRA_KEY.fullmatch(self.key):  # not match + $: that lets a \n through
            raise ValueError(f"key: {self.key!r} must be a lowercase domain-prefixed path")
        domain = self.key.split("/", 1)[0]
        if any(domain == d or domain.endswith("." + d) for d in _RESERVED_EXTRA_DOMAINS):
            raise ValueError(f"key: {self.key!r} uses a reserved domain")
        return self


class ClaimMappings(KubeShape):
    username: PrefixedClaimOrExpression
    groups: PrefixedClaimOrExpression | None = None
    uid: ClaimOrExpression | None = None
    extra: list[ExtraMapping] = Field(default_factory=list)

    @model_validator(mode="after")
    def _check(self) -> ClaimMappings:
        keys = [e.key for e in self.extra]
        for key in keys:
            if keys.count(key) > 1:
                raise ValueError(f"extra: key {key!r} is used twice")
        return self


class UserValidationRule(KubeShape):
    expression: Expression
    message: str = ""


class ClaimRules(KubeShape):
    """The claim-handling half of a jwt entry; the introspection backend shares it."""

    claim_validation_rules: list[ClaimValidationRule] = Field(
        default_factory=list, alias="claimValidationRules"
    )
    claim_mappings: ClaimMappings = Field(alias="claimMappings")
    user_validation_rules: list[UserValidationRule] = Field(
        default_factory=list, alias="userValidationRules"
    )

    @model_validator(mode="after")
    def _email_needs_email_verified(self) -> ClaimRules:
        # kube: a username expression that reads claims.email must also look at
        # claims.email_verified somewhere, or unverified addresses would log in.
        username = self.claim_mappings.username.expression
        if username is None or "claims.email" not in username.replace("claims.email_", ""):
            return self
        places = [username]
        places += [e.value_expression for e in self.claim_mappings.extra]
        places += [r.expression for r in self.claim_validation_rules if r.expression]
        if not any("claims.email_verified" in p for p in places):
            raise ValueError(
                "claimMappings.username.expression: uses claims.email, so claims.email_verified "
                "must be used in it, in an extra valueExpression or in a claimValidationRule"
            )
        return self
