"""Every HTTP client of the backends keeps one answer per request (issue 29, finding 3):
Keystone's service login and validations, the JWT backend's discovery and key-set
fetches, and the clients of userinfo, GitLab and introspection all go out through the
guarded wire (backends/one_answer.py). A stray answer on an idle connection, sent by a
raw IdP over real sockets, is never read: the service token, each user and each key set
are the ones asked for, and the IdP counts a new connection after each stray.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable

import httpx
import pytest

from backends.base import Authenticated
from backends.gitlab import GitLabBackend, GitLabSettings
from backends.introspection import IntrospectionBackend, IntrospectionSettings
from backends.jwt.backend import JWTSettings, issuer_client
from backends.keystone.backend import KeystoneBackend
from backends.keystone.settings import KeystoneSettings
from backends.one_answer import OneAnswerHandler
from backends.userinfo import UserinfoBackend, UserinfoSettings
from backends.wire import AiohttpWire
from tests.support.fakes.keystone import SERVICE_USER, mint_token, read_token, token_body
from tests.support.fakes.raw import RawIdP, ScriptedIdP

SERVICE_PASSWORD = "GatewayPass123"


def answer(status: int, document: object, **headers: str) -> bytes:
    body = json.dumps(document).encode()
    head = f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\n"
    head += "".join(f"{k.replace('_', '-')}: {v}\r\n" for k, v in headers.items())
    return head.encode() + b"Content-Length: %d\r\n\r\n" % len(body) + body


def header(head: bytes, name: bytes) -> str:
    for line in head.split(b"\r\n")[1:]:
        key, _, value = line.partition(b":")
        if key.strip().lower() == name:
            return value.strip().decode()
    return ""


class StrayingKeystone(RawIdP):
    """Keystone's login and validation, as the fake Keystone answers them, each with a
    stray validation answer naming ``mallory``: appended to the login's answer (the
    validation follows the login at once, so a stray sent any later could cross it on
    the wire, which no HTTP/1.1 client can tell), on the idle connection after each
    validation's."""

    def __init__(self) -> None:
        super().__init__(self._answer)
        self.logins = 0
        self.settled = asyncio.Event()

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.settled.clear()
        head = self.heads[-1]
        stray_token = read_token(mint_token("mallory"))
        assert stray_token is not None
        stray = answer(200, token_body(stray_token, catalog=False))
        try:
            if head.startswith(b"POST /v3/auth/tokens"):
                await reader.readexactly(int(header(head, b"content-length")))
                self.logins += 1
                token = mint_token(SERVICE_USER, "system", nonce=self.logins)
                info = read_token(token)
                assert info is not None
                login = answer(201, token_body(info, catalog=False), x_subject_token=token)
                writer.write(login + stray)
                return
            caller = read_token(header(head, b"x-auth-token"))
            info = read_token(header(head, b"x-subject-token"))
            assert caller is not None and caller.user == SERVICE_USER, "no service token"
            assert info is not None
            writer.write(answer(200, token_body(info, catalog=False)))
            await writer.drain()
            await asyncio.sleep(0.02)
            writer.write(stray)
        finally:
            self.settled.set()


@pytest.fixture
async def keystone() -> AsyncIterator[StrayingKeystone]:
    idp = StrayingKeystone()
    server = await idp.start()
    yield idp
    server.close()
    await server.wait_closed()


async def test_keystone_login_and_validations_each_get_their_own_answer(
    keystone: StrayingKeystone,
) -> None:
    settings = KeystoneSettings.model_validate(
        {
            "name": "keystone",
            "type": "keystone",
            "auth_url": f"{keystone.url}/v3",
            "service": {
                "username": SERVICE_USER,
                "password": SERVICE_PASSWORD,
                "system_scope": "all",
            },
            "groups": {"enabled": False},
            "timeouts": {"connect_seconds": 0.5, "read_seconds": 1.0, "total_seconds": 2.0},
        }
    )
    backend = KeystoneBackend(settings)
    seen = []
    try:
        for user in ("alice", "bob", "carol"):
            outcome = await backend.authenticate(mint_token(user))
            seen.append(outcome.user.username if isinstance(outcome, Authenticated) else outcome)
            await keystone.settled.wait()
            await asyncio.sleep(0.03)
    finally:
        await backend.close()
    # The stray after the login was not taken for alice's validation (it would have
    # named mallory), nor any stray after a validation for the next user's.
    assert seen == ["alice", "bob", "carol"], seen
    assert keystone.logins == 1
    # The login's connection, then one for each validation (each ended by its stray).
    assert (keystone.connections, keystone.requests) == (4, 4), keystone.connections


