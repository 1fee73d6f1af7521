"""A small fake Keystone v3 for load rehearsals (a real Keystone does ~10 validations/s here).

It answers the calls the gateway makes, with the shapes recorded from Keystone 22 in
``/work/shared/reference/keystone/``:

* ``POST /v3/auth/tokens`` (password method, project/system/unscoped): 201 with the
  token in ``X-Subject-Token``; a bad password or unknown user gets 401;
* ``GET /v3/auth/tokens`` with ``X-Auth-Token`` (the caller's token) and
  ``X-Subject-Token``: 200 with the token body (``?nocatalog`` drops the catalog);
  a bad, expired or missing caller token gets 401 with ``WWW-Authenticate``; a caller
  without the ``service``/``admin``/``reader`` role gets 403; an unknown, tampered or
  expired subject token gets 404 (``?allow_expired=1`` returns expired ones, as
  Keystone does);
* ``GET /v3/users/{id}/groups``: the user's groups; needs a system-scoped caller (403
  otherwise, as with Keystone's default policy).

Tokens are self-describing and look like fernet tokens (version byte 0x80, a
timestamp, an IV, a payload and an HMAC, URL-safe base64 without padding, ~180
characters), so load generators mint valid ones with :func:`mint_token` without a
round trip. Users ``<name>`` have the password ``pw-<name>``; the service user has the
password given on the command line.

Faults are the fake IdP's (``latency``, ``fail_fraction``, ``status``, ``hang``,
``refuse``...) plus the Keystone incident's:

* ``reject_service_tokens`` - every caller token gets 401 on validation, as if the
  gateway's own token had been revoked (the incident's first phase);
* ``auth_status``           - answer ``POST /v3/auth/tokens`` with this status (e.g. 401
  when the service password no longer works, 500 while Keystone is sick);
* ``close_connections``     - send ``Connection: close`` on every answer, like the
  uWSGI set-up the reference shapes were recorded from.

Control port: ``GET /_fake/stats``, ``POST /_fake/faults``, ``POST /_fake/reset``.
Run with ``python -m tests.support.fakes.keystone --port N --control-port M``.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import hmac
import json
import os
import random
import struct
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qs, urlsplit

from .idp import FakeIdP, Faults, _json, injected_fault

DEFAULT_KEY = b"fake-keystone-fernet-key"
SERVICE_USER = "authn-gateway"
DEFAULT_SERVICE_PASSWORD = "GatewayPass123"
TOKEN_LIFETIME = 3600.0
PROJECT = {"domain": {"id": "default", "name": "Default"}, "id": "1c6674d9", "name": "demo"}
SERVICE_PROJECT = {
    "domain": {"id": "default", "name": "Default"},
    "id": "2a556238",
    "name": "service",
}
UNAUTHORIZED = {
    "error": {
        "code": 401,
        "message": "The request you have made requires authentication.",
        "title": "Unauthorized",
    }
}
CATALOG = [
    {
        "endpoints": [
            {
                "id": "f70464e1",
                "interface": "public",
                "region_id": "RegionOne",
                "url": "http://127.0.0.1:5000/v3/",
                "region": "RegionOne",
            }
        ],
        "id": "b6233f42",
        "type": "identity",
        "name": "keystone",
    }
]


@dataclass
class KeystoneFaults(Faults):
    reject_service_tokens: bool = False
    auth_status: int | None = None
    close_connections: bool = False


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def user_id(name: str) -> str:
    return hashlib.md5(name.encode()).hexdigest()  # an id, not a secret


def mint_token(
    name: str,
    scope: str = "project",
    *,
    nonce: int = 0,
    expires_at: float | None = None,
    key: bytes = DEFAULT_KEY,
) -> str:
    """A token the fake accepts for user ``name`` (scope: project, system or unscoped)."""
    now = time.time()
    exp = expires_at if expires_at is not None else now + TOKEN_LIFETIME
    payload = f"{name}|{scope}|{exp:.0f}|{now:.0f}".encode()
    payload += b" " * (-len(payload) % 16 or 0)
    if len(payload) < 80:
        payload += b" " * (80 - len(payload))
    iv = hashlib.sha256(f"{name}/{nonce}".encode()).digest()[:16]
    body = b"\x80" + struct.pack(">Q", int(now)) + iv + payload
    return _b64(body + hmac.new(key, body, hashlib.sha256).digest())


@dataclass(frozen=True)
class TokenInfo:
    user: str
    scope: str
    expires_at: float
    issued_at: float


def read_token(token: str, key: bytes = DEFAULT_KEY) -> TokenInfo | None:
    """The token's content, or None when it is not one of ours (garbage, tampered)."""
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
    except ValueError:
        return None
    if len(raw) < 1 + 8 + 16 + 32 or raw[0] != 0x80:
        return None
    body, mac = raw[:-32], raw[-32:]
    if not hmac.compare_digest(mac, hmac.new(key, body, hashlib.sha256).digest()):
        return None
    try:
        name, scope, exp, iat = body[25:].decode().strip().split("|")
        return TokenInfo(name, scope, float(exp), float(iat))
    except ValueError:
        return None


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S.000000Z")


