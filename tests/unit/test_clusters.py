"""Many clusters, one gateway (issue 37): ``clusters:`` as check-config reads it, which
cluster a caller is, what a cluster may reach, and the fair share of an IdP through the
pipeline."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
import yaml

from authn_gateway.config import ConfigError, TLSSettings, parse_config
from authn_gateway.edge.callerauth import CallerAuth
from authn_gateway.layers.concurrency.vegas import VegasLimit
from authn_gateway.review.clusters import ClusterMap
from authn_gateway.serve.gateway import Gateway
from backends.base import Authenticated, HeldBack, Outcome, Rejected, Unavailable, UserInfo
from backends.context import DEFAULT_CLUSTER, WireTime
from tests.support.config_helpers import STRONG
from tests.support.scripted import Scripted

TOKENS = [{"name": n, "token": f"{STRONG}-{n}"} for n in ("prod", "ci", "spare")]


def document(
    clusters: list[dict[str, Any]], idp: dict[str, Any] | None = None, **top: Any
) -> dict[str, Any]:
    server = {"caller_tokens": TOKENS, **top.pop("server", {})}
    return {
        "server": server,
        "backends": [
            {"name": "idp", "type": "userinfo", "url": "http://127.0.0.1:9/u", **(idp or {})},
            {"name": "gl", "type": "gitlab", "prefix": "glpat-"},
        ],
        "clusters": clusters,
        **top,
    }


def problems(clusters: list[dict[str, Any]], **top: Any) -> list[str]:
    with pytest.raises(ConfigError) as refused:
        parse_config(yaml.safe_dump(document(clusters, **top)), "gw.yaml")
    return refused.value.problems


@pytest.mark.parametrize(
    ("clusters", "field", "why"),
    [
        ([{"name": "Prod_EU", "caller_tokens": ["prod"]}], "clusters[0].name", "pattern"),
        ([{"name": "p" * 64, "caller_tokens": ["prod"]}], "clusters[0].name", "pattern"),
        (
            [{"name": "prod", "caller_tokens": ["prod"], "weight": 0}],
            "clusters[0].weight",
            "greater than 0",
        ),
        (
            [{"name": "prod", "caller_tokens": ["prod"], "weight": -2}],
            "clusters[0].weight",
            "greater than 0",
        ),
        ([{"name": "prod", "caller_tokens": ["prod"], "weight": ".inf"}], "clusters[0].weight", ""),
        ([{"name": "prod"}], "clusters[0]", "needs subjects or caller_tokens"),
        ([{"name": "default", "caller_tokens": ["prod"]}], "clusters[0]", "takes no"),
        ([{"name": "prod", "caller_tokens": ["nope"]}], "clusters[0].caller_tokens[0]", "nope"),
        (
            [
                {"name": "prod", "caller_tokens": ["prod"]},
                {"name": "ci", "caller_tokens": ["prod"]},
            ],
            "clusters[1].caller_tokens[0]",
            "also clusters[0]'s",
        ),
        (
            [
                {"name": "prod", "caller_tokens": ["prod"]},
                {"name": "prod", "caller_tokens": ["ci"]},
            ],
            "clusters[1].name",
            "used twice",
        ),
        (
            [{"name": "prod", "caller_tokens": ["prod"], "backends": ["keystone"]}],
            "clusters[0].backends[0]",
            "no backend is named 'keystone'",
        ),
        (
            [{"name": "prod", "caller_tokens": ["prod"], "prefixes": ["ks-"]}],
            "clusters[0].prefixes[0]",
            "no backend has the prefix",
        ),
        (
            [
                {
                    "name": "prod",
                    "caller_tokens": ["prod"],
                    "backends": ["idp"],
                    "prefixes": ["glpat-"],
                }
            ],
            "clusters[0].prefixes[0]",
            "not in its backends",
        ),
        (
            [{"name": "prod", "subjects": ["apiserver.prod"]}],
            "clusters[0].subjects[0]",
            "needs server.tls.client_ca_file",
        ),
        (
            [{"name": "prod", "caller_tokens": ["prod", "prod"]}],
            "clusters[0]",
            "listed twice",
        ),
    ],
)
def test_check_config_refuses_each_bad_cluster_with_one_line_naming_the_field(
    clusters: list[dict[str, Any]], field: str, why: str
) -> None:
    found = problems(clusters)
    assert len(found) == 1, found
    assert found[0].startswith(field), found
    assert why in found[0], found
    assert STRONG not in found[0]  # a caller token's value is never echoed


def test_a_share_of_a_fraction_of_a_call_is_accepted() -> None:
    """The bucket's shares lend in fractions of a call (layers/bucket/fair.py): ci's
    share of the default burst (100) is a tenth of a call, and it is a share all the
    same."""
    clusters = [
        {"name": "prod", "caller_tokens": ["prod"], "weight": 1000},
        {"name": "ci", "caller_tokens": ["ci"], "weight": 1},
    ]
    parse_config(yaml.safe_dump(document(clusters)), "gw.yaml")


def test_a_bucket_of_one_call_shared_between_clusters_is_refused() -> None:
    clusters = [
        {"name": "prod", "caller_tokens": ["prod"]},
        {"name": "ci", "caller_tokens": ["ci"]},
    ]
    (line,) = problems(clusters, idp={"bucket": {"rate": 10, "burst": 1}})
    assert line.startswith("backends[0].bucket.burst: 1 call cannot be shared"), line
    assert "at least 2" in line


@pytest.mark.parametrize("field", ["backends", "prefixes"])
def test_a_cluster_limited_to_an_empty_list_is_refused(field: str) -> None:
    """``backends: []`` or ``prefixes: []`` would leave a cluster that reaches nothing
    (or nothing by prefix): a slip, refused with the field."""
    (line,) = problems([{"name": "ci", "caller_tokens": ["ci"], field: []}])
    assert line.startswith(f"clusters[0].{field}: is empty"), line


def test_a_subject_must_be_one_the_gateway_allows() -> None:
    tls = {
        "cert_file": "/nonexistent/c.pem",
        "key_file": "/nonexistent/k.pem",
        "client_ca_file": "/nonexistent/ca.pem",
    }
    server = {"tls": tls, "allowed_subjects": ["apiserver.ci"]}
    (line,) = problems([{"name": "prod", "subjects": ["apiserver.prod"]}], server=server)
    assert line.startswith("clusters[0].subjects[0]: 'apiserver.prod' is not in")


def test_each_caller_is_its_cluster_and_anyone_else_is_default() -> None:
    config = parse_config(
        yaml.safe_dump(
            document(
                [
                    {"name": "prod", "caller_tokens": ["prod"], "weight": 3},
                    {"name": "default", "weight": 0.5},
                ]
            )
        ),
        "gw.yaml",
    )
    clusters = ClusterMap(config.clusters, config.server)
    assert clusters.of("token:prod") == "prod"
    assert clusters.of("token:ci") == DEFAULT_CLUSTER  # a caller token of no cluster
    assert clusters.of("10.0.0.7") == DEFAULT_CLUSTER
    assert clusters.weights == {"prod": 3, DEFAULT_CLUSTER: 0.5}
    # Without its entry, default has a share only while some caller can be in it.
    for named, has_default in ((["prod", "ci"], True), (["prod", "ci", "spare"], False)):
        entries = [{"name": n, "caller_tokens": [n]} for n in named]
        config = parse_config(yaml.safe_dump(document(entries)), "gw.yaml")
        weights = ClusterMap(config.clusters, config.server).weights
        assert (DEFAULT_CLUSTER in weights) is has_default, (named, weights)
    assert ClusterMap((), config.server).shares() is None  # no clusters: the bucket as it was


def gateway(clusters: list[dict[str, Any]], delay: float = 0.0, **idp: Any) -> Gateway:
    config = parse_config(yaml.safe_dump(document(clusters, idp)), "gw.yaml")
    known = Authenticated(UserInfo("someone"))
    return Gateway(config, backends=[Scripted("idp", known, delay), Scripted("gl", known)])


async def test_a_cluster_that_may_not_use_a_backend_is_refused_without_a_call() -> None:
    gw = gateway([{"name": "ci", "caller_tokens": ["ci"], "backends": ["idp"]}])
    refused = await gw.pipeline.review("glpat-bot", (), "token:ci")
    assert isinstance(refused.outcome, Rejected)
    assert refused.outcome.reason == "cluster 'ci' may not use backend 'gl'"
    scripted = gw.backends[1]
    assert isinstance(scripted, Scripted) and scripted.seen == []
    # Another cluster (default) reaches it; ci still reaches its own backend.
    assert isinstance(
        (await gw.pipeline.review("glpat-bot", (), "token:prod")).outcome, Authenticated
    )
    assert isinstance((await gw.pipeline.review("alice", (), "token:ci")).outcome, Authenticated)


async def test_a_cluster_limited_to_prefixes_cannot_reach_the_chain_backends() -> None:
    gw = gateway([{"name": "ci", "caller_tokens": ["ci"], "backends": ["gl"]}])
    refused = await gw.pipeline.review("alice", (), "token:ci")  # no prefix: the chain
    assert isinstance(refused.outcome, Rejected)
    assert refused.outcome.reason == "no backend accepts this token's form"
    assert isinstance(
        (await gw.pipeline.review("glpat-bot", (), "token:ci")).outcome, Authenticated
    )


async def test_a_clusters_storm_leaves_another_cluster_its_slots() -> None:
    """Through the pipeline: the IdP takes 2 calls at a time (a fixed limit); prod sends
    40 never-seen tokens at once, then ci one login. ci's login is answered, prod's
    extra calls are refused ("saturated") rather than ci's."""
    gw = gateway(
        [{"name": "prod", "caller_tokens": ["prod"]}, {"name": "ci", "caller_tokens": ["ci"]}],
        delay=0.05,
        concurrency={"initial_limit": 2, "min_limit": 2, "max_limit": 2},
    )
    await gw.start()
    try:
        # Two calls measured: the limit lets calls wait for a slot from here on.
        for token in ("warm-1", "warm-2"):
            await gw.pipeline.review(token, (), "token:prod")
        storm = [
            asyncio.create_task(gw.pipeline.review(f"cold-{i}", (), "token:prod"))
            for i in range(40)
        ]
        await asyncio.sleep(0)
        login = await gw.pipeline.review("ci-login", (), "token:ci")
        answers = await asyncio.gather(*storm)
    finally:
        await gw.close()
    assert isinstance(login.outcome, Authenticated), login
    refused = [a for a in answers if not isinstance(a.outcome, Authenticated)]
    assert refused and all("saturated" in a.outcome.reason for a in refused)


