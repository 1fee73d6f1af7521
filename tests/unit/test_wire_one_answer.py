"""An IdP answer belongs to exactly one request (issue 29, finding 3): whatever an IdP or
a proxy in front of it sends besides the answer it was asked for (a response on an idle
pooled connection, a late one after a timeout, one appended to the right answer, any of
them split across reads), every review gets its own user or an error, never another's.

Real sockets on loopback; the IdP (tests/support/fakes/raw.py, ScriptedIdP) answers
token ``tok-<user>`` with ``<user>``, and strays name ``stray-*``, so that an answer
read by the wrong request shows. Each test also counts the IdP's connections: a clean
connection is reused, one that went out of step is not. The same through a real
gateway process: tests/process/test_one_answer_gateway.py.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import tomllib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from packaging.requirements import Requirement

from backends import one_answer
from backends.base import Authenticated
from backends.http import TLSClientSettings, make_client
from backends.one_answer import (
    TESTED_AIOHTTP_MINORS,
    OneAnswerHandler,
    aiohttp_minor,
    c_parser,
    untested_aiohttp,
)
from backends.settings import TimeoutSettings
from backends.userinfo import UserinfoBackend, UserinfoSettings
from tests.support.fakes.raw import ScriptedIdP, Steps, userinfo_answer

USERS = ["alice", "bob", "carol", "dave"]

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"

Serve = Callable[[Callable[[int, str], Steps]], Awaitable[ScriptedIdP]]


@pytest.fixture
async def serve() -> AsyncIterator[Serve]:
    servers: list[asyncio.Server] = []

    async def start(script: Callable[[int, str], Steps]) -> ScriptedIdP:
        idp = ScriptedIdP(script)
        servers.append(await idp.start())
        return idp

    yield start
    for server in servers:
        server.close()
        await server.wait_closed()


def backend(idp: ScriptedIdP, read: float = 0.3, total: float = 2.0) -> UserinfoBackend:
    settings = UserinfoSettings.model_validate(
        {
            "name": "idp",
            "type": "userinfo",
            "url": f"{idp.url}/userinfo",
            "timeouts": {"connect_seconds": 0.5, "read_seconds": read, "total_seconds": total},
        }
    )
    return UserinfoBackend(settings)


async def review(b: UserinfoBackend, user: str, within: float | None = None) -> str:
    """The user the backend's answer names, or "error: <reason>"."""
    try:
        outcome = await asyncio.wait_for(b.authenticate(f"tok-{user}"), within)
    except TimeoutError:
        return "error: cancelled"
    if isinstance(outcome, Authenticated):
        return outcome.user.username
    return f"error: {getattr(outcome, 'reason', outcome)}"


async def reviews(idp: ScriptedIdP, b: UserinfoBackend, users: list[str] = USERS) -> list[str]:
    """One review after another, each once the IdP wrote all it meant to for the last."""
    seen = []
    for user in users:
        seen.append(await review(b, user))
        await idp.quiet()
    return seen


@pytest.mark.parametrize("split", [False, True], ids=["one-write", "split-across-reads"])
async def test_an_answer_on_an_idle_connection_is_nobodys(serve: Serve, split: bool) -> None:
    # The finding: bob got the stray, carol got bob, dave got carol.
    stray = userinfo_answer("stray-idle")

    def script(n: int, user: str) -> Steps:
        after: Steps = [0.02, stray[:25], 0.03, stray[25:]] if split else [0.02, stray]
        return [userinfo_answer(user), *(after if n == 1 else [])]

    idp = await serve(script)
    b = backend(idp)
    try:
        seen = await reviews(idp, b)
    finally:
        await b.close()
    assert seen == USERS
    # The first connection was closed when the stray came; the rest share a second one.
    assert (idp.connections, idp.requests) == (2, 4), (idp.connections, idp.requests)


@pytest.mark.parametrize(
    "how",
    [
        "whole",
        "after-a-split-head",
        "partial",
        "partial-rest-later",
        "chunked-then-whole",
        "an-interim-one",
    ],
)
async def test_an_answer_appended_to_the_right_one_is_nobodys(serve: Serve, how: str) -> None:
    # aiohttp handed the connection back to the pool at the end of alice's body, before
    # the rest of that read was parsed: the stray waited there for bob.
    stray = userinfo_answer("stray-appended")
    right = userinfo_answer("alice", chunked=how == "chunked-then-whole")
    cut = right.index(b"\r\n\r\n") + 4
    first: Steps = {
        "whole": [right + stray],
        "after-a-split-head": [right[:cut], 0.02, right[cut:] + stray],
        "partial": [right + stray[:20]],
        "partial-rest-later": [right + stray[:20], 0.05, stray[20:]],
        "chunked-then-whole": [right + stray],
        "an-interim-one": [right[:cut], 0.02, right[cut:] + b"HTTP/1.1 103 Early Hints\r\n\r\n"],
    }[how]
    idp = await serve(lambda n, user: first if n == 1 else [userinfo_answer(user)])
    b = backend(idp)
    try:
        seen = await reviews(idp, b)
    finally:
        await b.close()
    assert seen == USERS
    assert (idp.connections, idp.requests) == (2, 4), (idp.connections, idp.requests)


