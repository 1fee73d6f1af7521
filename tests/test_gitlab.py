"""The GitLab backend, through real gateway processes, against the fake GitLab on loopback."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from authn_gateway.config import ConfigError, parse_config
from authn_gateway.layers.bucket import MemoryBucketStore, TokenBucket
from backends.base import Authenticated, Rejected, Unavailable
from backends.gitlab import (
    GitLabBackend,
    GitLabSettings,
    map_user,
    missing_scopes,
    next_page_params,
    parse_expiry_date,
)
from tests.support.fakes.gitlab import FakeGitLab
from tests.support.procs import GatewayProcess, free_port, start_gateway

ALICE, BOB, CAROL, DAVE, ERIN, FRANK = 1, 2, 3, 4, 5, 6
MANY = 250  # carol's groups: three pages of 100


def oauth(n: int) -> str:
    """An OAuth access token shaped like GitLab's (64 hex digits, no prefix)."""
    return f"{n:064x}"


def yesterday() -> str:
    return (datetime.now(UTC).date() - timedelta(days=1)).isoformat()


def next_year() -> str:
    return (datetime.now(UTC).date() + timedelta(days=365)).isoformat()


def seed() -> dict[str, Any]:
    users = [
        {"id": ALICE, "username": "alice"},
        {"id": BOB, "username": "bob", "state": "blocked"},
        {"id": CAROL, "username": "carol"},
        {"id": DAVE, "username": "dave", "state": "deactivated"},
        {"id": ERIN, "username": "erin", "is_admin": True},
        {"id": FRANK, "username": "frank"},
    ]
    groups: list[dict[str, Any]] = [
        {"id": 10, "path": "platform", "name": "Platform", "members": {ALICE: 30, FRANK: 10}},
        {"id": 11, "path": "sre", "name": "SRE", "parent_id": 10},
        {"id": 12, "path": "payments", "members": {ALICE: 20, ERIN: 50}},
        {"id": 13, "path": "guests", "members": {FRANK: 10, ALICE: 10}},
    ]
    groups += [
        {"id": 1000 + i, "path": f"many-{i:03d}", "members": {CAROL: 30}} for i in range(MANY)
    ]
    return {"users": users, "tokens": [], "groups": groups}


def add_token(fake: FakeGitLab, token: str, user: int, **fields: Any) -> str:
    kind = "personal" if token.startswith("glpat-") else "oauth"
    fake.load_seed({"tokens": [{"token": token, "user_id": user, "kind": kind, **fields}]}, False)
    return token


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeGitLab]:
    gitlab = FakeGitLab(seed=seed()).start_in_thread()
    try:
        yield gitlab
    finally:
        gitlab.stop()


@pytest.fixture(autouse=True)
def clean_fake(fake: FakeGitLab) -> Iterator[None]:
    fake.reset()
    yield
    fake.reset()
    fake.external_url = None


def gitlab_backend(base_url: str, **overrides: Any) -> dict[str, Any]:
    backend: dict[str, Any] = {
        "name": "gitlab",
        "type": "gitlab",
        "base_url": base_url,
        "timeouts": {"connect_seconds": 0.5, "read_seconds": 1.0, "total_seconds": 1.5},
        "breaker": {"fail_max": 3, "reset_timeout_seconds": 1.0},
        "bucket": {"rate": 1000, "burst": 1000},
    }
    backend.update(overrides)
    return backend


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("gitlab")


@pytest.fixture
def gateway(workdir: Path) -> Iterator[Callable[..., GatewayProcess]]:
    """Start gateways for one test; each is stopped at teardown."""
    started: list[GatewayProcess] = []

    def start(*backends: dict[str, Any]) -> GatewayProcess:
        gw = start_gateway({"backends": list(backends)}, workdir, name="gitlab-gw")
        started.append(gw)
        return gw

    yield start
    for gw in started:
        gw.stop()


@pytest.fixture(scope="module")
def shared(fake: FakeGitLab, workdir: Path) -> Iterator[GatewayProcess]:
    """One gateway with default GitLab settings, for tests that open no breaker."""
    gw = start_gateway({"backends": [gitlab_backend(fake.url)]}, workdir, name="gitlab-shared")
    try:
        yield gw
    finally:
        gw.stop()


def status(gw: GatewayProcess, token: str) -> dict[str, Any]:
    response = gw.review(token)
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()["status"]
    return result


def assert_rejected(result: dict[str, Any]) -> None:
    # An invalid token: authenticated false and no error, so kube-apiserver may cache it.
    assert result == {"authenticated": False}


