"""The review pipeline in process, with scripted backends: routing, chain rules,
pre-rejection, stale serving, deadlines and audiences."""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import pytest
import yaml

from authn_gateway.config import parse_config
from authn_gateway.layers.concurrency.slots import ConcurrencyLimiter, Priority, Slot
from authn_gateway.review.prerejection import is_service_account_jwt, prerejection_reason
from authn_gateway.review.tokenreview import render_verdict
from authn_gateway.serve.gateway import Gateway
from backends.base import (
    Authenticated,
    Backend,
    HeldBack,
    Outcome,
    Rejected,
    Unavailable,
    UserInfo,
)
from backends.context import DEFAULT_CLUSTER, WireTime
from tests.support.scripted import Scripted


def gateway(backends: list[dict[str, Any]], scripted: dict[str, Scripted], **top: Any) -> Gateway:
    """A gateway whose backends are replaced by scripted ones (same names)."""
    cfg = {
        "backends": [
            {"type": "static", "tokens": [{"token": "x", "username": "x"}], **b} for b in backends
        ],
        **top,
    }
    config = parse_config(yaml.safe_dump(cfg), "test.yaml")
    return Gateway(config, backends=[scripted[b.name] for b in config.backends])


OK = Authenticated(UserInfo("alice"))

NO = Rejected("no")

DOWN = Unavailable("down")


async def test_prefix_routes_to_one_backend_and_strips_it() -> None:
    gl, chain = Scripted("gitlab", OK), Scripted("ldap", NO)
    gw = gateway(
        [{"name": "gitlab", "prefix": "glpat-", "strip_prefix": True}, {"name": "ldap"}],
        {"gitlab": gl, "ldap": chain},
    )
    verdict = await gw.pipeline.review("glpat-abc", (), "c")
    assert verdict.backend == "gitlab"
    assert gl.seen == ["abc"]
    assert chain.seen == []


async def test_chain_first_authenticated_wins() -> None:
    a, b = Scripted("a", NO), Scripted("b", OK)
    gw = gateway([{"name": "a"}, {"name": "b"}], {"a": a, "b": b})
    verdict = await gw.pipeline.review("t", (), "c")
    assert isinstance(verdict.outcome, Authenticated)
    assert verdict.backend == "b"


async def test_chain_all_rejected_is_rejected() -> None:
    gw = gateway([{"name": "a"}, {"name": "b"}], {"a": Scripted("a", NO), "b": Scripted("b", NO)})
    assert isinstance((await gw.pipeline.review("t", (), "c")).outcome, Rejected)


async def test_chain_rejected_plus_unavailable_is_never_invalid() -> None:
    gw = gateway([{"name": "a"}, {"name": "b"}], {"a": Scripted("a", NO), "b": Scripted("b", DOWN)})
    verdict = await gw.pipeline.review("t", (), "c")
    assert isinstance(verdict.outcome, Unavailable)
    assert verdict.backend == "b"
    # The verdict names the backend; the answer renders "<backend>: <reason>" once.
    assert verdict.outcome.reason == "down"
    assert "b: b:" not in render_verdict("authentication.k8s.io/v1", verdict).body.decode()


async def test_service_account_jwt_is_rejected_without_a_call() -> None:
    backend = Scripted("a", OK)
    gw = gateway([{"name": "a"}], {"a": backend})
    verdict = await gw.pipeline.review(sa_jwt(), (), "c")
    assert isinstance(verdict.outcome, Rejected)
    assert verdict.backend == "gateway"
    assert backend.seen == []


@pytest.mark.parametrize("token", ["tab\there", "nul\x00x", "new\nline", "sp ace", "\x7f"])
async def test_control_characters_are_rejected_without_a_call(token: str) -> None:
    backend = Scripted("a", OK)
    gw = gateway([{"name": "a"}], {"a": backend})
    assert isinstance((await gw.pipeline.review(token, (), "c")).outcome, Rejected)
    assert backend.seen == []


async def test_token_length_rules_prereject() -> None:
    backend = Scripted("a", OK)
    gw = gateway(
        [{"name": "a", "token_rules": {"min_length": 10, "max_length": 20}}], {"a": backend}
    )
    for token in ("short", "x" * 21):
        assert isinstance((await gw.pipeline.review(token, (), "c")).outcome, Rejected)
    assert backend.seen == []
    assert isinstance((await gw.pipeline.review("x" * 15, (), "c")).outcome, Authenticated)


async def test_second_review_is_a_cache_hit() -> None:
    backend = Scripted("a", OK)
    gw = gateway([{"name": "a"}], {"a": backend})
    first = await gw.pipeline.review("t", (), "c")
    second = await gw.pipeline.review("t", (), "c")
    assert not first.cached
    assert second.cached
    assert len(backend.seen) == 1