class Gated(Scripted):
    """Answers as :class:`Scripted` does, once ``gate`` is open."""

    def __init__(self, name: str, answer: Outcome) -> None:
        super().__init__(name, answer)
        self.gate = asyncio.Event()
        self.gate.set()

    async def authenticate(self, token: str, wire: WireTime | None = None) -> Outcome:
        self.seen.append(token)
        await self.gate.wait()
        await asyncio.sleep(0.01)  # a latency the concurrency limit can measure
        return self.answer


async def until(check: Callable[[], bool], what: str) -> None:
    """Wait for ``check()``, a few seconds at most (no timing is asserted)."""
    for _ in range(500):
        if check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"never: {what}")


def joined(gw: Gateway) -> float:
    value = gw.metrics.registry.get_sample_value(
        "authn_gateway_coalesced_waiters_total", {"backend": "idp"}
    )
    return value or 0.0


async def storm_then_join(answer: Outcome, joiner: str) -> tuple[Any, Any, Gated]:
    """prod spends its share of the bucket (rate 1/minute, burst 10; prod 1, ci 3, spare
    1) and its storm goes on; ci holds the one call slot; prod's review of "shared"
    waits for the slot, and ``joiner``'s review of the same token joins prod's call.
    Then the slot frees. Both answers, and the backend."""
    clusters = [
        {"name": "prod", "caller_tokens": ["prod"]},
        {"name": "ci", "caller_tokens": ["ci"], "weight": 3},
        {"name": "spare", "caller_tokens": ["spare"]},
    ]
    config = parse_config(
        yaml.safe_dump(
            document(
                clusters,
                {
                    "bucket": {"rate": "1/minute", "burst": 10},
                    "concurrency": {"initial_limit": 1, "min_limit": 1, "max_limit": 1},
                },
            )
        ),
        "gw.yaml",
    )
    idp = Gated("idp", answer)
    gw = Gateway(config, backends=[idp, Scripted("gl", answer)])
    await gw.start()
    try:
        for i in range(20):  # prod's share, and what the others lend
            storm = await gw.pipeline.review(f"storm-{i}", (), "token:prod")
            if isinstance(storm.outcome, HeldBack):
                break
        assert isinstance(storm.outcome, HeldBack), storm
        idp.gate.clear()
        hold = asyncio.create_task(gw.pipeline.review("ci-hold", (), "token:ci"))
        await until(lambda: "ci-hold" in idp.seen, "ci's call holds the slot")
        first = asyncio.create_task(gw.pipeline.review("shared", (), "token:prod"))
        limiter = gw.pipeline.backends["idp"].parts.limiter
        assert limiter is not None and isinstance(limiter.algorithm, VegasLimit)
        limiter.algorithm._recent_rtt = 0.05  # as if measured: a call may wait for a slot
        await until(lambda: limiter.waiting(cluster="prod") == 1, "prod's call waits")
        second = asyncio.create_task(gw.pipeline.review("shared", (), f"token:{joiner}"))
        await until(lambda: joined(gw) == 1, "the second review joined")
        idp.gate.set()
        await hold
        return await first, await second, idp
    finally:
        await gw.close()