def assert_unavailable(result: dict[str, Any], *words: str) -> None:
    assert result["authenticated"] is False
    assert result["error"].startswith("gitlab: "), result
    for word in words:
        assert word in result["error"], result


def group_pages(fake: FakeGitLab) -> int:
    return fake.stats().by_path.get("/api/v4/groups", 0)


# ---- token types ----------------------------------------------------------------


def test_personal_access_token_is_sent_as_private_token(
    fake: FakeGitLab, shared: GatewayProcess
) -> None:
    token = add_token(fake, "glpat-alice-personal-0001", ALICE, scopes=["read_api"])
    result = status(shared, token)
    assert result["authenticated"] is True
    assert result["user"]["username"] == "alice"
    assert result["user"]["uid"] == str(ALICE)
    # Developer in platform (and so in its subgroup), reporter in payments, guest in guests.
    assert sorted(result["user"]["groups"]) == ["guests", "payments", "platform", "platform/sre"]
    assert fake.stats().by_credential == {"private-token": 2}


def test_oauth_token_is_sent_as_bearer(fake: FakeGitLab, shared: GatewayProcess) -> None:
    token = add_token(fake, oauth(1), FRANK, scopes=["read_api"], expires_in=7200)
    result = status(shared, token)
    assert result["authenticated"] is True
    assert result["user"]["username"] == "frank"
    assert fake.stats().by_credential == {"bearer": 2}


def test_unprefixed_token_follows_the_configured_default_type(
    fake: FakeGitLab, gateway: Callable[..., GatewayProcess]
) -> None:
    # An access token from before the glpat- prefix: configured as the default type,
    # it goes in PRIVATE-TOKEN.
    token = add_token(fake, "legacy-pat-frank-0001", FRANK, kind="personal")
    gw = gateway(gitlab_backend(fake.url, default_token_type="personal"))
    assert status(gw, token)["authenticated"] is True
    assert fake.stats().by_credential == {"private-token": 2}


def test_token_types_that_never_call_the_api_are_refused_without_a_call(
    fake: FakeGitLab, shared: GatewayProcess
) -> None:
    for token in ("glrt-runner-token-000000001", "glptt-0123456789abcdef0123", "gldt-deploy00001"):
        assert_rejected(status(shared, token))
    assert fake.stats().calls == 0


# ---- users and tokens GitLab refuses -------------------------------------------------


def test_unknown_token_is_rejected(fake: FakeGitLab, shared: GatewayProcess) -> None:
    assert_rejected(status(shared, "glpat-nobody-knows-this-0001"))
    assert_rejected(status(shared, oauth(999)))
    assert fake.stats().by_status == {401: 2}


@pytest.mark.parametrize("user", [BOB, DAVE], ids=["blocked", "deactivated"])
def test_inactive_user_is_rejected(fake: FakeGitLab, shared: GatewayProcess, user: int) -> None:
    token = add_token(fake, f"glpat-inactive-user-{user:04d}", user)
    assert_rejected(status(shared, token))
    assert fake.stats().by_status == {403: 1}


def test_expired_access_token_is_rejected(fake: FakeGitLab, shared: GatewayProcess) -> None:
    token = add_token(fake, "glpat-alice-expired-0001", ALICE, expires_at=yesterday())
    assert_rejected(status(shared, token))


def test_revoked_oauth_token_is_rejected(fake: FakeGitLab, shared: GatewayProcess) -> None:
    token = add_token(fake, oauth(2), ALICE, revoked=True)
    assert_rejected(status(shared, token))


def test_user_state_other_than_active_is_rejected() -> None:
    # GitLab answers 403 for its own users' blocked states; any other state it might
    # report in a 200 is refused too.
    assert isinstance(map_user({"id": 7, "username": "x", "state": "banned"}), Rejected)
    assert isinstance(map_user({"id": 7, "username": "x"}), Rejected)
    assert isinstance(map_user({"id": 7, "username": ""}), Unavailable)
    user = map_user({"id": 7, "username": "x", "state": "active"}, "gitlab:")
    assert not isinstance(user, Rejected | Unavailable)
    assert (user.username, user.uid) == ("gitlab:x", "7")


# ---- scopes and expiry ------------------------------------------------------------


