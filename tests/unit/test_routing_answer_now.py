"""Cache hits answered at once through a chain of backends and the audience check: the
review, run eagerly as the edge runs it, finishes without waiting exactly when every
backend it asks has a fresh local entry, and is counted once either way. Gateways built
from config in process over real fake IdPs (loopback sockets), and one ``authn-gateway
serve`` over a socket."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest_asyncio
import yaml
from prometheus_client import generate_latest

from authn_gateway.config import parse_config
from authn_gateway.serve.gateway import Gateway
from backends.base import Authenticated, Rejected, Verdict
from tests.support.fakes.idp import FakeIdP
from tests.support.procs import metric_value
from tests.support.routing_answer_now_helpers import answer, chain_config


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
    first, at_once = await answer(gateway, "good-alice")
    assert not at_once
    assert isinstance(first.outcome, Authenticated) and first.backend == "first"
    now, at_once = await answer(gateway, "good-alice")
    assert at_once and same(now, first) and now.cached
    assert (fake_idp.calls, second_idp.calls) == (1, 0)


async def test_chain_answers_a_rejection_at_once_only_when_every_member_rejected_it(
    build: Any, fake_idp: FakeIdP, second_idp: FakeIdP
) -> None:
    gateway = await build(chain_config(fake_idp, second_idp))
    slow, at_once = await answer(gateway, "bad-token")
    assert not at_once
    assert isinstance(slow.outcome, Rejected) and slow.backend == "second"
    now, at_once = await answer(gateway, "bad-token")
    assert at_once and same(now, slow)
    assert (fake_idp.calls, second_idp.calls) == (1, 1)


async def test_a_cached_rejection_is_not_answered_while_the_next_member_has_no_answer(
    build: Any, fake_idp: FakeIdP, second_idp: FakeIdP
) -> None:
    # The first IdP rejects every token (cached); the second is down, so nothing of
    # its is cached and the chain says unavailable.
    fake_idp.configure(status=401)
    second_idp.configure(status=503)
    gateway = await build(chain_config(fake_idp, second_idp))
    down, _ = await answer(gateway, "good-bob")
    assert not isinstance(down.outcome, Authenticated | Rejected)
    second_idp.configure(status=None)
    # The review asks the second backend now: not answered at once; it authenticates,
    # the rejection cached by the first stays cached and is counted once per review
    # (the part run at once and the part carried on are one review).
    up, at_once = await answer(gateway, "good-bob")
    assert not at_once
    assert isinstance(up.outcome, Authenticated) and up.backend == "second"
    assert fake_idp.calls == 1
    assert lookups(gateway, "first", "negative_hit") == 1
    # Now both answers are fresh: the chain's answer is given at once.
    now, at_once = await answer(gateway, "good-bob")
    assert at_once and same(now, up)
    assert fake_idp.calls == 1
    assert lookups(gateway, "first", "negative_hit") == 2


async def test_the_audience_check_narrows_an_answer_given_at_once(
    build: Any, fake_idp: FakeIdP, second_idp: FakeIdP
) -> None:
    gateway = await build(chain_config(fake_idp, second_idp, audiences=["api", "other"]))
    for audiences in (("api", "vault"), ("vault",)):
        slow, _ = await answer(gateway, "good-carol", audiences)
        now, at_once = await answer(gateway, "good-carol", audiences)
        assert at_once and same(now, slow)
    assert isinstance(now.outcome, Rejected)
    narrowed, at_once = await answer(gateway, "good-carol", ("api", "vault"))
    assert at_once and narrowed.audiences == ("api",)
    assert fake_idp.calls == 2  # one per audience set (each is its own cache key)
