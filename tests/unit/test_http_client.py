"""The backends' HTTP client carries nothing from one call to the next, and does no
avoidable work per IdP call.

One client validates every user's token, so nothing an answer leaves behind (a cookie)
may travel with the next user's call.

httpcore (1.0) runs ``import sniffio`` inside every lock's setup, four times a request.
Without sniffio installed each of those imports fails only after a search of sys.path
(a fifth of an httpx call's CPU, docs/decisions.md): a call must import nothing.
"""

from __future__ import annotations

import asyncio
import gzip
import importlib.abc
import importlib.machinery
import re
import sys
from collections.abc import AsyncIterator, Sequence
from types import ModuleType

import httpx
import pytest

from backends.base import Authenticated, Outcome, Unavailable
from backends.http import TLSClientSettings, make_client, transport_failure
from backends.jwt.backend import JWTSettings, issuer_client
from backends.settings import TimeoutSettings
from backends.transports import MAX_ANSWER_BYTES, AnswerRefused
from backends.userinfo import UserinfoBackend, UserinfoSettings
from tests.support.fakes.idp import FakeIdP, serve_h11
from tests.support.fakes.raw import RawIdP


class CookieSettingIdP:
    """An HTTP server whose every answer sets session cookies (as GitLab's web login
    does, and load balancers' stickiness), and which records each request's Cookie."""

    def __init__(self) -> None:
        self.cookies_sent: list[str | None] = []
        self.port = 0

    async def answer(
        self, method: str, target: str, headers: dict[str, str], body: bytes
    ) -> tuple[int, dict[str, str], bytes]:
        self.cookies_sent.append(headers.get("cookie"))
        # One header per cookie would need a list; two cookies in one answer is enough.
        cookie = f"_gitlab_session=for-call-{len(self.cookies_sent)}; path=/; HttpOnly"
        return 200, {"content-type": "application/json", "set-cookie": cookie}, b"{}"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@pytest.fixture
async def cookie_idp() -> AsyncIterator[CookieSettingIdP]:
    idp = CookieSettingIdP()
    server = await asyncio.start_server(lambda r, w: serve_h11(r, w, idp.answer), "127.0.0.1", 0)
    idp.port = server.sockets[0].getsockname()[1]
    try:
        yield idp
    finally:
        server.close()
        await server.wait_closed()


async def calls_with_three_tokens(client: httpx.AsyncClient, url: str) -> None:
    try:
        for user in ("alice", "bob", "mallory"):
            answer = await client.get(url, headers={"Authorization": f"Bearer {user}"})
            assert answer.status_code == 200
            assert "set-cookie" in answer.headers  # the IdP did set one
    finally:
        await client.aclose()


async def test_a_cookie_an_idp_answer_sets_never_goes_with_a_later_call(
    cookie_idp: CookieSettingIdP,
) -> None:
    client = make_client(cookie_idp.url, TimeoutSettings(), TLSClientSettings())
    await calls_with_three_tokens(client, "/api/v4/user")
    assert cookie_idp.cookies_sent == [None, None, None]
    assert list(client.cookies.jar) == []


async def test_the_jwt_issuer_client_keeps_no_cookies_either(
    cookie_idp: CookieSettingIdP,
) -> None:
    issuer = {"url": "https://issuer.example", "audiences": ["a"]}
    mappings = {"username": {"claim": "sub", "prefix": ""}}
    settings = JWTSettings.model_validate(
        {"name": "oidc", "type": "jwt", "issuer": issuer, "claimMappings": mappings}
    )
    client = issuer_client(settings)  # its settings only shape TLS; the URL is ours
    await calls_with_three_tokens(client, f"{cookie_idp.url}/.well-known/jwks.json")
    assert cookie_idp.cookies_sent == [None, None, None]


async def test_a_plain_httpx_client_would_send_them(cookie_idp: CookieSettingIdP) -> None:
    # The premise of the two tests above: without the refusing jar, httpx sends
    # the session cookie of one user's answer with the next user's token.
    await calls_with_three_tokens(httpx.AsyncClient(base_url=cookie_idp.url), "/api/v4/user")
    assert cookie_idp.cookies_sent == [
        None,
        "_gitlab_session=for-call-1",
        "_gitlab_session=for-call-2",
    ]


class CountingFinder(importlib.abc.MetaPathFinder):
    """First on sys.meta_path: sees every import of a module not yet in sys.modules."""

    def __init__(self) -> None:
        self.searched: list[str] = []

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        self.searched.append(fullname)
        return None  # let the real finders do it


async def test_an_idp_call_searches_for_no_module(fake_idp: FakeIdP) -> None:
    client = make_client(fake_idp.url, TimeoutSettings(), TLSClientSettings())
    try:
        first = await client.get("", headers={"Authorization": "Bearer good-warm"})
        assert first.status_code == 200  # whatever a first call imports, it has now
        finder = CountingFinder()
        sys.meta_path.insert(0, finder)
        try:
            for i in range(5):
                answer = await client.get("", headers={"Authorization": f"Bearer good-user{i}"})
                assert answer.status_code == 200
        finally:
            sys.meta_path.remove(finder)
    finally:
        await client.aclose()
    assert finder.searched == []
    assert fake_idp.stats().calls == 6