async def test_a_join_refused_for_another_clusters_capacity_asks_under_its_own_share() -> None:
    """prod's call for a token is refused by prod's share of the bucket (the IdP not
    asked); ci's review of the same token had joined that call. ci does not inherit
    prod's refusal: it asks under its own share, and the IdP sees the token once, for
    ci."""
    known = Authenticated(UserInfo("someone"))
    first, second, idp = await storm_then_join(known, "ci")
    assert isinstance(second.outcome, Authenticated), second
    assert idp.seen.count("shared") == 1
    assert isinstance(first.outcome, HeldBack), first
    assert first.outcome.reason == "outbound rate limit reached"
    assert first.outcome.cluster == "prod"


async def test_a_join_of_the_refused_cluster_shares_its_refusal() -> None:
    """Another review from prod itself takes prod's refusal: its own share said no."""
    known = Authenticated(UserInfo("someone"))
    first, second, idp = await storm_then_join(known, "prod")
    assert isinstance(first.outcome, HeldBack) and isinstance(second.outcome, HeldBack)
    assert idp.seen.count("shared") == 0


@pytest.mark.parametrize(
    "answer", [Rejected("no such token"), Unavailable("IdP answered 503")], ids=repr
)
async def test_a_join_shares_what_the_idp_answered(answer: Outcome) -> None:
    """A real answer of the IdP (here to ci's call, which prod's review joined) is
    everyone's: one call, one answer."""
    # ci's call is the first: prod's review of the token joins it.
    config = parse_config(
        yaml.safe_dump(
            document(
                [
                    {"name": "prod", "caller_tokens": ["prod"]},
                    {"name": "ci", "caller_tokens": ["ci"]},
                ]
            )
        ),
        "gw.yaml",
    )
    idp = Gated("idp", answer)
    gw = Gateway(config, backends=[idp, Scripted("gl", answer)])
    await gw.start()
    try:
        idp.gate.clear()
        first = asyncio.create_task(gw.pipeline.review("shared", (), "token:ci"))
        await until(lambda: "shared" in idp.seen, "ci's call is out")
        second = asyncio.create_task(gw.pipeline.review("shared", (), "token:prod"))
        await until(lambda: joined(gw) == 1, "the second review joined")
        idp.gate.set()
        answers = [(await first).outcome, (await second).outcome]
    finally:
        await gw.close()
    assert [type(a) for a in answers] == [type(answer)] * 2, answers
    assert idp.seen == ["shared"]