def test_token_without_required_scope_is_rejected_and_the_reason_logged(
    fake: FakeGitLab, gateway: Callable[..., GatewayProcess]
) -> None:
    gw = gateway(gitlab_backend(fake.url, required_scopes=["read_api"]))
    narrow = add_token(fake, "glpat-alice-readuser-0001", ALICE, scopes=["read_user"])
    wide = add_token(fake, "glpat-alice-readapi-00001", ALICE, scopes=["read_api"])
    assert_rejected(status(gw, narrow))
    assert status(gw, wide)["authenticated"] is True
    assert fake.stats().by_path["/api/v4/personal_access_tokens/self"] == 2
    gw.stop()
    logs = gw.logs()
    assert "lacks required scope(s): read_api" in logs
    assert narrow not in logs and wide not in logs


def test_any_of_several_scopes_may_qualify_an_oauth_token(
    fake: FakeGitLab, gateway: Callable[..., GatewayProcess]
) -> None:
    gw = gateway(gitlab_backend(fake.url, required_scopes=["api", "read_api"], scope_match="any"))
    token = add_token(fake, oauth(3), ALICE, scopes=["read_api"], expires_in=7200)
    assert status(gw, token)["authenticated"] is True
    assert fake.stats().by_path["/oauth/token/info"] == 1


def test_token_that_cannot_list_groups_gets_insufficient_scope_and_is_rejected(
    fake: FakeGitLab, gateway: Callable[..., GatewayProcess]
) -> None:
    gw = gateway(gitlab_backend(fake.url))
    token = add_token(fake, "glpat-frank-readuser-0001", FRANK, scopes=["read_user"])
    assert_rejected(status(gw, token))
    assert fake.stats().by_status == {200: 1, 403: 1}
    gw.stop()
    logs = gw.logs()
    assert "insufficient_scope (needs one of: api read_api)" in logs
    assert token not in logs


def test_oauth_token_expiry_caps_the_cache(
    fake: FakeGitLab, gateway: Callable[..., GatewayProcess]
) -> None:
    # Cached for 300 s by default; GitLab says the token dies in 2 s.
    gw = gateway(gitlab_backend(fake.url, check_token_expiry=True))
    token = add_token(fake, oauth(4), ALICE, scopes=["read_api"], expires_in=2)
    assert status(gw, token)["authenticated"] is True
    deadline = time.monotonic() + 15
    while status(gw, token)["authenticated"] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert_rejected(status(gw, token))
    # Not served from the cache: the gateway asked GitLab again after the expiry.
    assert fake.stats().by_path["/api/v4/user"] >= 2


def test_access_token_expiry_date_is_reported_as_midnight_utc() -> None:
    assert parse_expiry_date("2030-01-31") == datetime(2030, 1, 31, tzinfo=UTC).timestamp()
    assert parse_expiry_date(None) is None
    assert parse_expiry_date("not a date") is None


def test_scope_matching_is_literal() -> None:
    assert missing_scopes(["api"], ["read_api"], "all") == ["read_api"]
    assert missing_scopes(["read_api"], ["api", "read_api"], "any") == []
    assert missing_scopes(["read_user"], ["api", "read_api"], "any") == ["api", "read_api"]


# ---- groups -------------------------------------------------------------------


def test_groups_are_collected_across_every_page(fake: FakeGitLab, shared: GatewayProcess) -> None:
    token = add_token(fake, "glpat-carol-pages-000001", CAROL, scopes=["read_api"])
    result = status(shared, token)
    assert result["authenticated"] is True
    assert result["user"]["groups"] == [f"many-{i:03d}" for i in range(MANY)]
    assert group_pages(fake) == 3


def test_min_access_level_keeps_an_admin_to_their_own_groups(
    fake: FakeGitLab, shared: GatewayProcess
) -> None:
    token = add_token(fake, "glpat-erin-admin-0000001", ERIN, scopes=["api"])
    result = status(shared, token)
    # Without min_access_level GitLab would list all 254 groups for an administrator.
    assert result["user"]["groups"] == ["payments"]


def test_min_access_level_drops_groups_with_a_lower_role(
    fake: FakeGitLab, gateway: Callable[..., GatewayProcess]
) -> None:
    gw = gateway(gitlab_backend(fake.url, groups={"min_access_level": 20}))
    token = add_token(fake, "glpat-alice-reporter-0001", ALICE, scopes=["read_api"])
    assert sorted(status(gw, token)["user"]["groups"]) == ["payments", "platform", "platform/sre"]


