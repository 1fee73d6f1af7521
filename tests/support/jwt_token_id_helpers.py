"""Helpers shared by the tiers of test_jwt_token_id."""

from __future__ import annotations

from authn_gateway.keyed_hashes import TokenHasher

SECRET = "token-id-test-only-Vd3Kq8Lm1Xs6Bn9Tz4Wr7Hc2Jf5Gp0Ey"

HASHER = TokenHasher(SECRET.encode())