def test_two_caller_tokens_with_one_secret_are_refused_without_echoing_it() -> None:
    same = [{"name": "prod", "token": STRONG}, {"name": "ci", "token": STRONG}]
    with pytest.raises(ConfigError) as refused:
        parse_config(yaml.safe_dump(document([], server={"caller_tokens": same})), "gw.yaml")
    (line,) = refused.value.problems
    assert line.startswith("server: caller_tokens[1].token: the same token as caller_tokens[0]'s")
    assert STRONG not in line


def test_a_certificate_named_like_a_caller_token_is_never_that_caller() -> None:
    """A client certificate with the name "token:prod" (any the CA signed, when
    allowed_subjects is empty) must not pass for the caller token prod, nor for its
    cluster."""
    config = parse_config(
        yaml.safe_dump(document([{"name": "prod", "caller_tokens": ["prod"]}])), "gw.yaml"
    )
    tls = {"cert_file": "/x.pem", "key_file": "/x.key", "client_ca_file": "/ca.pem"}
    server = config.server.model_copy(update={"tls": TLSSettings.model_construct(**tls)})
    auth = CallerAuth(server, prefer=ClusterMap(config.clusters, server).subjects)
    assert auth.identify(("token:prod",), None) is None
    assert auth.identify(("token:prod", "apiserver-1"), None) == "apiserver-1"
    assert ClusterMap(config.clusters, server).of("apiserver-1") == DEFAULT_CLUSTER
