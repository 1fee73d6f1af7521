"""The Keystone backend against a real Keystone 22, through the whole gateway.

One Keystone (Debian's package under uWSGI, see tests/support/keystone.py) serves the
module; a counting, fault-injecting proxy (tests/support/keystone_proxy.py) stands in
front of it, so each test can count what Keystone received and make it slow, refuse
the service token, or hang.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import time
from typing import Any, cast

import httpx
import pytest

from authn_gateway.config import ConfigError, parse_config
from backends.base import Rejected, Unavailable
from backends.http import TLSClientSettings, make_client
from backends.keystone import (
    FERNET_MIN_LENGTH,
    KeystoneBackend,
    KeystoneSettings,
    ServiceCredentials,
    ServiceToken,
    ServiceTokenSettings,
)
from backends.keystone.groups import GroupLookup
from backends.keystone.identity import map_identity
from backends.keystone.service_token import ServiceTokenAuth
from backends.keystone.settings import GroupLookupSettings
from backends.settings import TimeoutSettings
from tests.support.fakes.idp import serve_h11


def _config_with(**backend: Any) -> str:
    base: dict[str, Any] = {
        "name": "ks",
        "type": "keystone",
        "auth_url": "https://keystone.example:5000",
        "service": {"username": "gw", "password": "pw", "system_scope": "all"},
    }
    base.update(backend)
    return json.dumps({"backends": [base]})


def test_config_accepts_a_minimal_keystone_backend():
    config = parse_config(_config_with(), "test.yaml")
    settings = config.backends[0]

    assert isinstance(settings, KeystoneSettings)
    assert settings.v3_url == "https://keystone.example:5000/v3"
    assert isinstance(settings.build(), KeystoneBackend)


@pytest.mark.parametrize(
    ("backend", "message"),
    [
        (
            {"service": {"username": "gw", "password": "pw", "project_name": "service"}},
            "groups.enabled: listing a user's groups needs a system-scoped service token",
        ),
        ({"service": {"username": "gw", "system_scope": "all"}}, "password: required"),
        (
            {"service": {"username": "gw", "password": "pw"}},
            "exactly one of system_scope or project_name",
        ),
        (
            {"service": {"application_credential_id": "x", "username": "gw", "password": "p"}},
            "not both",
        ),
        ({"username_template": "{user_nmae}"}, "username_template: unknown field {user_nmae}"),
        ({"group_template": "{group_name!r}"}, "conversions are not supported"),
        ({"service": {"username": "gw", "password": "env:NO_SUCH_VAR_X", "system_scope": "all"}},
         "environment variable NO_SUCH_VAR_X is not set"),
    ],
)  # fmt: skip
def test_config_errors_name_the_field(backend: dict[str, Any], message: str):
    with pytest.raises(ConfigError) as err:
        parse_config(_config_with(**backend), "test.yaml")

    assert message in str(err.value)


def test_application_credential_service_login_needs_no_scope():
    config = parse_config(
        _config_with(
            service={"application_credential_id": "abc", "application_credential_secret": "s"},
            groups={"enabled": False},
        ),
        "test.yaml",
    )
    body = config.backends[0].service.auth_request()  # type: ignore[union-attr]

    assert body["auth"]["identity"]["methods"] == ["application_credential"]
    assert "scope" not in body["auth"]


def test_fernet_precheck_is_conservative():
    settings = KeystoneSettings.model_validate(
        json.loads(_config_with(fernet_precheck=True))["backends"][0]
    )
    backend = KeystoneBackend(settings)
    real = "gAAAAABrDYVBbLszXm_-hDFxBsPJlstm8uZNh4NyiFmTLRoYOnjpZPKhyWi0kQH734jyquc0PmJXGcgJI5d2P_bXmvZa-WYuvOYaNldFOFIbFsEg4In-mWpJLjjTPwwygJjmbIM8VwjFxXl2hX0QqlbtPr6tsDQbr_mq-UCUexrM2MRlcfz132U"  # noqa: E501

    assert backend.could_accept(real)
    assert backend.could_accept("gAAAAA" + "a" * (FERNET_MIN_LENGTH - 6))
    assert not backend.could_accept("gAAAAA" + "a" * (FERNET_MIN_LENGTH - 7))
    assert not backend.could_accept(real.replace("_", "/"))
    assert not backend.could_accept("eyJhbGciOiJFUzI1NiJ9." + "a" * 200)
    asyncio.run(backend.close())


def _login_answer(lifetime: float, logins: list[float]) -> httpx.MockTransport:
    def handle(request: httpx.Request) -> httpx.Response:
        assert request.method == "POST" and request.url.path == "/v3/auth/tokens"
        logins.append(time.monotonic())
        issued = dt.datetime.now(dt.UTC)
        body = {
            "token": {
                "issued_at": issued.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
                "expires_at": (issued + dt.timedelta(seconds=lifetime)).strftime(
                    "%Y-%m-%dT%H:%M:%S.%fZ"
                ),
            }
        }
        return httpx.Response(201, json=body, headers={"X-Subject-Token": f"svc-{len(logins)}"})

    return httpx.MockTransport(handle)


def _service_token(transport: httpx.MockTransport) -> tuple[ServiceToken, httpx.AsyncClient]:
    client = httpx.AsyncClient(base_url="http://keystone.invalid/v3/", transport=transport)
    credentials = ServiceCredentials(username="gw", password="pw", system_scope="all")  # type: ignore[arg-type]
    token = ServiceToken(
        "ks", client, credentials, ServiceTokenSettings(), TimeoutSettings(total_seconds=2.0)
    )
    return token, client


async def test_concurrent_reviews_share_one_service_login():
    logins: list[float] = []
    service, client = _service_token(_login_answer(3600, logins))
    try:
        tokens = await asyncio.gather(*(service.get() for _ in range(50)))
    finally:
        await service.close()
        await client.aclose()

    assert set(tokens) == {"svc-1"}
    assert len(logins) == 1


async def test_service_token_is_refreshed_once_before_it_expires():
    logins: list[float] = []
    service, client = _service_token(_login_answer(2.0, logins))
    await service.start()
    try:
        assert await service.get() == "svc-1"
        # Lifetime 2 s: refreshed at half of it, by the one background task.
        for _ in range(100):
            await asyncio.sleep(0.05)
            if len(logins) >= 2:
                break
        assert await service.get() == "svc-2"
    finally:
        await service.close()
        await client.aclose()

    assert len(logins) == 2
    # Not before its time (half the lifetime, less the jitter-free margin).
    assert logins[1] - logins[0] >= 0.8


class PagedGroups:
    """Keystone's ``GET /v3/users/{id}/groups`` answered in ``pages`` pages, each
    linking the next (on ``next_host`` when given: a link to another host)."""

    def __init__(self, pages: int, next_host: str | None = None) -> None:
        self.pages, self.next_host, self.calls, self.port = pages, next_host, 0, 0

    async def answer(
        self, method: str, target: str, headers: dict[str, str], body: bytes
    ) -> tuple[int, dict[str, str], bytes]:
        self.calls += 1
        page = int(target.rpartition("page=")[2]) if "page=" in target else 1
        host = self.next_host or f"127.0.0.1:{self.port}"
        following = f"http://{host}/v3/users/u1/groups?page={page + 1}"
        doc = {
            "groups": [{"id": f"g{page}", "name": f"group-{page}", "domain_id": "default"}],
            "links": {"next": following if page < self.pages else None},
        }
        return 200, {"content-type": "application/json"}, json.dumps(doc).encode()


@pytest.mark.parametrize(
    ("pages", "next_host", "expected"),
    [
        (2, None, ("group-1", "group-2")),
        # More pages than max_pages: the user's groups, not Keystone failing.
        (3, None, Rejected("user has more than 2 pages of groups", "unmapped")),
        # The service token never follows a link to another host.
        (3, "203.0.113.9:5000", Unavailable("Keystone's next-page link points elsewhere")),
    ],
    ids=["within", "too-many", "elsewhere"],
)
async def test_group_pages_past_max_pages_refuse_the_user_not_blame_keystone(
    pages: int, next_host: str | None, expected: object
) -> None:
    fake = PagedGroups(pages, next_host)
    server = await asyncio.start_server(lambda r, w: serve_h11(r, w, fake.answer), "127.0.0.1", 0)
    fake.port = server.sockets[0].getsockname()[1]
    base = f"http://127.0.0.1:{fake.port}/v3/"
    client = make_client(base, TimeoutSettings(), TLSClientSettings())
    lookup = GroupLookup(
        GroupLookupSettings(max_pages=2), client, cast(ServiceTokenAuth, httpx.Auth()), base
    )
    try:
        found = await lookup.get("u1")
    finally:
        await client.aclose()
        server.close()
        await server.wait_closed()
    if isinstance(expected, tuple):
        assert isinstance(found, tuple) and tuple(g.name for g in found) == expected
    else:
        assert found == expected
    # Never past max_pages; a link elsewhere is not followed at all.
    assert fake.calls == (1 if next_host else min(pages, 2))


def test_a_token_whose_user_maps_to_an_empty_name_is_refused_not_keystone_failing() -> None:
    settings = KeystoneSettings.model_validate(
        {"name": "ks", "type": "keystone", "auth_url": "http://127.0.0.1:5000/v3",
         "service": {"username": "svc", "password": "x", "project_name": "service"},
         "groups": {"enabled": False}, "username_template": "{user_domain_name}"}
    )  # fmt: skip
    body = {
        "user": {"id": "u1", "name": "alice", "domain": {"id": "d1", "name": ""}},
        "expires_at": "2030-01-01T00:00:00.000000Z",
        "project": {"id": "p1", "name": "demo", "domain": {"id": "d1", "name": ""}},
    }
    assert map_identity(body, (), settings) == Rejected(
        "username_template gave an empty user name", "unmapped"
    )