async def test_jwks_and_discovery_fetches_each_get_their_own_answer() -> None:
    discovery = {"issuer": "https://issuer.example", "jwks_uri": "https://issuer.example/k"}
    real = {"keys": [{"kty": "oct", "kid": "real", "k": "AAAA"}]}
    rogue = {"keys": [{"kty": "oct", "kid": "rogue", "k": "BBBB"}]}

    def script(n: int, _user: str) -> list[bytes | float]:
        # A stray key set after every answer: read as the next fetch's, the rogue key
        # would verify tokens.
        return [answer(200, discovery if n == 1 else real), 0.02, answer(200, rogue)]

    idp = ScriptedIdP(script)
    server = await idp.start()
    settings = JWTSettings.model_validate(
        {
            "name": "oidc",
            "type": "jwt",
            "issuer": {"url": "https://issuer.example", "audiences": ["a"]},
            "claimMappings": {"username": {"claim": "sub", "prefix": ""}},
        }
    )
    client = issuer_client(settings)  # its settings only shape TLS; the URL is ours
    got = []
    try:
        for path in ("/.well-known/openid-configuration", "/keys", "/keys"):
            got.append((await client.get(f"{idp.url}{path}")).json())
            await idp.quiet()
    finally:
        await client.aclose()
        server.close()
        await server.wait_closed()
    assert got == [discovery, real, real], got
    assert (idp.connections, idp.requests) == (3, 3), idp.connections


def _innermost(client: httpx.AsyncClient) -> object:
    transport: object = client._transport
    while hasattr(transport, "_inner"):  # the wrappers of backends.http
        transport = transport._inner
    return transport


def _client(kind: str, url: str) -> httpx.AsyncClient:
    timeouts = {"connect_seconds": 0.5, "read_seconds": 1.0, "total_seconds": 1.0}
    common = {"timeouts": timeouts}
    builders: dict[str, Callable[[], httpx.AsyncClient]] = {
        "userinfo": lambda: (
            UserinfoBackend(
                UserinfoSettings.model_validate(
                    {"name": "u", "type": "userinfo", "url": url, **common}
                )
            )._client
        ),
        "gitlab": lambda: (
            GitLabBackend(
                GitLabSettings.model_validate(
                    {"name": "g", "type": "gitlab", "base_url": url, **common}
                )
            )._client
        ),
        "introspection": lambda: (
            IntrospectionBackend(
                IntrospectionSettings.model_validate(
                    {
                        "name": "i",
                        "type": "introspection",
                        "url": url,
                        "client_id": "gw",
                        "client_secret": "a-long-enough-client-secret",
                        "accept": {"client_ids": ["cli"]},
                        "claimMappings": {"username": {"claim": "sub", "prefix": ""}},
                        **common,
                    }
                )
            )._client
        ),
        "keystone": lambda: (
            KeystoneBackend(
                KeystoneSettings.model_validate(
                    {
                        "name": "k",
                        "type": "keystone",
                        "auth_url": f"{url}/v3",
                        "service": {"username": "gw", "password": "pw", "system_scope": "all"},
                        **common,
                    }
                )
            )._client
        ),
        "jwt-issuer": lambda: issuer_client(
            JWTSettings.model_validate(
                {
                    "name": "j",
                    "type": "jwt",
                    "issuer": {"url": "https://issuer.example", "audiences": ["a"]},
                    "claimMappings": {"username": {"claim": "sub", "prefix": ""}},
                }
            )
        ),
    }
    return builders[kind]()


@pytest.mark.parametrize("kind", ["userinfo", "gitlab", "introspection", "keystone", "jwt-issuer"])
async def test_every_http_backend_client_pools_guarded_connections(kind: str) -> None:
    idp = ScriptedIdP(lambda n, user: [answer(200, {"ok": True})])
    server = await idp.start()
    client = _client(kind, idp.url)
    try:
        wire = _innermost(client)
        assert isinstance(wire, AiohttpWire), type(wire)
        assert (await client.get(f"{idp.url}/x")).status_code == 200
        connector = wire._session.connector  # type: ignore[union-attr]
        pooled = [proto for conns in connector._conns.values() for proto, _ in conns]
    finally:
        await client.aclose()
        server.close()
        await server.wait_closed()
    assert len(pooled) == 1 and isinstance(pooled[0], OneAnswerHandler), pooled
