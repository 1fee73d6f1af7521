"""The jwt backend decides and maps as kube-apiserver's structured JWT authenticator
does (issue 30), row by row of the table in docs/backends/jwt.md.

Each case names the kube source rule it encodes. The sources (kube v1.32-v1.33):

* ``oidc.go``: staging/src/k8s.io/apiserver/plugin/pkg/authenticator/token/oidc/oidc.go
* ``verify.go``, ``go-oidc oidc.go``: staging/src/k8s.io/apiserver/third_party/forked/
  go-oidc/ (the fork of coreos/go-oidc kube verifies with)
* ``go-jose``: vendor/gopkg.in/go-jose/go-jose.v2 (jws.go parseSignedCompact,
  signing.go DetachedVerify)
* ``options``: pkg/kubeapiserver/options/authentication.go (ToAuthenticationConfig:
  with an AuthenticationConfiguration, every algorithm in oidc.go allowedSigningAlgs)

A case marked ``DIFFERS`` is a deliberate difference; the docs say why. Every case
runs against the real backend, verifying against the fake issuer's keys over TLS.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from backends.base import Authenticated, Rejected, UserInfo
from backends.jwt import idtoken
from backends.jwt.kube import ClaimRules
from backends.jwt.mapping import CREDENTIAL_ID_KEY, map_claims
from tests.support.fakes.issuer import FakeIssuer
from tests.support.jwt_backend import InThread, jwt_settings

AUDIENCES = {"audiences": ["gateway", "other"], "audienceMatchPolicy": "MatchAny"}

# The claimMappings each case is decided under (the same entry kube would be given).
MAPPINGS: dict[str, dict[str, Any]] = {
    "claims": {
        "claimMappings": {
            "username": {"claim": "sub", "prefix": "oidc:"},
            "groups": {"claim": "groups", "prefix": "oidc:"},
            "uid": {"claim": "uid"},
        },
        "claimValidationRules": [{"claim": "hd", "requiredValue": "example.com"}],
    },
    "email": {
        "claimMappings": {
            "username": {"claim": "email", "prefix": ""},
            "uid": {"claim": "sub"},
        },
    },
    "cel": {
        "claimMappings": {
            "username": {"expression": "claims.name"},
            "groups": {"expression": "claims.roles"},
            "uid": {"expression": "claims.id"},
            "extra": [{"key": "example.com/tier", "valueExpression": "claims.tier"}],
        },
        "claimValidationRules": [{"expression": "claims.level", "message": "level"}],
        "userValidationRules": [
            {
                "expression": f"!('{CREDENTIAL_ID_KEY}' in user.extra)"
                " || user.username != 'no-jti'",
                "message": "this user must not come with a jti",
            }
        ],
    },
}


def base_claims(issuer: FakeIssuer, mapping: str) -> dict[str, Any]:
    now = int(time.time())
    claims: dict[str, Any] = {
        "iss": issuer.issuer,
        "sub": "alice",
        "aud": "gateway",
        "iat": now,
        "exp": now + 600,
    }
    claims.update(
        {
            "claims": {"uid": "u-1", "groups": ["dev"], "hd": "example.com"},
            "email": {"email": "alice@example.com"},
            "cel": {"name": "alice", "roles": ["dev"], "id": "u-1", "tier": "gold", "level": True},
        }[mapping]
    )
    return claims


@dataclass(frozen=True)
class Case:
    name: str
    # The kube source and function whose rule this is.
    kube: str
    # Claims to set over the mapping's base claims (None removes one).
    claims: dict[str, Any] = field(default_factory=dict)
    mapping: str = "claims"
    # None: refused. Else the user fields expected (a subset).
    user: dict[str, Any] | None = None
    # A token made another way: (issuer, claims) -> token.
    mint: Callable[[FakeIssuer, dict[str, Any]], str] | None = None
    differs: bool = False


def now() -> int:
    return int(time.time())


OK = {"username": "oidc:alice"}

CASES = [
    # --- exp, nbf, iat ---------------------------------------------------------------------
    Case(
        "exp 30 s ago",
        "verify.go Verify: t.Expiry.Before(now), no leeway",
        {"exp": lambda: now() - 30},
    ),
    Case("exp 30 s ahead", "verify.go Verify", {"exp": lambda: now() + 30}, user=OK),
    Case("no exp", "verify.go Verify: a zero Expiry is before now", {"exp": None}),
    Case(
        "exp a numeric string",
        "go-oidc oidc.go jsonTime: json.Number from a string",
        {"exp": lambda: str(now() + 600)},
        user=OK,
    ),
    Case(
        "exp a float",
        "go-oidc oidc.go jsonTime: Float64, truncated",
        {"exp": lambda: now() + 600.5},
        user=OK,
    ),
    Case("exp not a number", "go-oidc oidc.go jsonTime: unmarshal error", {"exp": "soon"}),
    Case(
        "exp null",
        "go-oidc oidc.go jsonTime: UnmarshalJSON(null) has no number",
        {"exp": "null-json"},
    ),
    Case("exp true", "go-oidc oidc.go jsonTime: unmarshal error", {"exp": True}),
    Case(
        "exp past int64",
        "go-oidc oidc.go jsonTime: int64(f), CPU-defined",
        {"exp": 1e20},
        differs=True,
    ),
    Case(
        "exp as EXP",
        "encoding/json: struct keys match case-insensitively",
        {"exp": None, "EXP": lambda: now() + 600},
        user=OK,
    ),
    Case(
        "exp then EXP in the past",
        "encoding/json: the last matching key wins",
        {"EXP": lambda: now() - 30},
    ),
    Case(
        "nbf 30 s ahead",
        "verify.go Verify: nbf leeway 1 minute",
        {"nbf": lambda: now() + 30},
        user=OK,
    ),
    Case("nbf 90 s ahead", "verify.go Verify: nbf leeway 1 minute", {"nbf": lambda: now() + 90}),
    Case(
        "nbf null",
        "go-oidc oidc.go idToken.NotBefore *jsonTime: null is nil",
        {"nbf": "null-json"},
        user=OK,
    ),
    Case("nbf not a number", "go-oidc oidc.go jsonTime: unmarshal error", {"nbf": "soon"}),
    Case(
        "iat 10 min ahead",
        "verify.go Verify: iat is not checked",
        {"iat": lambda: now() + 600},
        user=OK,
    ),
    Case(
        "iat not a number",
        "go-oidc oidc.go idToken.IssuedAt jsonTime: unmarshal error",
        {"iat": "soon"},
    ),
    Case(
        "iat null",
        "go-oidc oidc.go jsonTime: UnmarshalJSON(null) has no number",
        {"iat": "null-json"},
    ),
    # --- iss, aud, standard claims ---------------------------------------------------------
    Case(
        "another iss",
        "oidc.go hasCorrectIssuer / verify.go issuer check",
        {"iss": "https://elsewhere.example"},
    ),
    Case("iss a number", "oidc.go untrustedIssuer: unmarshal error", {"iss": 7}),
    Case(
        "iss as ISS",
        "oidc.go untrustedIssuer: case-insensitive key",
        {"iss": None, "ISS": "ISSUER"},
        user=OK,
    ),
    Case(
        "aud one of several",
        "oidc.go verifyAudience: audiences.HasAny",
        {"aud": ["x", "other"]},
        user=OK,
    ),
    Case("aud another", "oidc.go verifyAudience", {"aud": "someone-else"}),
    Case("no aud", "oidc.go verifyAudience: no audience matches", {"aud": None}),
    Case(
        "aud with a null",
        'go-oidc oidc.go audience: []string, null reads as ""',
        {"aud": ["gateway", "null-json"]},
        user=OK,
    ),
    Case("aud a number", "go-oidc oidc.go audience: unmarshal error", {"aud": 7}),
    Case("sub a number", "go-oidc oidc.go idToken.Subject string", {"sub": 7}),
    Case("nonce a list", "go-oidc oidc.go idToken.Nonce string", {"nonce": ["n"]}),
    Case("at_hash an object", "go-oidc oidc.go idToken.AtHash string", {"at_hash": {}}),
    Case(
        "_claim_names with no source",
        "verify.go Verify: source does not exist",
        {"_claim_names": {"groups": "src"}},
    ),
    Case(
        '_claim_names naming ""',
        "verify.go Verify: failed to obtain source",
        {"_claim_names": {"x": ""}, "_claim_sources": {}},
    ),
    Case(
        "distributed groups",
        "oidc.go claimResolver.expand: kube fetches the endpoint",
        {
            "groups": None,
            "_claim_names": {"groups": "s"},
            "_claim_sources": {"s": {"endpoint": "https://claims.example/groups"}},
        },
        differs=True,
    ),
    Case(
        "aggregated groups",
        "oidc.go claimResolver.expand: no endpoint, ignored",
        {"groups": None, "_claim_names": {"groups": "s"}, "_claim_sources": {"s": {"JWT": "x"}}},
        user={"username": "oidc:alice", "groups": ()},
    ),
    # --- username --------------------------------------------------------------------------
    Case("username prefixed", "oidc.go getUsername: prefix + claim", user=OK),
    Case(
        "no username claim", "oidc.go getUsername: unmarshalClaim, claim not present", {"sub": None}
    ),
    Case("username a number", "oidc.go getUsername: unmarshal into string", {"sub": 7}),
    Case(
        'username ""', "oidc.go getUsername: kube gives the prefix alone", {"sub": ""}, differs=True
    ),
    Case(
        "email verified",
        "oidc.go getUsername: email_verified true",
        {"email_verified": True},
        mapping="email",
        user={"username": "alice@example.com"},
    ),
    Case(
        "email without email_verified",
        "oidc.go getUsername: only checked when present",
        mapping="email",
        user={"username": "alice@example.com"},
    ),
    Case(
        "email not verified",
        "oidc.go getUsername: email not verified",
        {"email_verified": False},
        mapping="email",
    ),
    Case(
        'email_verified "true"',
        "oidc.go getUsername: unmarshal into bool",
        {"email_verified": "true"},
        mapping="email",
    ),
    Case(
        "email_verified null",
        "oidc.go getUsername: null reads as false",
        {"email_verified": "null-json"},
        mapping="email",
    ),
    Case(
        "username expression",
        "oidc.go getUsername: CEL string",
        mapping="cel",
        user={"username": "alice"},
    ),
    Case(
        'username expression ""',
        "oidc.go getUsername: empty username via CEL",
        {"name": ""},
        mapping="cel",
    ),
    Case(
        "username expression a number",
        "oidc.go getUsername: must return a string",
        {"name": 7},
        mapping="cel",
    ),
    # --- groups ----------------------------------------------------------------------------
    Case(
        "groups a list",
        "oidc.go getGroups: stringOrArray, prefixed",
        {"groups": ["dev", "ops"]},
        user={"groups": ("oidc:dev", "oidc:ops")},
    ),
    Case(
        "groups a string",
        "oidc.go getGroups: stringOrArray",
        {"groups": "dev"},
        user={"groups": ("oidc:dev",)},
    ),
    Case(
        "no groups claim",
        "oidc.go getGroups: absent, no groups",
        {"groups": None},
        user={"groups": ()},
    ),
    Case(
        "groups null",
        "oidc.go getGroups: null unmarshals to no groups",
        {"groups": "null-json"},
        user={"groups": ()},
    ),
    Case(
        "groups with a null",
        'oidc.go getGroups: a null in []string reads as ""',
        {"groups": ["dev", "null-json"]},
        user={"groups": ("oidc:dev", "oidc:")},
    ),
    Case(
        "groups with a number", "oidc.go getGroups: unmarshal into []string", {"groups": ["dev", 7]}
    ),
    Case(
        "groups expression",
        "oidc.go convertCELValueToStringList",
        mapping="cel",
        user={"groups": ("dev",)},
    ),
    Case(
        'groups expression drops ""',
        "oidc.go convertCELValueToStringList",
        {"roles": ["dev", ""]},
        mapping="cel",
        user={"groups": ("dev",)},
    ),
    Case(
        "groups expression null",
        "oidc.go convertCELValueToStringList: null, none",
        {"roles": "null-json"},
        mapping="cel",
        user={"groups": ()},
    ),
    Case(
        "groups expression a number",
        "oidc.go convertCELValueToStringList: error",
        {"roles": 7},
        mapping="cel",
    ),
    # --- uid -------------------------------------------------------------------------------
    Case("uid claim", "oidc.go getUID: unmarshalClaim", user={"uid": "u-1"}),
    Case("no uid claim", "oidc.go getUID: parse uid claim: claim not present", {"uid": None}),
    Case(
        "uid null", 'oidc.go getUID: null unmarshals to ""', {"uid": "null-json"}, user={"uid": ""}
    ),
    Case("uid a number", "oidc.go getUID: unmarshal into string", {"uid": 7}),
    Case(
        "uid expression a number", "oidc.go getUID: must return a string", {"id": 7}, mapping="cel"
    ),
    # --- extra and the credential id -------------------------------------------------------
    Case(
        "extra expression",
        "oidc.go getExtra",
        mapping="cel",
        user={"extra": {"example.com/tier": ("gold",)}},
    ),
    Case(
        'extra "" is left out',
        "oidc.go getExtra: empty values are not set",
        {"tier": ""},
        mapping="cel",
        user={"extra": {}},
    ),
    Case(
        "extra null is left out",
        "oidc.go convertCELValueToStringList: null",
        {"tier": "null-json"},
        mapping="cel",
        user={"extra": {}},
    ),
    Case(
        "extra a number", "oidc.go convertCELValueToStringList: error", {"tier": 7}, mapping="cel"
    ),
    Case(
        "jti",
        "oidc.go getCredentialID: CredentialIDForJTI",
        {"jti": "abc-1"},
        user={"extra": {CREDENTIAL_ID_KEY: ("JTI=abc-1",)}},
    ),
    Case(
        'jti ""',
        'oidc.go getCredentialID: CredentialIDForJTI("") is ""',
        {"jti": ""},
        user={"extra": {}},
    ),
    Case(
        "jti a number",
        "oidc.go getCredentialID: unmarshal fails, no id, no refusal",
        {"jti": 7},
        user={"extra": {}},
    ),
    Case(
        "userValidationRules see the credential id",
        "oidc.go: extra before user rules",
        {"name": "no-jti", "jti": "j"},
        mapping="cel",
    ),
    # --- claim validation rules ------------------------------------------------------------
    Case("requiredValue missing", "oidc.go requiredClaims: not present", {"hd": None}),
    Case(
        "requiredValue other",
        "oidc.go requiredClaims: value does not match",
        {"hd": "evil.example"},
    ),
    Case("requiredValue a number", "oidc.go requiredClaims: only string values", {"hd": 7}),
    Case(
        "claim rule false",
        "oidc.go checkValidationRulesEvaluation",
        {"level": False},
        mapping="cel",
    ),
    Case(
        "claim rule not a bool",
        "oidc.go checkValidationRulesEvaluation: must be bool",
        {"level": "yes"},
        mapping="cel",
    ),
]


def _unset(claims: dict[str, Any], name: str) -> None:
    claims.pop(name, None)


def token_for(issuer: FakeIssuer, case: Case) -> str:
    claims = base_claims(issuer, case.mapping)
    for name, value in case.claims.items():
        if value is None:
            _unset(claims, name)
            continue
        value = value() if callable(value) else value
        claims[name] = issuer.issuer if value == "ISSUER" else value
    if case.mint is not None:
        return case.mint(issuer, claims)
    # "null-json" stands for JSON null, which a dict value of None cannot say here.
    payload = json.dumps(claims).replace('"null-json"', "null").encode()
    return issuer.mint_raw(payload)


@pytest.fixture(scope="module")
def issuer() -> Iterator[FakeIssuer]:
    fake = FakeIssuer().start_in_thread()
    fake.add_key("ec-256", "ES256")
    fake.add_key("ed-1", "EdDSA")
    # An RSA key published without "alg", and one published for encryption only.
    for kid, jwk_update in (("rsa-no-alg", {"alg": None}), ("rsa-enc", {"use": "enc"})):
        key = fake.add_key(kid, publish=False)
        jwk = {**key.public_jwk(), **jwk_update}
        fake.extra_jwks.append({k: v for k, v in jwk.items() if v is not None})
    try:
        yield fake
    finally:
        fake.stop()


@pytest.fixture(scope="module")
def backends(issuer: FakeIssuer) -> Iterator[dict[str, InThread]]:
    running = {
        name: InThread(jwt_settings(issuer, AUDIENCES, **mapping))
        for name, mapping in MAPPINGS.items()
    }
    try:
        yield running
    finally:
        for backend in running.values():
            backend.close()


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_claims_are_decided_and_mapped_as_kube_does(
    issuer: FakeIssuer, backends: dict[str, InThread], case: Case
) -> None:
    outcome = backends[case.mapping].call(token_for(issuer, case))
    rule = f"{case.name}: {case.kube}{' (DIFFERS on purpose)' if case.differs else ''}"
    if case.user is None:
        assert isinstance(outcome, Rejected), (rule, outcome)
        return
    assert isinstance(outcome, Authenticated), (rule, outcome)
    user = outcome.user
    seen = {"username": user.username, "uid": user.uid, "groups": user.groups, "extra": user.extra}
    for name, expected in case.user.items():
        assert seen[name] == expected, (rule, name, seen)


def _claims(issuer: FakeIssuer) -> bytes:
    return json.dumps(base_claims(issuer, "claims")).encode()


def _with_trailing_bits(token: str) -> str:
    """The same signature bytes, its last character's unused low bits set."""
    head, _, sig = token.rpartition(".")
    assert len(sig) % 4 in (2, 3), "a signature length with unused bits"
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    return f"{head}.{sig[:-1]}{alphabet[alphabet.index(sig[-1]) + 1]}"


