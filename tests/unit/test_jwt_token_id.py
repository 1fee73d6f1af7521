"""A token has one id (issue 29, finding 6): a JWT re-spelled (``==`` on its signature,
stray characters, ``+/`` for ``-_``, non-zero trailing bits) is refused by the jwt
backend, and has the token id of the JWT it re-spells, so a denial by token id holds
whichever backend reads it. Properties over generated re-spellings (hypothesis),
against the real backend and the fake issuer over TLS sockets."""

from __future__ import annotations

import base64
from collections.abc import Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from backends.base import Authenticated, Rejected
from backends.jws import canonical_spelling, is_canonical, is_canonical_segment
from tests.support.fakes.issuer import FakeIssuer
from tests.support.jwt_backend import InThread, jwt_settings
from tests.support.jwt_token_id_helpers import HASHER

URLSAFE = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"


@pytest.fixture(scope="module")
def backend(es256_issuer: FakeIssuer) -> Iterator[InThread]:
    running = InThread(jwt_settings(es256_issuer))
    try:
        yield running
    finally:
        running.close()


@pytest.fixture(scope="module")
def tokens(es256_issuer: FakeIssuer) -> list[str]:
    # Signatures of every length class: RS256 (342 chars, 2 mod 4), ES256 (86, 2 mod 4),
    # and claims whose payloads end on each remainder.
    return [
        es256_issuer.mint(es256_issuer.claims(sub="a" * n), kid=kid)
        for kid in ("key-1", "ec-1")
        for n in range(1, 5)
    ]


def _same_bits_other_char(last: str, rest: int) -> str:
    """Another character whose used bits are those of ``last``: non-zero trailing bits."""
    step = 16 if rest == 2 else 4
    index = URLSAFE.index(last)
    return URLSAFE[index - index % step + (index % step + 1) % step]


OPS = ("trailing-bits", "std-alphabet", "stray", "pad")  # applied in this order


@st.composite
def lax_respellings(draw: st.DrawFn, token: str, only_signature: bool = False) -> str:
    """A spelling a lax decoder reads as the same three segments. The signature alone
    is what a verifier may accept re-spelled (the others are signed as sent)."""
    segments = token.split(".")
    for i, seg in enumerate(segments):
        if only_signature and i < 2:
            continue
        chosen = draw(st.sets(st.sampled_from(OPS), min_size=1 if only_signature else 0))
        for op in (op for op in OPS if op in chosen):
            seg = _respell(draw, seg, op)
        segments[i] = seg
    return ".".join(segments)


def _respell(draw: st.DrawFn, seg: str, op: str) -> str:
    if op == "trailing-bits":  # on the segment still canonical: OPS order
        rest = len(seg) % 4
        return seg[:-1] + _same_bits_other_char(seg[-1], rest) if rest in (2, 3) else seg
    if op == "std-alphabet":
        return seg.replace("-", "+").replace("_", "/")
    if op == "stray":
        at = draw(st.integers(min_value=0, max_value=len(seg)))
        strays = st.characters(exclude_characters=URLSAFE + "+/.", codec="utf-8")
        return seg[:at] + draw(st.text(strays, min_size=1, max_size=3)) + seg[at:]
    # Mostly the padding RFC 4648 would add (what PyJWT accepts), else any run of "=".
    proper = -len(seg) % 4
    return seg + "=" * (proper or draw(st.integers(min_value=1, max_value=3)))


@given(data=st.data())
def test_every_respelling_is_refused_by_the_jwt_backend_and_keeps_the_token_id(
    backend: InThread, tokens: list[str], data: st.DataObject
) -> None:
    token = data.draw(st.sampled_from(tokens))
    assert isinstance(backend.call(token), Authenticated)
    respelled = data.draw(lax_respellings(token, only_signature=data.draw(st.booleans())))
    if respelled == token:
        return
    outcome = backend.call(respelled)
    assert isinstance(outcome, Rejected), (respelled, outcome)
    assert HASHER.token_id(respelled) == HASHER.token_id(token), respelled
    assert canonical_spelling(respelled) == token


@given(data=st.data(), noise=st.text(max_size=6), at=st.integers(min_value=0))
def test_any_edit_of_a_valid_jwt_is_refused_unless_it_is_the_jwt(
    backend: InThread, tokens: list[str], data: st.DataObject, noise: str, at: int
) -> None:
    """Anything at all spliced in: either the very token, or refused; never someone."""
    token = data.draw(st.sampled_from(tokens))
    at %= len(token) + 1
    edited = token[:at] + noise + token[at:]
    outcome = backend.call(edited)
    assert edited == token or isinstance(outcome, Rejected), (edited, outcome)


@given(
    raw=st.lists(st.binary(max_size=40), min_size=3, max_size=3),
)
def test_canonical_spelling_is_unpadded_base64url_of_the_same_bytes(raw: list[bytes]) -> None:
    canonical = ".".join(base64.urlsafe_b64encode(r).rstrip(b"=").decode() for r in raw)
    assert is_canonical(canonical) and canonical_spelling(canonical) == canonical
    padded = ".".join(base64.urlsafe_b64encode(r).decode() for r in raw)
    assert canonical_spelling(padded) == canonical
    assert is_canonical(padded) == (padded == canonical)


@given(token=st.text(max_size=60))
def test_canonical_spelling_never_raises_and_is_stable(token: str) -> None:
    once = canonical_spelling(token)
    assert canonical_spelling(once) == once
    assert HASHER.token_id(token) == HASHER.token_id(once)


def test_the_issue_29_case_a_denied_jwt_plus_two_equals_signs(
    backend: InThread, tokens: list[str]
) -> None:
    token = tokens[0]
    padded = token + "=="
    assert not is_canonical_segment(padded.rsplit(".", 1)[1])
    outcome = backend.call(padded)
    assert isinstance(outcome, Rejected) and "canonical" in outcome.reason, outcome
    assert HASHER.token_id(padded) == HASHER.token_id(token)
    # Opaque tokens (GitLab, Keystone fernet with its own padding) are left as sent.
    for opaque in ("glpat-abcdefghijklmnopqrst", "gAAAAABkX1c2bG9uZw==", "a.b", "x..y.z"):
        assert canonical_spelling(opaque) == opaque