def test_group_ids_top_level_filter_and_prefixes(
    fake: FakeGitLab, gateway: Callable[..., GatewayProcess]
) -> None:
    gw = gateway(
        gitlab_backend(
            fake.url,
            username_prefix="gitlab:",
            groups={"name": "id", "top_level": ["platform"], "prefix": "gitlab-group:"},
        )
    )
    token = add_token(fake, "glpat-alice-ids-00000001", ALICE, scopes=["read_api"])
    user = status(gw, token)["user"]
    assert user["username"] == "gitlab:alice"
    assert user["groups"] == ["gitlab-group:10", "gitlab-group:11"]


def test_link_header_is_followed_on_our_own_base_url(
    fake: FakeGitLab, gateway: Callable[..., GatewayProcess]
) -> None:
    gw = gateway(gitlab_backend(fake.url))
    # A proxy dropped X-Next-Page, and GitLab writes its external URL into Link.
    fake.configure(drop_headers=["x-next-page"])
    fake.external_url = "https://gitlab.example.com"
    token = add_token(fake, "glpat-carol-links-000001", CAROL, scopes=["read_api"])
    result = status(gw, token)
    assert len(result["user"]["groups"]) == MANY
    assert group_pages(fake) == 3


def test_user_with_more_pages_than_allowed_is_rejected(
    fake: FakeGitLab, gateway: Callable[..., GatewayProcess]
) -> None:
    gw = gateway(gitlab_backend(fake.url, groups={"max_pages": 2}))
    token = add_token(fake, "glpat-carol-toomany-0001", CAROL, scopes=["read_api"])
    assert_rejected(status(gw, token))
    assert group_pages(fake) == 2


def test_group_lookups_are_cached_per_user_apart_from_tokens(
    fake: FakeGitLab, gateway: Callable[..., GatewayProcess]
) -> None:
    gw = gateway(gitlab_backend(fake.url))
    first = add_token(fake, "glpat-carol-cache-000001", CAROL, scopes=["read_api"])
    second = add_token(fake, oauth(5), CAROL, scopes=["read_api"])
    assert len(status(gw, first)["user"]["groups"]) == MANY
    assert len(status(gw, second)["user"]["groups"]) == MANY
    # The second token was validated, but carol's three pages were not fetched again.
    assert fake.stats().by_path == {"/api/v4/user": 2, "/api/v4/groups": 3}


def test_failed_group_page_makes_the_review_unavailable(
    fake: FakeGitLab, gateway: Callable[..., GatewayProcess]
) -> None:
    gw = gateway(gitlab_backend(fake.url))
    fake.configure(path_prefix="/api/v4/groups", status=500)
    token = add_token(fake, "glpat-alice-grouperr-001", ALICE, scopes=["read_api"])
    assert_unavailable(status(gw, token), "500")


def test_next_page_comes_from_x_next_page_then_link() -> None:
    params = {"per_page": 100, "page": 1}
    url = "https://elsewhere.example/api/v4/groups?page=3&per_page=100"
    both = httpx.Response(200, headers={"x-next-page": "2", "link": f'<{url}>; rel="next"'})
    assert next_page_params(both, params) == {"per_page": 100, "page": 2}
    link_only = httpx.Response(200, headers={"x-next-page": "", "link": f'<{url}>; rel="next"'})
    assert next_page_params(link_only, params) == {"per_page": "100", "page": "3"}
    last = httpx.Response(200, headers={"x-next-page": ""})
    assert next_page_params(last, params) is None


async def test_every_follow_up_call_takes_from_the_outbound_budget(fake: FakeGitLab) -> None:
    token = add_token(fake, "glpat-carol-budget-00001", CAROL, scopes=["read_api"])
    # Room for one follow-up call: the first group page; the second is refused.
    # A frozen clock keeps the bucket from refilling (and its arithmetic exact).
    budget = TokenBucket("t", 1.0, 1, MemoryBucketStore(clock=lambda: 0.0))
    backend = GitLabBackend(GitLabSettings.model_validate(gitlab_backend(fake.url)), budget=budget)
    try:
        outcome = await backend.authenticate(token)
    finally:
        await backend.close()
    assert isinstance(outcome, Unavailable)
    assert "outbound rate limit" in outcome.reason
    assert fake.stats().by_path == {"/api/v4/user": 1, "/api/v4/groups": 1}


async def test_backend_alone_maps_a_good_token(fake: FakeGitLab) -> None:
    token = add_token(fake, "glpat-frank-direct-00001", FRANK, scopes=["read_api"])
    backend = GitLabBackend(GitLabSettings.model_validate(gitlab_backend(fake.url)))
    try:
        outcome = await backend.authenticate(token)
    finally:
        await backend.close()
    assert isinstance(outcome, Authenticated)
    assert outcome.user.groups == ("guests", "platform", "platform/sre")