async def test_an_interim_answer_before_the_final_one_is_read_and_the_connection_kept(
    serve: Serve,
) -> None:
    # 100 Continue and 103 Early Hints come before the answer; aiohttp skips them.
    interim = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n"
    idp = await serve(lambda n, user: [interim, 0.01, userinfo_answer(user)])
    b = backend(idp)
    try:
        seen = await reviews(idp, b)
    finally:
        await b.close()
    assert seen == USERS
    assert idp.connections == 1


@pytest.mark.parametrize("gave_up", ["read-timeout", "cancelled"])
async def test_a_late_answer_after_the_request_gave_up_is_nobodys(
    serve: Serve, gave_up: str
) -> None:
    # Bob's answer comes 0.6 s late: after the wire's read timeout (0.3 s), or after the
    # review's deadline cancelled the call (0.3 s, with a read timeout of 2 s).
    def script(n: int, user: str) -> Steps:
        return [0.6, userinfo_answer(user)] if user == "bob" else [userinfo_answer(user)]

    idp = await serve(script)
    timed_out = gave_up == "read-timeout"
    b = backend(idp, read=0.3 if timed_out else 2.0)
    seen = []
    try:
        for user in USERS:
            seen.append(
                await review(b, user, within=0.3 if user == "bob" and not timed_out else None)
            )
            await idp.quiet()  # bob's late answer is on the wire before carol asks
    finally:
        await b.close()
    bob = "error: timed out" if timed_out else "error: cancelled"
    assert seen == ["alice", bob, "carol", "dave"]
    assert (idp.connections, idp.requests) == (2, 4), (idp.connections, idp.requests)


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
async def test_an_answer_split_across_reads_is_read_whole_and_the_connection_kept(
    serve: Serve, chunked: bool
) -> None:
    def script(n: int, user: str) -> Steps:
        answer = userinfo_answer(user, chunked)
        cuts = [0, 9, 30, len(answer) - 40, len(answer) - 1, len(answer)]
        steps: Steps = []
        for start, end in itertools.pairwise(cuts):
            steps += [answer[start:end], 0.005]
        return steps

    idp = await serve(script)
    b = backend(idp)
    try:
        seen = await reviews(idp, b)
    finally:
        await b.close()
    assert seen == USERS
    assert idp.connections == 1  # the guard costs a clean connection nothing


@pytest.mark.parametrize("how", ["left-unread", "refused-for-its-size"])
async def test_a_connection_whose_answer_was_not_read_to_its_end_is_not_reused(
    serve: Serve, how: str
) -> None:
    big = b"HTTP/1.1 200 OK\r\nContent-Length: 200000\r\n\r\n" + b"x" * 200_000
    huge = b"HTTP/1.1 200 OK\r\nContent-Length: 99999999\r\n\r\n" + b"x" * 1000
    idp = await serve(lambda n, user: [big if how == "left-unread" else huge])
    timeouts = TimeoutSettings(connect_seconds=0.5, read_seconds=0.5, total_seconds=0.5)
    async with make_client(idp.url, timeouts, TLSClientSettings()) as c:
        for _ in range(2):
            if how == "left-unread":
                async with c.stream("GET", "/") as answer:
                    async for _chunk in answer.aiter_raw():
                        break  # the rest of the body is never read
            else:
                with pytest.raises(httpx.TransportError, match="larger than"):
                    await c.get("/")
            await idp.quiet()
    assert (idp.connections, idp.requests) == (2, 2), (idp.connections, idp.requests)


#: CI runs a few dozen streams; FUZZ_EXAMPLES=2000 runs the long profile by hand.
FUZZ_EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "25"))

_STRAYS = ["none", "idle", "idle-split", "appended", "appended-partial", "crlf"]


@st.composite
def turns(draw: st.DrawFn) -> list[tuple[bool, list[int], str, int]]:
    """For each review: chunked or not, where its answer is cut, what stray follows."""
    out = []
    for _ in USERS:
        cuts = draw(st.lists(st.integers(1, 150), max_size=4, unique=True))
        stray = draw(st.sampled_from(_STRAYS))
        out.append((draw(st.booleans()), sorted(cuts), stray, draw(st.integers(1, 60))))
    return out


