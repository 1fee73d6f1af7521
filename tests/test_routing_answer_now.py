"""Cache hits answered at once through a chain of backends and the audience check
(``Chain.review_now``, ``Audiences.review_now``): the verdict ``review`` would give, or
None when ``review`` would still ask a backend. Gateways built from config in process
over real fake IdPs (loopback sockets), and one ``authn-gateway serve`` over a socket."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
import yaml
from prometheus_client import generate_latest

from authn_gateway.config import parse_config
from authn_gateway.serve.gateway import Gateway
from backends.base import Authenticated, Rejected, Verdict
from tests.conftest import userinfo_backend
from tests.support.fakes.idp import FakeIdP
from tests.support.procs import metric_value, start_gateway
from tests.test_edge import request
from tests.test_edge_answer_at_once import body, connect


@pytest.fixture
def second_idp() -> Iterator[FakeIdP]:
    idp = FakeIdP(control_port=0).start_in_thread()
    try:
        yield idp
    finally:
        idp.stop()


def chain_config(first: FakeIdP, second: FakeIdP, **extra: Any) -> dict[str, Any]:
    return {
        "backends": [
            userinfo_backend(first, name="first"),
            userinfo_backend(second, name="second"),
        ],
        **extra,
    }


@pytest_asyncio.fixture
async def build() -> AsyncIterator[Any]:
    started: list[Gateway] = []

    async def make(config: dict[str, Any]) -> Gateway:
        gateway = Gateway(parse_config(yaml.safe_dump(config), "test"))
        await gateway.start()
        started.append(gateway)
        return gateway

    yield make
    for gateway in started:
        await gateway.close()


def lookups(gateway: Gateway, backend: str, result: str) -> float:
    text = generate_latest(gateway.metrics.registry).decode()
    return metric_value(text, "authn_gateway_cache_lookups_total", backend=backend, result=result)


def same(a: Verdict | None, b: Verdict) -> bool:
    return a is not None and (a.outcome, a.backend, a.audiences) == (
        b.outcome,
        b.backend,
        b.audiences,
    )


async def test_chain_answers_the_first_members_cached_identity_at_once(
    build: Any, fake_idp: FakeIdP, second_idp: FakeIdP
) -> None:
    gateway = await build(chain_config(fake_idp, second_idp))
    first = await gateway.pipeline.review("good-alice", (), "c")
    assert isinstance(first.outcome, Authenticated) and first.backend == "first"
    now = gateway.pipeline.review_now("good-alice", ())
    assert same(now, first) and now is not None and now.cached
    assert (fake_idp.calls, second_idp.calls) == (1, 0)


async def test_chain_answers_a_rejection_at_once_only_when_every_member_rejected_it(
    build: Any, fake_idp: FakeIdP, second_idp: FakeIdP
) -> None:
    gateway = await build(chain_config(fake_idp, second_idp))
    assert gateway.pipeline.review_now("bad-token", ()) is None
    slow = await gateway.pipeline.review("bad-token", (), "c")
    assert isinstance(slow.outcome, Rejected) and slow.backend == "second"
    assert same(gateway.pipeline.review_now("bad-token", ()), slow)
    assert (fake_idp.calls, second_idp.calls) == (1, 1)


async def test_a_cached_rejection_is_not_answered_while_the_next_member_has_no_answer(
    build: Any, fake_idp: FakeIdP, second_idp: FakeIdP
) -> None:
    # The first IdP rejects every token (cached); the second is down, so nothing of
    # its is cached and the chain says unavailable.
    fake_idp.configure(status=401)
    second_idp.configure(status=503)
    gateway = await build(chain_config(fake_idp, second_idp))
    down = await gateway.pipeline.review("good-bob", (), "c")
    assert not isinstance(down.outcome, Authenticated | Rejected)
    second_idp.configure(status=None)
    # review would ask the second backend now: no answer at once...
    assert gateway.pipeline.review_now("good-bob", ()) is None
    # ...and it authenticates; the rejection cached by the first stays cached, and is
    # counted once: by review, not also by the look that gave up.
    up = await gateway.pipeline.review("good-bob", (), "c")
    assert isinstance(up.outcome, Authenticated) and up.backend == "second"
    assert fake_idp.calls == 1
    assert lookups(gateway, "first", "negative_hit") == 1
    # Now both answers are fresh: the chain's answer is given at once.
    assert same(gateway.pipeline.review_now("good-bob", ()), up)
    assert fake_idp.calls == 1


async def test_the_audience_check_narrows_an_answer_given_at_once(
    build: Any, fake_idp: FakeIdP, second_idp: FakeIdP
) -> None:
    gateway = await build(chain_config(fake_idp, second_idp, audiences=["api", "other"]))
    for audiences in (("api", "vault"), ("vault",)):
        slow = await gateway.pipeline.review("good-carol", audiences, "c")
        now = gateway.pipeline.review_now("good-carol", audiences)
        assert same(now, slow)
    assert now is not None and isinstance(now.outcome, Rejected)
    narrowed = gateway.pipeline.review_now("good-carol", ("api", "vault"))
    assert narrowed is not None and narrowed.audiences == ("api",)
    assert fake_idp.calls == 2  # one per audience set (each is its own cache key)


def test_chain_hits_are_answered_at_once_and_counted_once_per_member(
    fake_idp: FakeIdP, second_idp: FakeIdP, tmp_path: Path
) -> None:
    # The first rejects (cached), the second authenticates (cached): every hit asks
    # both, as the chain's review does, and counts each once.
    fake_idp.configure(status=401)
    gw = start_gateway(chain_config(fake_idp, second_idp), tmp_path)
    try:
        sock, reader = connect(gw)
        with sock:
            answers = []
            for _ in range(4):
                sock.sendall(request(body("good-dave")))
                answers.append(reader.response())
        for answer in answers:
            assert answer is not None and answer[0] == 200
            assert json.loads(answer[2])["status"]["user"]["username"] == "dave"
        metrics = httpx.get(f"{gw.url}/metrics", timeout=5).text
        count = "authn_gateway_cache_lookups_total"
        assert metric_value(metrics, count, backend="first", result="negative_hit") == 3
        assert metric_value(metrics, count, backend="second", result="hit") == 3
        assert (fake_idp.calls, second_idp.calls) == (1, 1)
    finally:
        gw.stop()
