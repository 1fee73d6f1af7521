"""The checks kube-apiserver makes on a JWT's claims once its signature holds.

kube verifies with its fork of go-oidc (``staging/src/k8s.io/apiserver/third_party/
forked/go-oidc``), then its authenticator (``.../plugin/pkg/authenticator/token/oidc/
oidc.go``) checks the audience and expands distributed claims. This module decides as
they do, rule for rule, so one ``jwt`` entry decides alike in both:

* the payload is unmarshalled into go-oidc's ``idToken`` struct (``oidc.go``): a
  standard claim of the wrong JSON type refuses the token, and Go matches the
  struct's keys case-insensitively (``EXP`` sets the expiry), the last one winning;
* ``verify.go`` ``IDTokenVerifier.Verify``: ``iss`` must be the issuer; ``exp`` is
  required, with no leeway (refused once ``exp < now``); ``nbf``, when present, may be
  at most one minute ahead; ``iat`` is read (so it must be a number) but not checked;
* ``oidc.go`` ``verifyAudience``: one of ``aud`` must be one of ``issuer.audiences``;
* ``oidc.go`` ``claimResolver.expand``: a groups claim given as a distributed claim
  is fetched by kube from the endpoint the token names; the gateway refuses it.

Every refusal is a reason string (no claim values: they come from the token).
Where the gateway differs on purpose it says so; docs/backends/jwt.md has the table.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

#: go-oidc verify.go: ``leeway := 1 * time.Minute`` on nbf; exp has none.
KUBE_NBF_LEEWAY_SECONDS = 60.0

# verify.go: Google's legacy issuer, accepted for Google only.
GOOGLE = "https://accounts.google.com"
GOOGLE_NO_SCHEME = "accounts.google.com"

_INT64 = 2**63
# encoding/json's number grammar (isValidNumber): what a JSON string may hold to be
# read into a json.Number.
_JSON_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?", re.ASCII)
_JSON_INTEGER = re.compile(r"-?(?:0|[1-9][0-9]*)", re.ASCII)


class Malformed(ValueError):
    """A claim that go-oidc's unmarshalling refuses; the message names the claim only."""


# encoding/json folds a non-ASCII rune to unicode.ToUpper(unicode.ToLower(r)); these
# four are the runes that fold onto an ASCII letter (Kelvin sign, long s, dotless i,
# dotted capital I).
_FOLDS_TO_ASCII = str.maketrans({"\u212a": "k", "\u017f": "s", "\u0131": "i", "\u0130": "i"})


def go_key(key: str) -> str:
    """A key as encoding/json folds it to match a struct field (``foldName``), in
    lower case: ``EXP`` and ``Exp`` match ``exp``, and so does a Kelvin-sign K."""
    if key.isascii():
        return key.lower()
    return "".join(c.lower() if c.isascii() else c for c in key.translate(_FOLDS_TO_ASCII))


def go_field(claims: Mapping[str, Any], name: str) -> tuple[bool, Any]:
    """(present, value) of struct field ``name`` as json.Unmarshal fills it: every key
    matching it (case-folded) sets it in document order, so the last one wins."""
    found, value = False, None
    for key, item in claims.items():
        if key == name or go_key(key) == name:
            found, value = True, item
    return found, value


def json_time(value: Any, claim: str) -> int:
    """go-oidc ``jsonTime.UnmarshalJSON``: a JSON number, or a string holding one; an
    integer as is, else the float truncated. ``null`` is an error (it reaches
    UnmarshalJSON as ``null``, and an empty json.Number parses as nothing).

    Differs on purpose: a time outside int64 is refused. kube converts it with Go's
    float-to-int64 conversion, whose result depends on the CPU (the far past on
    amd64, the far future on arm64).
    """
    if isinstance(value, bool) or value is None:
        raise Malformed(f"{claim} is not a number")
    if isinstance(value, str):
        if not _JSON_NUMBER.fullmatch(value):
            raise Malformed(f"{claim} is not a number")
        number: int | float = int(value) if _JSON_INTEGER.fullmatch(value) else float(value)
    elif isinstance(value, int | float):
        number = value
    else:
        raise Malformed(f"{claim} is not a number")
    if isinstance(number, float):
        if not math.isfinite(number):
            raise Malformed(f"{claim} is out of range")
        number = int(number)  # Go's int64(f): toward zero
    if not -_INT64 <= number < _INT64:
        raise Malformed(f"{claim} is out of range")
    return number


def _string_or_null(claims: Mapping[str, Any], name: str) -> str:
    present, value = go_field(claims, name)
    if not present or value is None:
        return ""
    if not isinstance(value, str):
        raise Malformed(f"{name} is not a string")
    return value