def _steps(user: str, n: int, turn: tuple[bool, list[int], str, int]) -> Steps:
    chunked, cuts, stray_kind, at = turn
    answer = userinfo_answer(user, chunked)
    stray = userinfo_answer(f"stray-{n}", not chunked)
    bounds = [0, *(c for c in cuts if c < len(answer)), len(answer)]
    pieces = [answer[a:b] for a, b in itertools.pairwise(bounds)]
    tail = {
        "none": b"",
        "appended": stray,
        "appended-partial": stray[:at],
        "crlf": b"\r\n",
    }.get(stray_kind, b"")
    pieces[-1] += tail
    steps: Steps = []
    for piece in pieces:
        steps += [piece, 0.002]
    if stray_kind == "idle":
        steps += [0.005, stray]
    elif stray_kind == "idle-split":
        steps += [0.005, stray[:at], 0.005, stray[at:]]
    return steps


@settings(
    max_examples=FUZZ_EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(turns())
def test_every_review_gets_its_own_user_or_an_error_whatever_the_idp_sends(
    plan: list[tuple[bool, list[int], str, int]],
) -> None:
    async def run() -> tuple[list[str], int]:
        by_user = dict(zip(USERS, plan, strict=True))
        idp = ScriptedIdP(lambda n, user: _steps(user, n, by_user[user]))
        server = await idp.start()
        b = backend(idp)
        try:
            return await reviews(idp, b), idp.connections
        finally:
            await b.close()
            server.close()
            await server.wait_closed()

    seen, connections = asyncio.run(run())
    # A stray that arrives while no request waits, or with the answer, is never read:
    # each review gets exactly its own user.
    assert seen == USERS, (plan, seen)
    assert connections <= len(USERS), (plan, connections)


async def test_every_pooled_connection_is_guarded(serve: Serve) -> None:
    # Fails loudly if aiohttp stops building connections through the factory we set.
    idp = await serve(lambda n, user: [userinfo_answer(user)])
    timeouts = TimeoutSettings(connect_seconds=0.5, read_seconds=0.5, total_seconds=0.5)
    async with make_client(idp.url, timeouts, TLSClientSettings()) as c:
        assert (await c.get("/")).status_code == 200
        wire = c._transport
        while hasattr(wire, "_inner"):  # the wrappers of backends.http
            wire = wire._inner
        connector = wire._session.connector  # type: ignore[attr-defined]
        pooled = [proto for conns in connector._conns.values() for proto, _ in conns]
    assert len(pooled) == 1 and isinstance(pooled[0], OneAnswerHandler), pooled
    assert c_parser(), "aiohttp runs without its C parser: the guard falls back to no reuse"


@pytest.mark.parametrize("missing", ["c-parser", "protocol-factory"])
async def test_without_the_hooks_every_request_takes_a_connection_of_its_own(
    serve: Serve, monkeypatch: pytest.MonkeyPatch, missing: str
) -> None:
    # An aiohttp that ignored the pin: the guard cannot prove a connection clean, so
    # none is reused (slower, never another user's answer).
    if missing == "c-parser":
        monkeypatch.setattr(one_answer, "c_parser", lambda: False)
    else:
        monkeypatch.setattr(one_answer, "ResponseHandler", type("Other", (), {}))
    stray = userinfo_answer("stray-idle")
    idp = await serve(lambda n, user: [userinfo_answer(user), 0.02, stray])
    b = backend(idp)
    try:
        seen = await reviews(idp, b)
    finally:
        await b.close()
    assert seen == USERS
    assert (idp.connections, idp.requests) == (4, 4), (idp.connections, idp.requests)


def test_the_installed_aiohttp_is_one_the_wire_is_tested_with() -> None:
    untested = untested_aiohttp()
    assert untested is None, (
        f"aiohttp {untested} is installed; the IdP wire's guard (backends/one_answer.py) "
        f"is tested with {TESTED_AIOHTTP_MINORS} only. Run tests/unit/test_wire.py and this "
        "file on it, then add its minor version to TESTED_AIOHTTP_MINORS and widen the "
        "pin in pyproject.toml."
    )


def test_an_untested_aiohttp_minor_version_is_reported() -> None:
    assert untested_aiohttp("3.15.0") == "3.15.0"
    assert untested_aiohttp("4.0.0a1") == "4.0.0a1"
    assert untested_aiohttp(f"{TESTED_AIOHTTP_MINORS[0]}.9") is None
    assert aiohttp_minor("3.14.5.post1") == "3.14"


def test_pyproject_pins_aiohttp_to_the_tested_minor_versions() -> None:
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    pins = [Requirement(r) for r in project["dependencies"] if r.startswith("aiohttp")]
    assert len(pins) == 1, pins
    spec = pins[0].specifier
    for minor in TESTED_AIOHTTP_MINORS:
        assert spec.contains(f"{minor}.0"), (str(spec), minor)
    major, last = TESTED_AIOHTTP_MINORS[-1].split(".")
    first_major, first = TESTED_AIOHTTP_MINORS[0].split(".")
    assert not spec.contains(f"{major}.{int(last) + 1}.0"), str(spec)
    assert not spec.contains(f"{first_major}.{int(first) - 1}.0"), str(spec)
