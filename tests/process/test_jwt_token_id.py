"""A token has one id (issue 29, finding 6): a JWT re-spelled (``==`` on its signature,
stray characters, ``+/`` for ``-_``, non-zero trailing bits) is refused by the jwt
backend, and has the token id of the JWT it re-spells, so a denial by token id holds
whichever backend reads it. Properties over generated re-spellings (hypothesis),
against the real backend and the fake issuer over TLS sockets."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx

from tests.support.fakes.issuer import INTROSPECT_PATH, FakeIssuer
from tests.support.jwt_token_id_helpers import HASHER, SECRET

ADMIN_TOKEN = "admin-test-only-Rt6Yq1Lw8Km3Vz9Nc2Bh5Dx7Fs4Gj0PuE"


def test_a_denied_token_id_holds_for_every_spelling_whichever_backend_reads_it(
    es256_issuer: FakeIssuer, gateway_factory: Any, tmp_path: Path
) -> None:
    """Through introspection, with an authorization server that (like PyJWT before
    2.15) takes the padded spelling too: only the token id can stop it."""
    ca = tmp_path / "issuer-ca.pem"
    ca.write_text(es256_issuer.ca_pem)
    token = es256_issuer.mint(es256_issuer.claims(sub="leaked"))
    padded = token + "=="
    answer = {"username": "leaked", "aud": "gateway", "exp": int(time.time()) + 600}
    es256_issuer.opaque[token] = es256_issuer.opaque[padded] = answer
    gw = gateway_factory(
        {
            "secret": SECRET,
            "admin": {"enabled": True, "token": ADMIN_TOKEN},
            "cache": {"negative_ttl_seconds": 0},
            "backends": [
                {
                    "name": "opaque",
                    "type": "introspection",
                    "url": es256_issuer.issuer + INTROSPECT_PATH,
                    "client_id": es256_issuer.client_credentials[0],
                    "client_secret": es256_issuer.client_credentials[1],
                    "tls": {"ca_file": str(ca)},
                    "accept": {"audiences": ["gateway"]},
                    "claimMappings": {"username": {"claim": "username", "prefix": ""}},
                }
            ],
        }
    )
    for spelling in (token, padded):
        review = gw.review(spelling).json()["status"]
        assert review["authenticated"] is True, review
    token_id = HASHER.token_id(token)
    denied = httpx.post(
        f"{gw.url}/admin/deny",
        json={"token_id": token_id, "seconds": 600, "by": "test"},
        headers={"authorization": f"Bearer {ADMIN_TOKEN}"},
    )
    assert denied.status_code == 200, denied.text
    for spelling in (token, padded, token + "=", token.replace("-", "+")):
        review = gw.review(spelling).json()["status"]
        assert review["authenticated"] is False, (spelling[-8:], review)
    # Every review of either spelling was logged under the one id.
    ids = {
        line.split("token=")[1].split()[0]
        for line in gw.logs().splitlines()
        if "msg=review" in line
    }
    assert ids == {token_id}, ids
