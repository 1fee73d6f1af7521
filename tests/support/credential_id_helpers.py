"""Helpers shared by the tiers of test_credential_id: re-spellings a directory or
Keystone takes for the same credential, and an LDAP backend's settings."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

from tests.support.slapd import PEOPLE, SERVICE_DN, Slapd

SECRET = "credential-id-test-only-Qm4Xv8Tz2Lw6Ns1Bk9Rd5Hj3Fy7Gc0Pa"
PREVIOUS_SECRET = "credential-id-previous-test-only-Wn3Ec7Ru1Ki5Ox9Ta2Ys6Dm0"

#: Printable ASCII and its full-width form, which NFKC maps back (RFC 4518, SASLprep).
FULL_WIDTH = {chr(c): chr(c + 0xFEE0) for c in range(0x21, 0x7F)}
#: Characters SASLprep maps to nothing (RFC 3454 table B.1): soft hyphen, combining
#: grapheme joiner.
MAPPED_TO_NOTHING = ("\u00ad", "\u034f")
BASE64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
URLSAFE = BASE64[:62] + "-_"


def ldap_token(username: str, password: str) -> str:
    return base64.b64encode(f"{username}:{password}".encode()).decode()


def other_trailing_bits(encoded: str, choice: int = 1) -> str:
    """``encoded`` (padded base64) with its unused trailing bits set: the same bytes to
    a decoder that ignores them (Python's, Keystone's), another string to the eye."""
    pad = len(encoded) - len(encoded.rstrip("="))
    if pad == 0:
        return encoded
    at = len(encoded) - pad - 1
    step = 16 if pad == 2 else 4  # 4 unused bits under "==", 2 under "="
    alphabet = URLSAFE if "-" in encoded or "_" in encoded else BASE64
    index = alphabet.index(encoded[at])
    other = alphabet[index - index % step + (index % step + choice) % step]
    return encoded[:at] + other + encoded[at + 1 :]


def ldap_backend(server: Slapd, password_file: Path, name: str, **overrides: Any) -> dict[str, Any]:
    """Search mode over plain ldap:// on loopback (TLS is not what these tests are about)."""
    return {
        "name": name,
        "type": "ldap",
        "url": server.ldap_url,
        "allow_plaintext": True,
        "bind_dn": SERVICE_DN,
        "bind_password": f"file:{password_file}",
        "user_base": PEOPLE,
        "timeouts": {"connect_seconds": 1.0, "read_seconds": 2.0, "total_seconds": 3.0},
        **overrides,
    }