# ---- GitLab cannot answer ------------------------------------------------------------


@pytest.mark.parametrize(
    "dropped", [[], ["retry-after"]], ids=["retry-after", "ratelimit-reset-only"]
)
def test_429_stops_every_call_until_the_time_gitlab_asked_for(
    fake: FakeGitLab, gateway: Callable[..., GatewayProcess], dropped: list[str]
) -> None:
    gw = gateway(gitlab_backend(fake.url))
    token = add_token(fake, f"glpat-alice-throttled-{len(dropped)}", ALICE, scopes=["read_api"])
    fake.configure(status=429, retry_after=3, drop_headers=dropped)
    assert_unavailable(status(gw, token), "429")
    throttled_at = fake.stats().log[0][0]
    # Retry-After: 3 counts from the answer; RateLimit-Reset is a whole Unix second.
    asked_until = throttled_at + 3 if not dropped else int(throttled_at + 3)
    # GitLab would answer now, but asked for 3 s of quiet.
    fake.configure(status=None, drop_headers=[])
    refused_meanwhile = 0
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        result = status(gw, token)
        if result["authenticated"]:
            break
        assert_unavailable(result, "circuit breaker open")
        refused_meanwhile += 1
        time.sleep(0.25)
    assert result["authenticated"] is True
    assert refused_meanwhile > 0
    later = [arrived for arrived, _, _ in fake.stats().log[1:]]
    assert later, "the gateway never called GitLab again"
    assert min(later) >= asked_until


def test_429_without_headers_is_unavailable(
    fake: FakeGitLab, gateway: Callable[..., GatewayProcess]
) -> None:
    gw = gateway(gitlab_backend(fake.url))
    fake.configure(status=429)
    assert_unavailable(status(gw, "glpat-whoever-bare429-01"), "429")


@pytest.mark.parametrize("code", [500, 502, 503])
def test_server_errors_are_unavailable(
    fake: FakeGitLab, gateway: Callable[..., GatewayProcess], code: int
) -> None:
    gw = gateway(gitlab_backend(fake.url))
    fake.configure(status=code)
    assert_unavailable(status(gw, f"glpat-whoever-{code}-error-01"), str(code))


def test_gitlab_that_never_answers_is_unavailable_within_the_deadline(
    fake: FakeGitLab, gateway: Callable[..., GatewayProcess]
) -> None:
    gw = gateway(gitlab_backend(fake.url))
    fake.configure(hang=True)
    result = status(gw, "glpat-whoever-hang-000001")
    assert result["authenticated"] is False
    assert result["error"].startswith("gitlab: ")
    assert "timed out" in result["error"] or "no answer within" in result["error"]


def test_refused_connection_is_unavailable(gateway: Callable[..., GatewayProcess]) -> None:
    gw = gateway(gitlab_backend(f"http://127.0.0.1:{free_port()}"))
    assert_unavailable(status(gw, "glpat-whoever-refused-001"), "connection failed")


def test_wrong_base_url_is_a_configuration_problem(
    fake: FakeGitLab, gateway: Callable[..., GatewayProcess]
) -> None:
    gw = gateway(gitlab_backend(fake.url + "/not-gitlab"))
    assert_unavailable(status(gw, "glpat-whoever-base-url-01"), "404", "check base_url")


# ---- configuration ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("base_url", "gitlab.example.com", "backends[0].base_url"),
        ("groups", {"min_access_level": 25}, "backends[0].groups.min_access_level"),
        ("groups", {"max_pages": 0}, "backends[0].groups.max_pages"),
        ("default_token_type", "jwt", "backends[0].default_token_type"),
        ("personal_token_prefixes", [""], "personal_token_prefixes"),
    ],
)
def test_invalid_settings_name_the_field(field: str, value: Any, message: str) -> None:
    backend = {"name": "gl", "type": "gitlab", field: value}
    with pytest.raises(ConfigError) as err:
        parse_config(yaml.safe_dump({"backends": [backend]}), "gw.yaml")
    assert message in str(err.value)


def test_tokens_never_reach_the_shared_gateway_log(shared: GatewayProcess) -> None:
    logs = shared.logs()
    for secret in ("glpat-alice-personal-0001", oauth(1), "glpat-carol-pages-000001"):
        assert secret not in logs
