"""The JWKS parser (``backends/jwt/jwks.py``): one malformed key costs only itself.

Properties over arbitrary JSON documents (hypothesis): parsing never raises anything
but ``UnusableJWKS``, and keeps every well-formed key, whatever sits next to it. Then
the issue-29 case over real sockets: the fake issuer publishes a key whose ``crv`` is
a list next to its real key, and tokens keep verifying.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from hypothesis import given
from hypothesis import strategies as st

from backends.base import Authenticated
from backends.jwt.jwks import UnusableJWKS, VerificationKey, parse_jwks, read_key
from tests.support.fakes.issuer import FakeIssuer
from tests.support.jwt_backend import jwt_settings, running


def _public_jwk(kid: str, alg: str, private: Any) -> dict[str, Any]:
    jwk: dict[str, Any] = json.loads(jwt.get_algorithm_by_name(alg).to_jwk(private.public_key()))
    return {**jwk, "kid": kid, "use": "sig", "alg": alg}


# Made once: key generation is the slow part, and the properties are about parsing.
GOOD = [
    _public_jwk("rsa-a", "RS256", rsa.generate_private_key(public_exponent=65537, key_size=2048)),
    _public_jwk("ec-b", "ES256", ec.generate_private_key(ec.SECP256R1())),
    _public_jwk("ec-c", "ES384", ec.generate_private_key(ec.SECP384R1())),
]

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)

# Entries shaped like keys, each member possibly of the wrong type or value.
jwk_like = st.fixed_dictionaries(
    {},
    optional={
        name: st.sampled_from(values) | json_values
        for name, values in {
            "kty": ["RSA", "EC", "OKP", "oct"],
            "crv": ["P-256", "P-384", "P-521", "Ed25519", ["P-256"]],
            "alg": ["RS256", "ES256", "EdDSA", "HS256", ["RS256"], None],
            "use": ["sig", "enc", ["sig"]],
            "kid": ["k1", "", 7, ["k1"]],
            "n": ["AQAB", "", "!!!", "x" * 40],
            "e": ["AQAB", "AA", "", 65537],
            "x": ["AQAB", "", "f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU"],
            "y": ["AQAB", "", "x_FEzRu9m36HLN_tue659LNpXW6pCyStikYjKIWI5a0"],
        }.items()
    },
)

# A real key with one member replaced by anything at all.
mangled_good = st.tuples(
    st.sampled_from(GOOD), st.sampled_from(["kty", "crv", "alg", "use", "kid", "n", "e", "x", "y"]),
    json_values,
).map(lambda t: {**t[0], t[1]: t[2]})  # fmt: skip


def kids(keys: tuple[VerificationKey, ...]) -> list[str | None]:
    return [k.kid for k in keys]


@given(doc=json_values | st.fixed_dictionaries({"keys": st.lists(json_values, max_size=6)}))
def test_any_json_document_parses_or_is_unusable_and_nothing_else(doc: Any) -> None:
    try:
        keys = parse_jwks(doc)
    except UnusableJWKS:
        return
    assert keys and all(isinstance(k, VerificationKey) for k in keys)


@given(
    junk=st.lists(json_values | jwk_like | mangled_good, max_size=8),
    good=st.lists(st.sampled_from(GOOD), min_size=1, max_size=3, unique_by=lambda k: k["kid"]),
    data=st.data(),
)
def test_every_well_formed_key_is_kept_whatever_sits_next_to_it(
    junk: list[Any], good: list[dict[str, Any]], data: st.DataObject
) -> None:
    entries = data.draw(st.permutations([*junk, *good]))
    keys = parse_jwks({"keys": entries})
    found = kids(keys)
    assert all(g["kid"] in found for g in good), (found, entries)
    # A kept key verifies only what its JWK allows.
    for key in keys:
        assert key.algorithms and (key.kid is None or isinstance(key.kid, str))


@given(entry=jwk_like | mangled_good)
def test_one_entry_is_read_or_skipped_never_raised(entry: Any) -> None:
    key = read_key(entry)
    assert key is None or isinstance(key, VerificationKey)


@pytest.mark.parametrize(
    "bad",
    [
        {**GOOD[1], "crv": ["P-256"]},
        {**GOOD[0], "alg": ["RS256"]},
        {**GOOD[0], "kty": {"RSA": 1}},
        {**GOOD[0], "kid": ["rsa-a"]},
        {**GOOD[0], "n": 12},
        {**GOOD[1], "x": "!!"},
    ],
    ids=["crv list", "alg list", "kty object", "kid list", "n number", "x not base64"],
)
def test_the_issue_29_keys_are_skipped_alone(bad: dict[str, Any]) -> None:
    assert read_key(bad) is None
    assert kids(parse_jwks({"keys": [bad, *GOOD]})) == [g["kid"] for g in GOOD]
    with pytest.raises(UnusableJWKS, match="no usable signature keys"):
        parse_jwks({"keys": [bad]})


@pytest.fixture
def issuer() -> Iterator[FakeIssuer]:
    fake = FakeIssuer().start_in_thread()
    try:
        yield fake
    finally:
        fake.stop()


async def test_a_malformed_key_on_the_issuer_leaves_its_real_keys_verifying(
    issuer: FakeIssuer,
) -> None:
    issuer.add_key("ec-1", "ES256")
    real = issuer.jwks()["keys"]
    issuer.extra_jwks = [
        {**real[1], "kid": "ec-bad", "crv": ["P-256"]},
        {**real[0], "kid": "rsa-bad", "alg": ["RS256"]},
    ]
    async with running(jwt_settings(issuer)) as backend:
        current = backend.keys.current()
        assert current is not None, "the whole key set was dropped"
        assert sorted(kids(current.keys)) == ["ec-1", "key-1"]
        for kid in ("key-1", "ec-1"):
            outcome = await backend.authenticate(issuer.mint(issuer.claims(), kid=kid))
            assert isinstance(outcome, Authenticated), (kid, outcome)