def token_body(info: TokenInfo, catalog: bool) -> dict[str, Any]:
    service = info.user == SERVICE_USER
    token: dict[str, Any] = {
        "methods": ["password"],
        "user": {
            "domain": {"id": "default", "name": "Default"},
            "id": user_id(info.user),
            "name": info.user,
            "password_expires_at": None,
        },
        "audit_ids": [_b64(hashlib.sha256(info.user.encode()).digest()[:16])],
        "expires_at": _iso(info.expires_at),
        "issued_at": _iso(info.issued_at),
    }
    if info.scope == "project":
        token["project"] = SERVICE_PROJECT if service else PROJECT
        token["is_domain"] = False
        roles = ["service"] if service else ["member", "reader"]
    elif info.scope == "system":
        token["system"] = {"all": True}
        roles = ["reader"]
    else:
        roles = []
    if roles:
        token["roles"] = [{"id": user_id(r), "name": r} for r in roles]
    if catalog and info.scope != "unscoped":
        token["catalog"] = CATALOG
    return {"token": token}


class FakeKeystone(FakeIdP):
    """The fake IdP's server, counters and control port, answering as Keystone."""

    faults: KeystoneFaults

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        control_port: int | None = None,
        service_password: str = DEFAULT_SERVICE_PASSWORD,
        key: bytes = DEFAULT_KEY,
    ) -> None:
        super().__init__(host, port, control_port)
        self.faults = KeystoneFaults()
        self.service_password = service_password
        self.key = key
        self.counts: dict[str, int] = {"issue": 0, "validate": 0, "groups": 0}

    async def _decide(
        self, method: str, target: str, headers: dict[str, str], body: bytes
    ) -> tuple[int, dict[str, str], bytes]:
        status, hdrs, out = await self._route(method, target, headers, body)
        if self.faults.close_connections:
            hdrs = {**hdrs, "connection": "close"}
        return status, {**hdrs, "vary": "X-Auth-Token"}, out

    async def _route(
        self, method: str, target: str, headers: dict[str, str], body: bytes
    ) -> tuple[int, dict[str, str], bytes]:
        fault = await injected_fault(
            self.faults, lambda status: {"error": {"code": status, "message": "fake fault"}}
        )
        if fault is not None:
            return fault
        url = urlsplit(target)
        query = parse_qs(url.query, keep_blank_values=True)
        if url.path == "/v3/auth/tokens" and method == "POST":
            self.counts["issue"] += 1
            return self._issue(body)
        if url.path == "/v3/auth/tokens" and method in ("GET", "HEAD"):
            self.counts["validate"] += 1
            return self._validate(headers, query, method)
        if url.path.startswith("/v3/users/") and url.path.endswith("/groups") and method == "GET":
            self.counts["groups"] += 1
            return self._groups(headers, url.path.split("/")[3])
        return _json(404, {"error": {"code": 404, "message": "Not Found", "title": "Not Found"}})

    def _unauthorized(self) -> tuple[int, dict[str, str], bytes]:
        return _json(401, UNAUTHORIZED, {"www-authenticate": 'Keystone uri="http://127.0.0.1/v3"'})

    def _issue(self, body: bytes) -> tuple[int, dict[str, str], bytes]:
        if self.faults.auth_status is not None:
            if self.faults.auth_status == 401:
                return self._unauthorized()
            return _json(self.faults.auth_status, {"error": {"code": self.faults.auth_status}})
        try:
            auth = json.loads(body)["auth"]
            user = auth["identity"]["password"]["user"]
            name, password = str(user["name"]), str(user["password"])
        except (ValueError, KeyError, TypeError):
            return _json(400, {"error": {"code": 400, "message": "Invalid input for field"}})
        expected = self.service_password if name == SERVICE_USER else f"pw-{name}"
        if not hmac.compare_digest(password, expected):
            return self._unauthorized()
        scope_doc = auth.get("scope") or {}
        scope = "system" if "system" in scope_doc else "project" if scope_doc else "unscoped"
        token = mint_token(name, scope, nonce=random.getrandbits(64), key=self.key)
        info = read_token(token, self.key)
        assert info is not None
        return _json(201, token_body(info, catalog=True), {"x-subject-token": token})

    def _caller(self, headers: dict[str, str]) -> TokenInfo | tuple[int, dict[str, str], bytes]:
        info = read_token(headers.get("x-auth-token", ""), self.key)
        if info is None or info.expires_at <= time.time() or self.faults.reject_service_tokens:
            return self._unauthorized()
        return info

    def _validate(
        self, headers: dict[str, str], query: dict[str, list[str]], method: str
    ) -> tuple[int, dict[str, str], bytes]:
        caller = self._caller(headers)
        if not isinstance(caller, TokenInfo):
            return caller
        if caller.user != SERVICE_USER:
            return _json(
                403,
                {
                    "error": {
                        "code": 403,
                        "message": "You are not authorized to perform the requested action: "
                        "identity:validate_token.",
                        "title": "Forbidden",
                    }
                },
            )
        subject = headers.get("x-subject-token")
        if not subject:
            return _json(
                404,
                {
                    "error": {
                        "code": 404,
                        "message": "No token in the request",
                        "title": "Not Found",
                    }
                },
            )
        info = read_token(subject, self.key)
        if info is None:
            msg = "Could not recognize Fernet token"
            return _json(404, {"error": {"code": 404, "message": msg, "title": "Not Found"}})
        allow_expired = query.get("allow_expired", ["0"])[0] in ("1", "true", "True")
        if info.expires_at <= time.time() and not allow_expired:
            msg = "Failed to validate token"
            return _json(404, {"error": {"code": 404, "message": msg, "title": "Not Found"}})
        doc = token_body(info, catalog="nocatalog" not in query)
        return _json(200, doc, {"x-subject-token": subject})

    def _groups(self, headers: dict[str, str], uid: str) -> tuple[int, dict[str, str], bytes]:
        caller = self._caller(headers)
        if not isinstance(caller, TokenInfo):
            return caller
        if caller.scope != "system":
            msg = (
                "You are not authorized to perform the requested action: "
                "identity:list_groups_for_user."
            )
            return _json(403, {"error": {"code": 403, "message": msg, "title": "Forbidden"}})
        # Any well-formed id is a user here; the fake does not keep a user table.
        if len(uid) != 32:
            msg = f"Could not find user: {uid}."
            return _json(404, {"error": {"code": 404, "message": msg, "title": "Not Found"}})
        names = ["developers", "ops"] if int(uid, 16) % 2 else ["developers"]
        self_url = f"http://127.0.0.1/v3/users/{uid}/groups"
        groups = [
            {
                "id": user_id(n),
                "name": n,
                "domain_id": "default",
                "description": f"{n} group (fake)",
                "membership_expires_at": None,
                "links": {"self": f"http://127.0.0.1/v3/groups/{user_id(n)}"},
            }
            for n in names
        ]
        return _json(
            200, {"groups": groups, "links": {"next": None, "self": self_url, "previous": None}}
        )

    async def _control_answer(
        self, method: str, target: str, headers: dict[str, str], body: bytes
    ) -> tuple[int, dict[str, str], bytes]:
        if method == "GET" and target == "/_fake/stats":
            s = self.stats()
            doc = {
                "calls": s.calls,
                "by_status": s.by_status,
                "in_flight": s.in_flight,
                "max_in_flight": s.max_in_flight,
                **self.counts,
            }
            return _json(200, doc)
        if method == "POST" and target == "/_fake/reset":
            self.faults = KeystoneFaults()
            await self._set_refuse(False)
            self.reset_stats()
            self.counts = dict.fromkeys(self.counts, 0)
            return _json(200, asdict(self.faults))
        return await super()._control_answer(method, target, headers, body)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--control-port", type=int, default=0)
    parser.add_argument(
        "--service-password",
        default=os.environ.get("FAKE_KEYSTONE_SERVICE_PASSWORD", DEFAULT_SERVICE_PASSWORD),
    )
    args = parser.parse_args()
    ks = FakeKeystone(
        port=args.port, control_port=args.control_port, service_password=args.service_password
    )

    async def forever() -> None:
        await ks.run()
        print(
            f"fake Keystone on http://127.0.0.1:{ks.port}/v3, control on {ks.control_port}",
            flush=True,
        )
        await asyncio.Event().wait()

    asyncio.run(forever())


if __name__ == "__main__":
    main()
