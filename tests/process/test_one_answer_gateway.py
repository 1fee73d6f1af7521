"""An IdP answer belongs to exactly one request, through a real gateway process: a
userinfo backend in front of an IdP that sends strays (an answer on an idle connection,
one appended to the right answer, a late one after the review gave up, split across
reads). Every review names its own user or fails, and what the gateway cached is right:
a second round is answered from the cache (the IdP's request count does not move) with
the same users. The wire-level tests: tests/unit/test_wire_one_answer.py."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from tests.support import loadclient
from tests.support.fakes.raw import ScriptedIdP, Steps, userinfo_answer
from tests.support.procs import GatewayProcess

USERS = ["alice", "bob", "carol", "dave"]


def script_for(stray: str) -> Callable[[int, str], Steps]:
    extra = userinfo_answer("stray")

    def script(n: int, user: str) -> Steps:
        right = userinfo_answer(user)
        head = right.index(b"\r\n\r\n") + 4
        if n != (2 if stray == "late" else 1):
            return [right]
        return {
            "idle": [right, 0.02, extra],
            "idle-split": [right, 0.02, extra[:30], 0.05, extra[30:]],
            "appended": [right + extra],
            "appended-after-the-head": [right[:head], 0.02, right[head:] + extra],
            "appended-partial": [right + extra[:25], 0.1, extra[25:]],
            # Bob's answer, long after his review's deadline (0.5 s) ended the call.
            "late": [1.0, right],
        }[stray]

    return script


@pytest.fixture
async def idp_server() -> AsyncIterator[Callable[[str], Awaitable[ScriptedIdP]]]:
    servers: list[asyncio.Server] = []

    async def start(stray: str) -> ScriptedIdP:
        idp = ScriptedIdP(script_for(stray))
        servers.append(await idp.start())
        return idp

    yield start
    for server in servers:
        server.close()
        await server.wait_closed()


async def closed_out_of_step(gw: GatewayProcess, within: float = 10.0) -> bool:
    """Whether the gateway logs, within ``within`` seconds, that it closed an IdP
    connection that went out of step."""
    for _ in range(int(within / 0.05)):
        if "closed, never reused" in gw.logs():
            return True
        await asyncio.sleep(0.05)
    return False


async def review(gw: GatewayProcess, idp: ScriptedIdP, user: str) -> str:
    """The user the gateway's answer names, or "error: <its error>"; returns once the
    IdP wrote all it meant to for this review."""
    (answer,) = await loadclient.storm(gw.url, [f"tok-{user}"], 1)
    await idp.quiet()
    status = answer.review
    if status.get("authenticated"):
        return str(status["user"]["username"])
    return f"error: {status.get('error')}"


@pytest.mark.parametrize(
    "stray",
    ["idle", "idle-split", "appended", "appended-after-the-head", "appended-partial", "late"],
)
async def test_every_review_names_its_own_user_and_the_cache_holds_only_those(
    idp_server: Callable[[str], Awaitable[ScriptedIdP]],
    gateway_factory: Callable[..., GatewayProcess],
    stray: str,
) -> None:
    idp = await idp_server(stray)
    backend = {
        "name": "idp",
        "type": "userinfo",
        "url": f"{idp.url}/userinfo",
        "timeouts": {"connect_seconds": 0.5, "read_seconds": 2.0, "total_seconds": 0.5},
        "breaker": {"fail_max": 1000},
        "bucket": {"rate": 1000, "burst": 1000},
    }
    gw = gateway_factory({"backends": [backend]})
    first = [await review(gw, idp, USERS[0])]
    if stray != "late":
        # The stray reached the gateway (another process) before bob's review goes out;
        # one that crossed his request on the wire would be his answer, to any client.
        assert await closed_out_of_step(gw), gw.logs()[-2000:]
    first += [await review(gw, idp, user) for user in USERS[1:]]
    if stray == "late":
        assert first[1].startswith("error: "), first
        first[1] = "bob"  # his review failed, as it should; the others are checked
    assert first == USERS, (stray, first)
    asked = idp.requests
    second = [await review(gw, idp, user) for user in USERS]
    assert second == USERS, (stray, second)
    # Answered from the cache, except bob after his failed review ("late").
    assert idp.requests == asked + (1 if stray == "late" else 0), (asked, idp.requests)
    assert idp.connections == 2, idp.connections  # the one that went out of step, a new one
