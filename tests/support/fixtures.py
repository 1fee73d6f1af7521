"""Fixtures that tests of more than one tier use (tests/conftest.py registers this
module as a plugin): each starts a real server on loopback and stops it after."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from tests.support.fakes.gitlab import FakeGitLab
from tests.support.fakes.idp import FakeIdP
from tests.support.fakes.issuer import FakeIssuer
from tests.support.fakes.raw import Behaviour, RawIdP
from tests.support.gitlab_helpers import seed
from tests.support.slapd import SERVICE_PASSWORD, Slapd, make_ca, start_slapd
from tests.support.wire_helpers import Serve


@pytest.fixture(scope="module")
def gitlab_server() -> Iterator[FakeGitLab]:
    """GitLab's documented API, with the users, groups and tokens of gitlab_helpers: one
    per test module (a module's shared gateway points at it)."""
    gitlab = FakeGitLab(seed=seed()).start_in_thread()
    try:
        yield gitlab
    finally:
        gitlab.stop()


@pytest.fixture
def fake_gitlab(gitlab_server: FakeGitLab) -> Iterator[FakeGitLab]:
    """The module's fake GitLab, its tokens, faults and counts cleared for each test."""
    gitlab_server.reset()
    yield gitlab_server
    gitlab_server.reset()
    gitlab_server.external_url = None


@pytest.fixture
def issuer() -> Iterator[FakeIssuer]:
    """An OIDC issuer (discovery, JWKS) that mints tokens."""
    fake = FakeIssuer().start_in_thread()
    try:
        yield fake
    finally:
        fake.stop()


@pytest.fixture(scope="module")
def es256_issuer() -> Iterator[FakeIssuer]:
    """An OIDC issuer with an ES256 key "ec-1", shared by a module's tests."""
    fake = FakeIssuer().start_in_thread()
    fake.add_key("ec-1", "ES256")
    try:
        yield fake
    finally:
        fake.stop()


@pytest.fixture(scope="module")
def module_slapd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Slapd]:
    """A slapd of the test module's own, with the test directory (about 0.3 s to start)."""
    d = tmp_path_factory.mktemp("slapd")
    server = start_slapd(d / "slapd", make_ca(d / "ca", "test-ca"))
    yield server
    server.stop()


@pytest.fixture(scope="session")
def service_password_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The LDAP service account's bind password, as a mounted secret file."""
    path = tmp_path_factory.mktemp("secrets") / "ldap-bind-password"
    path.write_text(SERVICE_PASSWORD + "\n")
    return path


@pytest.fixture
def second_idp() -> Iterator[FakeIdP]:
    """A second fault-injecting IdP, for chains of backends."""
    idp = FakeIdP(control_port=0).start_in_thread()
    try:
        yield idp
    finally:
        idp.stop()


@pytest.fixture
async def serve() -> AsyncIterator[Serve]:
    """Starts raw IdP servers with a given behaviour; all are closed at the end."""
    servers: list[asyncio.Server] = []

    async def start(behaviour: Behaviour) -> RawIdP:
        idp = RawIdP(behaviour)
        servers.append(await idp.start())
        return idp

    yield start
    for server in servers:
        server.close()
        await server.wait_closed()
