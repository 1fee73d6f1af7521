"""An LDAP answer belongs to exactly one operation (issue 29, finding 3, for LDAP).

The service account's pooled connections carry every user's search. LDAP numbers its
operations (RFC 4511 messageID) and ldap3's synchronous strategy refuses an answer whose
id is not the operation's ("invalid messageId received", a communication error). The
backend's pool then closes that connection and runs the search once more on a fresh one
(backends/ldap/pool.py, ServicePool.run); a timed-out operation's connection is closed by
ldap3 itself, so its late answer reaches nobody. A review is cancelled only on the
asyncio side: its thread finishes its own operation before the slot is free.

A real slapd behind a proxy (tests/support/ldap_proxy.py) that sends a search's answer
where nobody asked for it: each review names its own user, or fails.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from backends.base import Authenticated, Unavailable
from backends.ldap import LDAPBackend, LDAPSettings
from tests.support.ldap_proxy import LDAPProxy
from tests.support.slapd import (
    PEOPLE,
    SERVICE_DN,
    SERVICE_PASSWORD,
    USERS,
    Slapd,
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def slapd(module_slapd: Slapd) -> Slapd:
    return module_slapd


@pytest.fixture
async def proxy(slapd: Slapd) -> AsyncIterator[LDAPProxy]:
    p = LDAPProxy(slapd.ldap_port)
    await p.start()
    yield p
    await p.stop()


def backend(proxy: LDAPProxy, tmp_path: Path) -> LDAPBackend:
    secret = tmp_path / "bind-password"
    secret.write_text(SERVICE_PASSWORD)
    settings = {
        "name": "ldap",
        "type": "ldap",
        "url": proxy.url,
        "allow_plaintext": True,
        "bind_dn": SERVICE_DN,
        "bind_password": f"file:{secret}",
        "user_base": PEOPLE,
        "pool": {"size": 1},  # every search on the one pooled service connection
        "timeouts": {"connect_seconds": 1.0, "read_seconds": 1.0, "total_seconds": 3.0},
    }
    return LDAPBackend(LDAPSettings.model_validate(settings))


async def review(b: LDAPBackend, proxy: LDAPProxy, user: str) -> str:
    token = base64.b64encode(f"{user}:{USERS[user].password}".encode()).decode()
    outcome = await b.authenticate(token)
    await proxy.settled.wait()
    await asyncio.sleep(0.05)  # what the proxy sent is on the backend's side
    if isinstance(outcome, Authenticated):
        return outcome.user.username
    assert isinstance(outcome, Unavailable), outcome
    return f"error: {outcome.reason}"


async def test_an_answer_replayed_on_an_idle_service_connection_is_nobodys(
    proxy: LDAPProxy, tmp_path: Path
) -> None:
    proxy.replay = True  # alice's search answer again, 50 ms after the first
    b = backend(proxy, tmp_path)
    try:
        seen = [await review(b, proxy, user) for user in ("alice", "bob", "carol")]
        opened = b.pool.opened if b.pool is not None else 0
    finally:
        await b.close()
    assert proxy.replayed == 1
    # Bob's search read alice's stray first (an old message id): refused, the connection
    # closed, the search run again on a fresh one.
    assert seen == ["alice", "bob", "carol"], seen
    assert opened == 2, opened


async def test_a_late_answer_after_a_timed_out_search_is_nobodys(
    proxy: LDAPProxy, tmp_path: Path
) -> None:
    proxy.late_search, proxy.late_seconds = 2, 1.6  # bob's, past the 1 s read timeout
    b = backend(proxy, tmp_path)
    try:
        seen = [await review(b, proxy, user) for user in ("alice", "bob", "carol", "alice")]
        opened = b.pool.opened if b.pool is not None else 0
    finally:
        await b.close()
    # A timeout is not retried (the server is slow); ldap3 closed the connection, so
    # bob's late answer went nowhere and carol's search ran on a fresh one.
    assert seen == ["alice", "error: timed out", "carol", "alice"], seen
    assert opened == 2, opened