async def test_unavailable_is_not_cached() -> None:
    backend = Scripted("a", DOWN)
    gw = gateway([{"name": "a"}], {"a": backend})
    await gw.pipeline.review("t", (), "c")
    await gw.pipeline.review("t", (), "c")
    assert len(backend.seen) == 2


async def test_stale_identity_is_served_only_when_backend_cannot_answer() -> None:
    backend = Scripted("a", OK)
    gw = gateway(
        [{"name": "a", "cache": {"positive_ttl_seconds": 0.05, "max_stale_seconds": 60}}],
        {"a": backend},
    )
    await gw.pipeline.review("t", (), "c")
    await asyncio.sleep(0.06)
    backend.answer = NO  # the IdP answers: its "invalid" wins over the stale entry
    assert isinstance((await gw.pipeline.review("t", (), "c")).outcome, Rejected)
    backend.answer = OK
    await gw.pipeline.review("t2", (), "c")
    await asyncio.sleep(0.06)
    backend.answer = DOWN
    verdict = await gw.pipeline.review("t2", (), "c")
    assert isinstance(verdict.outcome, Authenticated)
    assert verdict.stale


async def test_a_known_user_never_waits_for_a_slot_another_call_took_first() -> None:
    # Issue 15: a review with a stale entry is answered stale while its refresh waits its
    # turn. It checks for a free slot, but its call runs in a task of its own: another
    # review's call can take that slot first. Before, the known user's call then queued
    # behind never-seen tokens and held its review for seconds (4.9 s in the brownout).
    backend = Scripted("a", OK)
    gw = gateway(
        [
            {
                "name": "a",
                "cache": {"positive_ttl_seconds": 0.05, "max_stale_seconds": 60},
                "concurrency": {"initial_limit": 1, "min_limit": 1, "max_limit": 1},
            }
        ],
        {"a": backend},
    )
    assert isinstance((await gw.pipeline.review("known", (), "c")).outcome, Authenticated)
    await asyncio.sleep(0.06)  # past its TTL: a stale entry remains
    limiter = gw.pipeline.backends["a"].parts.limiter
    assert limiter is not None
    assert isinstance(limiter, ConcurrencyLimiter)
    limiter.algorithm._recent_rtt = 0.05  # measured and healthy: waiting is allowed
    taken: list[Slot] = []
    free_at_check = limiter.would_wait

    def taken_right_after(priority: Priority, cluster: str = DEFAULT_CLUSTER) -> bool:
        answer = free_at_check(priority, cluster)
        slot = limiter.try_acquire(Priority.NO_FALLBACK)  # a cold token's call, first
        if slot is not None:
            taken.append(slot)
        return answer

    limiter.would_wait = taken_right_after  # type: ignore[method-assign]
    loop = asyncio.get_running_loop()
    started = loop.time()
    verdict = await gw.pipeline.review("known", (), "c")
    assert loop.time() - started < 1.0  # before: until the slot came, ~5 s here
    assert isinstance(verdict.outcome, Authenticated) and verdict.stale
    assert taken and backend.seen == ["known"]  # not asked again yet
    # Its refresh waits its turn meanwhile, and goes out once the slot is given back.
    for _ in range(5):
        await asyncio.sleep(0)
    assert limiter.waiting(Priority.HAS_FALLBACK) == 1
    limiter.would_wait = free_at_check  # type: ignore[method-assign]
    limiter.release(taken.pop(), rtt=0.05)
    for _ in range(20):
        await asyncio.sleep(0.01)
        if len(backend.seen) == 2:
            break
    assert backend.seen == ["known", "known"]
    fresh = await gw.pipeline.review("known", (), "c")
    assert fresh.cached and not fresh.stale


async def test_slow_backend_costs_at_most_its_deadline() -> None:
    backend = Scripted("a", OK, delay=5)
    gw = gateway([{"name": "a", "timeouts": {"total_seconds": 0.2}}], {"a": backend})
    loop = asyncio.get_running_loop()
    started = loop.time()
    verdict = await gw.pipeline.review("t", (), "c")
    assert loop.time() - started < 1.0
    assert isinstance(verdict.outcome, Unavailable)
    assert "no answer within 0.2s" in verdict.outcome.reason


async def test_backend_exception_is_unavailable_not_a_crash() -> None:
    class Broken(Backend):
        async def authenticate(self, token: str, wire: WireTime | None = None) -> Outcome:
            raise KeyError("bug")

    gw = gateway([{"name": "a"}], {"a": Broken("a")})  # type: ignore[dict-item]
    verdict = await gw.pipeline.review("t", (), "c")
    assert isinstance(verdict.outcome, Unavailable)
    assert verdict.outcome.reason == "internal error"