TOKENS: list[tuple[str, str, Callable[[FakeIssuer], str], bool, bool]] = [
    # (name, kube rule, token, accepted by the gateway, differs on purpose)
    (
        "RS256",
        "options ToAuthenticationConfig: all of allowedSigningAlgs",
        lambda i: i.mint_raw(_claims(i)),
        True,
        False,
    ),
    (
        "ES256 with a P-256 key",
        "oidc.go allowedSigningAlgs",
        lambda i: i.mint_raw(_claims(i), kid="ec-256"),
        True,
        False,
    ),
    (
        "PS256 with an RSA key whose JWK has no alg",
        "go-jose: any RSA alg with an RSA key",
        lambda i: i.mint_raw(_claims(i), kid="rsa-no-alg", alg="PS256"),
        True,
        False,
    ),
    (
        "RS512 with a JWK that says RS256",
        "go-jose newVerifier ignores the JWK's alg",
        lambda i: i.mint_raw(_claims(i), alg="RS512"),
        False,
        True,
    ),
    (
        "EdDSA",
        "oidc.go allowedSigningAlgs has no EdDSA",
        lambda i: i.mint_raw(_claims(i), kid="ed-1"),
        False,
        False,
    ),
    (
        "alg none",
        "verify.go: alg not in SupportedSigningAlgs",
        lambda i: i.mint_unsigned(base_claims(i, "claims")),
        False,
        False,
    ),
    (
        "HS256 keyed with the public key",
        "verify.go: alg not in SupportedSigningAlgs",
        lambda i: i.mint_hs256_with_public_key(base_claims(i, "claims")),
        False,
        False,
    ),
    (
        "no kid",
        "go-oidc remote key set: every key is tried",
        lambda i: i.mint_raw(_claims(i), kid=None, signing_kid="key-1"),
        True,
        False,
    ),
    (
        "an unknown kid",
        "go-oidc remote key set: no key with that id",
        lambda i: i.mint_raw(_claims(i), kid="nobody", signing_kid="key-1"),
        False,
        False,
    ),
    (
        "a key published for encryption",
        "go-oidc: every key of the set is used",
        lambda i: i.mint_raw(_claims(i), kid="rsa-enc"),
        False,
        True,
    ),
    (
        "an unknown crit header",
        "go-jose signing.go DetachedVerify: supportedCritical",
        lambda i: i.mint_raw(_claims(i), headers={"crit": ["exp"], "exp": 1}),
        False,
        False,
    ),
    (
        "a kid that is a number",
        "go-jose rawHeader: kid must be a string",
        lambda i: i.mint_raw(_claims(i), kid=None, headers={"kid": 7}, signing_kid="key-1"),
        False,
        False,
    ),
    (
        "a padded signature",
        "go-jose jws.go parseSignedCompact: RawURLEncoding",
        lambda i: i.mint_raw(_claims(i)) + "==",
        False,
        False,
    ),
    (
        "non-zero trailing bits",
        "go-jose: Go's RawURLEncoding is not Strict()",
        lambda i: _with_trailing_bits(i.mint_raw(_claims(i))),
        False,
        True,
    ),
]