def audience(claims: Mapping[str, Any]) -> list[str]:
    """go-oidc ``audience.UnmarshalJSON``: a string, or a list of strings (a ``null``
    in it reads as ""); ``null`` itself reads as ``[""]``."""
    present, value = go_field(claims, "aud")
    if not present:
        return []
    if value is None or isinstance(value, str):
        return [value or ""]
    if isinstance(value, list) and all(v is None or isinstance(v, str) for v in value):
        return [v or "" for v in value]
    raise Malformed("aud is not a string or a list of strings")


def _string_map(value: Any, name: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(
        v is None or isinstance(v, str) for v in value.values()
    ):
        raise Malformed(f"{name} is not an object of strings")
    return {k: v or "" for k, v in value.items()}


def _claim_sources(value: Any) -> dict[str, str]:
    """``_claim_sources``: name -> the source's endpoint ("" when it has none)."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise Malformed("_claim_sources is not an object")
    endpoints: dict[str, str] = {}
    for name, source in value.items():
        if source is None:
            endpoints[name] = ""
            continue
        if not isinstance(source, dict):
            raise Malformed("_claim_sources has a source that is not an object")
        fields = {f: _string_or_null(source, f) for f in ("endpoint", "access_token")}
        endpoints[name] = fields["endpoint"]
    return endpoints


def unverified_issuer(claims: Mapping[str, Any]) -> str:
    """oidc.go ``untrustedIssuer``: ``iss`` as Go reads it, Google's legacy issuer
    coalesced. For routing only: the signature decides."""
    iss = _string_or_null(claims, "iss")
    return GOOGLE if iss == GOOGLE_NO_SCHEME else iss


def expiry(claims: Mapping[str, Any]) -> int:
    """The ``exp`` of claims :func:`refusal` accepted."""
    return json_time(go_field(claims, "exp")[1], "exp")


def refusal(
    claims: Mapping[str, Any],
    *,
    issuer: str,
    audiences: Sequence[str],
    now: float,
    nbf_leeway: float = KUBE_NBF_LEEWAY_SECONDS,
    groups_claim: str | None = None,
) -> str | None:
    """Why kube-apiserver would refuse a signed token with these claims; None if not."""
    try:
        return _refusal(claims, issuer, audiences, now, nbf_leeway, groups_claim)
    except Malformed as exc:
        return f"malformed claims: {exc}"


def _refusal(
    claims: Mapping[str, Any],
    issuer: str,
    audiences: Sequence[str],
    now: float,
    nbf_leeway: float,
    groups_claim: str | None,
) -> str | None:
    # The idToken struct, field by field (unknown claims are ignored by Go).
    iss = _string_or_null(claims, "iss")
    for name in ("sub", "nonce", "at_hash"):
        _string_or_null(claims, name)
    auds = audience(claims)
    has_exp, exp_value = go_field(claims, "exp")
    exp = json_time(exp_value, "exp") if has_exp else None
    has_iat, iat_value = go_field(claims, "iat")
    if has_iat:
        json_time(iat_value, "iat")  # read, never compared: kube does not check iat
    has_nbf, nbf_value = go_field(claims, "nbf")
    nbf = json_time(nbf_value, "nbf") if has_nbf and nbf_value is not None else None
    names = _string_map(go_field(claims, "_claim_names")[1], "_claim_names")
    sources = _claim_sources(go_field(claims, "_claim_sources")[1])
    for source in names.values():
        if source == "":
            return 'distributed claim names a source of ""'
        if source not in sources:
            return "distributed claim names a source that is not in _claim_sources"

    # verify.go, in its order.
    if iss != issuer and not (issuer == GOOGLE and iss == GOOGLE_NO_SCHEME):
        return "issuer mismatch"
    if exp is None or exp < now:
        return "token expired" if exp is not None else "token expired (no exp)"
    if nbf is not None and now + nbf_leeway < nbf:
        return "token not yet valid"
    # oidc.go verifyAudience: any of the token's audiences is one of ours.
    if not set(auds) & set(audiences):
        return "audience not accepted"
    return _distributed_groups(claims, groups_claim)


def _distributed_groups(claims: Mapping[str, Any], groups_claim: str | None) -> str | None:
    """oidc.go ``claimResolver.expand``, for the groups claim only and only when the
    token lacks it; its keys are looked up exactly (a Go map, not a struct).

    Differs on purpose: where kube would fetch the claim from the endpoint the token
    names (OIDC Core 5.6.2), the gateway refuses the token rather than call a URL a
    token chose, or let the user in without the groups the issuer meant."""
    if groups_claim is None or groups_claim in claims or "_claim_names" not in claims:
        return None
    names = _string_map(claims["_claim_names"], "_claim_names")
    if "_claim_sources" not in claims:
        return "distributed claims without _claim_sources"
    sources = _claim_sources(claims["_claim_sources"])
    source = names.get(groups_claim)
    if source is None:
        return None
    if source not in sources:
        return "distributed claim names a source that is not in _claim_sources"
    if sources[source] == "":
        return None  # an aggregated claim (a JWT in the source): kube ignores it
    return "groups claim is distributed (fetched from an endpoint): not supported"