async def test_inbound_limit_answers_unavailable_per_caller() -> None:
    gw = gateway([{"name": "a"}], {"a": Scripted("a", OK)}, inbound_limit={"rate": 1, "burst": 2})
    answers = [await gw.pipeline.review(f"t{i}", (), "noisy") for i in range(3)]
    assert isinstance(answers[2].outcome, Unavailable)
    assert "review rate" in answers[2].outcome.reason
    assert isinstance((await gw.pipeline.review("t2", (), "quiet")).outcome, Authenticated)


async def test_inbound_limit_never_refuses_a_cache_hit() -> None:
    backend = Scripted("a", OK)
    gw = gateway([{"name": "a"}], {"a": backend}, inbound_limit={"rate": 1, "burst": 1})
    assert isinstance((await gw.pipeline.review("known", (), "apiserver")).outcome, Authenticated)
    assert isinstance((await gw.pipeline.review("new", (), "apiserver")).outcome, Unavailable)
    for _ in range(50):
        verdict = await gw.pipeline.review("known", (), "apiserver")
        assert isinstance(verdict.outcome, Authenticated) and verdict.cached
    assert backend.seen == ["known"]


async def test_retry_after_keeps_the_breaker_open_for_that_long() -> None:
    backend = Scripted("a", Unavailable("429", retry_after=30))
    gw = gateway([{"name": "a"}], {"a": backend})
    await gw.pipeline.review("t1", (), "c")
    for i in range(5):
        verdict = await gw.pipeline.review(f"t{i + 2}", (), "c")
        assert isinstance(verdict.outcome, Unavailable)
    assert len(backend.seen) == 1
    assert gw.pipeline.backends["a"].breaker.state == "open"


async def test_backend_audiences_override_gateway_audiences() -> None:
    gw = gateway(
        [{"name": "a", "audiences": ["k8s"]}], {"a": Scripted("a", OK)}, audiences=["other"]
    )
    verdict = await gw.pipeline.review("t", ("k8s", "x"), "c")
    assert verdict.audiences == ("k8s",)
    refused = await gw.pipeline.review("t", ("other",), "c")
    assert isinstance(refused.outcome, Rejected)


def sa_jwt(claims: dict[str, Any] | None = None) -> str:
    def enc(doc: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(doc).encode()).decode().rstrip("=")

    claims = claims or {"iss": "https://kubernetes.default.svc", "kubernetes.io": {"ns": "x"}}
    return f"{enc({'alg': 'RS256', 'kid': 'k'})}.{enc(claims)}.c2lnbmF0dXJl"


def test_service_account_detection() -> None:
    assert is_service_account_jwt(sa_jwt())
    assert is_service_account_jwt(sa_jwt({"iss": "kubernetes/serviceaccount", "sub": "x"}))
    # An OIDC token from another issuer may be valid for some backend: keep it.
    assert not is_service_account_jwt(sa_jwt({"iss": "https://sso.example.com", "sub": "u"}))
    assert not is_service_account_jwt("eyJnot.a.jwt")
    assert prerejection_reason(sa_jwt(), reject_service_accounts=False) is None


async def test_review_deadline_bounds_a_chain_of_slow_backends() -> None:
    a, b = Scripted("a", OK, delay=5), Scripted("b", OK, delay=5)
    gw = gateway(
        [
            {"name": "a", "timeouts": {"total_seconds": 0.3}},
            {"name": "b", "timeouts": {"total_seconds": 0.3}},
        ],
        {"a": a, "b": b},
        review_deadline_seconds=0.5,
    )
    loop = asyncio.get_running_loop()
    started = loop.time()
    verdict = await gw.pipeline.review("t", (), "c")
    assert loop.time() - started < 0.8
    assert isinstance(verdict.outcome, Unavailable)
    assert verdict.backend == "a"
    assert verdict.outcome.reason.startswith("no answer within 0.3s; b: ")
    assert "b: no answer within the review deadline" in verdict.outcome.reason


async def test_a_call_held_back_by_our_own_budget_does_not_open_the_breaker() -> None:
    backend = Scripted("a", HeldBack("budget"))
    gw = gateway([{"name": "a", "breaker": {"fail_max": 2}}], {"a": backend})
    for i in range(5):
        verdict = await gw.pipeline.review(f"t{i}", (), "c")
        assert isinstance(verdict.outcome, Unavailable)
    assert gw.pipeline.backends["a"].breaker.state == "closed"
    assert len(backend.seen) == 5