@pytest.mark.parametrize(("name", "kube", "make", "accepted", "differs"), TOKENS,
                         ids=[t[0] for t in TOKENS])  # fmt: skip
def test_algorithms_keys_and_headers_are_decided_as_kube_does(
    issuer: FakeIssuer,
    backends: dict[str, InThread],
    name: str,
    kube: str,
    make: Callable[[FakeIssuer], str],
    accepted: bool,
    differs: bool,
) -> None:
    outcome = backends["claims"].call(make(issuer))
    rule = f"{name}: {kube}{' (DIFFERS on purpose)' if differs else ''}"
    assert isinstance(outcome, Authenticated if accepted else Rejected), (rule, outcome)


def test_googles_legacy_issuer_is_coalesced_for_google_only() -> None:
    # oidc.go untrustedIssuer and verify.go: "accounts.google.com" is Google's issuer
    # https://accounts.google.com, and nobody else's.
    legacy = {"iss": idtoken.GOOGLE_NO_SCHEME}
    assert idtoken.unverified_issuer(legacy) == idtoken.GOOGLE
    claims = {**legacy, "aud": "gateway", "exp": now() + 60}
    assert idtoken.refusal(claims, issuer=idtoken.GOOGLE, audiences=["gateway"], now=now()) is None
    other = "https://accounts.example.com"
    assert idtoken.refusal(claims, issuer=other, audiences=["gateway"], now=now()) is not None


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3)
    ),
    max_leaves=10,
)

claim_names = st.sampled_from(
    ["iss", "ISS", "sub", "aud", "exp", "Exp", "iat", "nbf", "nonce", "at_hash", "jti",
     "_claim_names", "_claim_sources", "groups", "uid", "email", "email_verified", "hd"]
) | st.text(max_size=8)  # fmt: skip


@given(claims=st.dictionaries(claim_names, json_values, max_size=12))
def test_any_claims_are_decided_without_raising(claims: dict[str, Any]) -> None:
    """The claim rules and the mapping on arbitrary JSON: a reason, a user or a
    refusal, never an exception (a signed token's claims are still input)."""
    problem = idtoken.refusal(
        claims, issuer="https://issuer.example", audiences=["gateway"], now=now(),
        groups_claim="groups",
    )  # fmt: skip
    assert problem is None or isinstance(problem, str)
    for mapping in MAPPINGS.values():
        rules = ClaimRules.model_validate(mapping)
        outcome = map_claims(rules, claims, credential_id=True)
        assert isinstance(outcome, Rejected | UserInfo), outcome