class CannedIdP(RawIdP):
    """Answers every request with ``answer`` bytes as they are (so chunked, gzip or
    lying framing can be sent), then closes; records how many bytes of the answer it
    wrote before the client went away."""

    def __init__(self, answer: bytes) -> None:
        super().__init__(self._answer)
        self.answer = answer
        self.written = 0

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for start in range(0, len(self.answer), 65536):
            writer.write(self.answer[start : start + 65536])
            await writer.drain()
            self.written = start + 65536
        raise ConnectionError  # one answer a connection: unframed ones end at the close


async def canned(answer: bytes) -> tuple[CannedIdP, asyncio.Server]:
    idp = CannedIdP(answer)
    return idp, await idp.start()


def http_answer(body: bytes, *headers: str) -> bytes:
    head = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n" + "".join(
        f"{h}\r\n" for h in headers
    )
    return head.encode() + b"\r\n" + body


TOO_LARGE = f"answer larger than {MAX_ANSWER_BYTES} bytes"

BIG = b'{"preferred_username": "alice", "pad": "' + b"x" * (MAX_ANSWER_BYTES + 10) + b'"}'

# Ten times the bound: whoever reads it all has not stopped at the bound.
HUGE = b'{"preferred_username": "alice", "pad": "' + b"x" * (10 * MAX_ANSWER_BYTES) + b'"}'


def chunked(body: bytes) -> bytes:
    out = b"".join(
        b"%x\r\n%s\r\n" % (len(body[i : i + 60000]), body[i : i + 60000])
        for i in range(0, len(body), 60000)
    )
    return out + b"0\r\n\r\n"


@pytest.mark.parametrize(
    ("answer", "why"),
    [
        (http_answer(HUGE, f"Content-Length: {len(HUGE)}"), f"{TOO_LARGE} (Content-Length)"),
        (http_answer(chunked(HUGE), "Transfer-Encoding: chunked"), TOO_LARGE),
        # Until the connection closes: no framing at all.
        (http_answer(HUGE), TOO_LARGE),
        (
            http_answer(gzip.compress(b'{"a": 1}'), "Content-Encoding: gzip"),
            "compressed answer (Content-Encoding 'gzip') to a request for none",
        ),
    ],
    ids=["declared", "chunked", "read-to-close", "gzip"],
)
async def test_an_idp_answer_too_large_or_compressed_is_refused_unread(
    answer: bytes, why: str
) -> None:
    idp, server = await canned(answer)
    client = make_client(idp.url, TimeoutSettings(), TLSClientSettings())
    try:
        with pytest.raises(AnswerRefused, match=f"^{re.escape(why)}$") as refused:
            await client.get("/userinfo", headers={"Authorization": "Bearer good-alice"})
    finally:
        await client.aclose()
        server.close()
        await server.wait_closed()
    assert b"\r\naccept-encoding: identity\r\n" in idp.heads[0].lower()
    assert transport_failure(refused.value) == Unavailable(f"IdP sent an unreadable answer: {why}")
    if len(answer) > MAX_ANSWER_BYTES:
        # Read no further than the bound (and what the sockets buffered), not to the end.
        assert idp.written < len(answer) / 2


async def userinfo_outcome(answer: bytes) -> Outcome:
    """What the userinfo backend makes of ``answer`` to a review of good-alice."""
    idp, server = await canned(answer)
    backend = UserinfoBackend(
        UserinfoSettings(name="idp", type="userinfo", url=f"{idp.url}/userinfo")
    )
    try:
        return await backend.authenticate("good-alice")
    finally:
        await backend.close()
        server.close()
        await server.wait_closed()


async def test_an_oversized_userinfo_answer_is_the_idp_unavailable_not_a_refusal() -> None:
    outcome = await userinfo_outcome(http_answer(BIG, f"Content-Length: {len(BIG)}"))
    assert isinstance(outcome, Unavailable) and outcome.blames_idp
    assert "larger than" in outcome.reason


async def test_an_answer_within_the_bound_is_read_whole() -> None:
    body = b'{"preferred_username": "alice", "pad": "' + b"x" * 1_000_000 + b'"}'
    outcome = await userinfo_outcome(http_answer(chunked(body), "Transfer-Encoding: chunked"))
    assert isinstance(outcome, Authenticated) and outcome.user.username == "alice"


@pytest.mark.parametrize("coding", ["identity", "", " Identity "])
async def test_an_answer_declared_uncompressed_is_read(coding: str) -> None:
    body = b'{"preferred_username": "alice"}'
    answer = http_answer(body, f"Content-Length: {len(body)}", f"Content-Encoding: {coding}")
    outcome = await userinfo_outcome(answer)
    assert isinstance(outcome, Authenticated) and outcome.user.username == "alice"
