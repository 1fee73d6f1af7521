"""The GitLab backend, through real gateway processes, against the fake GitLab on loopback."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.support.fakes.gitlab import FakeGitLab
from tests.support.gitlab_helpers import (
    ALICE,
    BOB,
    CAROL,
    DAVE,
    ERIN,
    FRANK,
    MANY,
    add_token,
    gitlab_backend,
    oauth,
)
from tests.support.procs import GatewayProcess, free_port, start_gateway


def yesterday() -> str:
    return (datetime.now(UTC).date() - timedelta(days=1)).isoformat()


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
def shared(gitlab_server: FakeGitLab, workdir: Path) -> Iterator[GatewayProcess]:
    """One gateway with default GitLab settings, for tests that open no breaker."""
    gw = start_gateway(
        {"backends": [gitlab_backend(gitlab_server.url)]}, workdir, name="gitlab-shared"
    )
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


def group_pages(fake_gitlab: FakeGitLab) -> int:
    return fake_gitlab.stats().by_path.get("/api/v4/groups", 0)


def test_personal_access_token_is_sent_as_private_token(
    fake_gitlab: FakeGitLab, shared: GatewayProcess
) -> None:
    token = add_token(fake_gitlab, "glpat-alice-personal-0001", ALICE, scopes=["read_api"])
    result = status(shared, token)
    assert result["authenticated"] is True
    assert result["user"]["username"] == "alice"
    assert result["user"]["uid"] == str(ALICE)
    # Developer in platform (and so in its subgroup), reporter in payments, guest in guests.
    assert sorted(result["user"]["groups"]) == ["guests", "payments", "platform", "platform/sre"]
    assert fake_gitlab.stats().by_credential == {"private-token": 2}


def test_oauth_token_is_sent_as_bearer(fake_gitlab: FakeGitLab, shared: GatewayProcess) -> None:
    token = add_token(fake_gitlab, oauth(1), FRANK, scopes=["read_api"], expires_in=7200)
    result = status(shared, token)
    assert result["authenticated"] is True
    assert result["user"]["username"] == "frank"
    assert fake_gitlab.stats().by_credential == {"bearer": 2}


def test_unprefixed_token_follows_the_configured_default_type(
    fake_gitlab: FakeGitLab, gateway: Callable[..., GatewayProcess]
) -> None:
    # An access token from before the glpat- prefix: configured as the default type,
    # it goes in PRIVATE-TOKEN.
    token = add_token(fake_gitlab, "legacy-pat-frank-0001", FRANK, kind="personal")
    gw = gateway(gitlab_backend(fake_gitlab.url, default_token_type="personal"))
    assert status(gw, token)["authenticated"] is True
    assert fake_gitlab.stats().by_credential == {"private-token": 2}


def test_token_types_that_never_call_the_api_are_refused_without_a_call(
    fake_gitlab: FakeGitLab, shared: GatewayProcess
) -> None:
    for token in ("glrt-runner-token-000000001", "glptt-0123456789abcdef0123", "gldt-deploy00001"):
        assert_rejected(status(shared, token))
    assert fake_gitlab.stats().calls == 0


def test_unknown_token_is_rejected(fake_gitlab: FakeGitLab, shared: GatewayProcess) -> None:
    assert_rejected(status(shared, "glpat-nobody-knows-this-0001"))
    assert_rejected(status(shared, oauth(999)))
    assert fake_gitlab.stats().by_status == {401: 2}


@pytest.mark.parametrize("user", [BOB, DAVE], ids=["blocked", "deactivated"])
def test_inactive_user_is_rejected(
    fake_gitlab: FakeGitLab, shared: GatewayProcess, user: int
) -> None:
    token = add_token(fake_gitlab, f"glpat-inactive-user-{user:04d}", user)
    assert_rejected(status(shared, token))
    assert fake_gitlab.stats().by_status == {403: 1}


def test_expired_access_token_is_rejected(fake_gitlab: FakeGitLab, shared: GatewayProcess) -> None:
    token = add_token(fake_gitlab, "glpat-alice-expired-0001", ALICE, expires_at=yesterday())
    assert_rejected(status(shared, token))


def test_revoked_oauth_token_is_rejected(fake_gitlab: FakeGitLab, shared: GatewayProcess) -> None:
    token = add_token(fake_gitlab, oauth(2), ALICE, revoked=True)
    assert_rejected(status(shared, token))


def test_token_without_required_scope_is_rejected_and_the_reason_logged(
    fake_gitlab: FakeGitLab, gateway: Callable[..., GatewayProcess]
) -> None:
    gw = gateway(gitlab_backend(fake_gitlab.url, required_scopes=["read_api"]))
    narrow = add_token(fake_gitlab, "glpat-alice-readuser-0001", ALICE, scopes=["read_user"])
    wide = add_token(fake_gitlab, "glpat-alice-readapi-00001", ALICE, scopes=["read_api"])
    assert_rejected(status(gw, narrow))
    assert status(gw, wide)["authenticated"] is True
    assert fake_gitlab.stats().by_path["/api/v4/personal_access_tokens/self"] == 2
    gw.stop()
    logs = gw.logs()
    assert "lacks required scope(s): read_api" in logs
    assert narrow not in logs and wide not in logs


def test_any_of_several_scopes_may_qualify_an_oauth_token(
    fake_gitlab: FakeGitLab, gateway: Callable[..., GatewayProcess]
) -> None:
    gw = gateway(
        gitlab_backend(fake_gitlab.url, required_scopes=["api", "read_api"], scope_match="any")
    )
    token = add_token(fake_gitlab, oauth(3), ALICE, scopes=["read_api"], expires_in=7200)
    assert status(gw, token)["authenticated"] is True
    assert fake_gitlab.stats().by_path["/oauth/token/info"] == 1


def test_token_that_cannot_list_groups_gets_insufficient_scope_and_is_rejected(
    fake_gitlab: FakeGitLab, gateway: Callable[..., GatewayProcess]
) -> None:
    gw = gateway(gitlab_backend(fake_gitlab.url))
    token = add_token(fake_gitlab, "glpat-frank-readuser-0001", FRANK, scopes=["read_user"])
    assert_rejected(status(gw, token))
    assert fake_gitlab.stats().by_status == {200: 1, 403: 1}
    gw.stop()
    logs = gw.logs()
    assert "insufficient_scope (needs one of: api read_api)" in logs
    assert token not in logs


def test_oauth_token_expiry_caps_the_cache(
    fake_gitlab: FakeGitLab, gateway: Callable[..., GatewayProcess]
) -> None:
    # Cached for 300 s by default; GitLab says the token dies in 2 s.
    gw = gateway(gitlab_backend(fake_gitlab.url, check_token_expiry=True))
    token = add_token(fake_gitlab, oauth(4), ALICE, scopes=["read_api"], expires_in=2)
    assert status(gw, token)["authenticated"] is True
    deadline = time.monotonic() + 15
    while status(gw, token)["authenticated"] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert_rejected(status(gw, token))
    # Not served from the cache: the gateway asked GitLab again after the expiry.
    assert fake_gitlab.stats().by_path["/api/v4/user"] >= 2


def test_groups_are_collected_across_every_page(
    fake_gitlab: FakeGitLab, shared: GatewayProcess
) -> None:
    token = add_token(fake_gitlab, "glpat-carol-pages-000001", CAROL, scopes=["read_api"])
    result = status(shared, token)
    assert result["authenticated"] is True
    assert result["user"]["groups"] == [f"many-{i:03d}" for i in range(MANY)]
    assert group_pages(fake_gitlab) == 3


def test_min_access_level_keeps_an_admin_to_their_own_groups(
    fake_gitlab: FakeGitLab, shared: GatewayProcess
) -> None:
    token = add_token(fake_gitlab, "glpat-erin-admin-0000001", ERIN, scopes=["api"])
    result = status(shared, token)
    # Without min_access_level GitLab would list all 254 groups for an administrator.
    assert result["user"]["groups"] == ["payments"]


def test_min_access_level_drops_groups_with_a_lower_role(
    fake_gitlab: FakeGitLab, gateway: Callable[..., GatewayProcess]
) -> None:
    gw = gateway(gitlab_backend(fake_gitlab.url, groups={"min_access_level": 20}))
    token = add_token(fake_gitlab, "glpat-alice-reporter-0001", ALICE, scopes=["read_api"])
    assert sorted(status(gw, token)["user"]["groups"]) == ["payments", "platform", "platform/sre"]


def test_group_ids_top_level_filter_and_prefixes(
    fake_gitlab: FakeGitLab, gateway: Callable[..., GatewayProcess]
) -> None:
    gw = gateway(
        gitlab_backend(
            fake_gitlab.url,
            username_prefix="gitlab:",
            groups={"name": "id", "top_level": ["platform"], "prefix": "gitlab-group:"},
        )
    )
    token = add_token(fake_gitlab, "glpat-alice-ids-00000001", ALICE, scopes=["read_api"])
    user = status(gw, token)["user"]
    assert user["username"] == "gitlab:alice"
    assert user["groups"] == ["gitlab-group:10", "gitlab-group:11"]


def test_link_header_is_followed_on_our_own_base_url(
    fake_gitlab: FakeGitLab, gateway: Callable[..., GatewayProcess]
) -> None:
    gw = gateway(gitlab_backend(fake_gitlab.url))
    # A proxy dropped X-Next-Page, and GitLab writes its external URL into Link.
    fake_gitlab.configure(drop_headers=["x-next-page"])
    fake_gitlab.external_url = "https://gitlab.example.com"
    token = add_token(fake_gitlab, "glpat-carol-links-000001", CAROL, scopes=["read_api"])
    result = status(gw, token)
    assert len(result["user"]["groups"]) == MANY
    assert group_pages(fake_gitlab) == 3


def test_user_with_more_pages_than_allowed_is_rejected(
    fake_gitlab: FakeGitLab, gateway: Callable[..., GatewayProcess]
) -> None:
    gw = gateway(gitlab_backend(fake_gitlab.url, groups={"max_pages": 2}))
    token = add_token(fake_gitlab, "glpat-carol-toomany-0001", CAROL, scopes=["read_api"])
    assert_rejected(status(gw, token))
    assert group_pages(fake_gitlab) == 2


def test_group_lookups_are_cached_per_user_apart_from_tokens(
    fake_gitlab: FakeGitLab, gateway: Callable[..., GatewayProcess]
) -> None:
    gw = gateway(gitlab_backend(fake_gitlab.url))
    first = add_token(fake_gitlab, "glpat-carol-cache-000001", CAROL, scopes=["read_api"])
    second = add_token(fake_gitlab, oauth(5), CAROL, scopes=["read_api"])
    assert len(status(gw, first)["user"]["groups"]) == MANY
    assert len(status(gw, second)["user"]["groups"]) == MANY
    # The second token was validated, but carol's three pages were not fetched again.
    assert fake_gitlab.stats().by_path == {"/api/v4/user": 2, "/api/v4/groups": 3}


def test_failed_group_page_makes_the_review_unavailable(
    fake_gitlab: FakeGitLab, gateway: Callable[..., GatewayProcess]
) -> None:
    gw = gateway(gitlab_backend(fake_gitlab.url))
    fake_gitlab.configure(path_prefix="/api/v4/groups", status=500)
    token = add_token(fake_gitlab, "glpat-alice-grouperr-001", ALICE, scopes=["read_api"])
    assert_unavailable(status(gw, token), "500")


@pytest.mark.parametrize(
    "dropped", [[], ["retry-after"]], ids=["retry-after", "ratelimit-reset-only"]
)
def test_429_stops_every_call_until_the_time_gitlab_asked_for(
    fake_gitlab: FakeGitLab, gateway: Callable[..., GatewayProcess], dropped: list[str]
) -> None:
    gw = gateway(gitlab_backend(fake_gitlab.url))
    token = add_token(
        fake_gitlab, f"glpat-alice-throttled-{len(dropped)}", ALICE, scopes=["read_api"]
    )
    fake_gitlab.configure(status=429, retry_after=3, drop_headers=dropped)
    assert_unavailable(status(gw, token), "429")
    throttled_at = fake_gitlab.stats().log[0][0]
    # Retry-After: 3 counts from the answer; RateLimit-Reset is a whole Unix second.
    asked_until = throttled_at + 3 if not dropped else int(throttled_at + 3)
    # GitLab would answer now, but asked for 3 s of quiet.
    fake_gitlab.configure(status=None, drop_headers=[])
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
    later = [arrived for arrived, _, _ in fake_gitlab.stats().log[1:]]
    assert later, "the gateway never called GitLab again"
    assert min(later) >= asked_until


def test_429_without_headers_is_unavailable(
    fake_gitlab: FakeGitLab, gateway: Callable[..., GatewayProcess]
) -> None:
    gw = gateway(gitlab_backend(fake_gitlab.url))
    fake_gitlab.configure(status=429)
    assert_unavailable(status(gw, "glpat-whoever-bare429-01"), "429")


@pytest.mark.parametrize("code", [500, 502, 503])
def test_server_errors_are_unavailable(
    fake_gitlab: FakeGitLab, gateway: Callable[..., GatewayProcess], code: int
) -> None:
    gw = gateway(gitlab_backend(fake_gitlab.url))
    fake_gitlab.configure(status=code)
    assert_unavailable(status(gw, f"glpat-whoever-{code}-error-01"), str(code))


def test_gitlab_that_never_answers_is_unavailable_within_the_deadline(
    fake_gitlab: FakeGitLab, gateway: Callable[..., GatewayProcess]
) -> None:
    gw = gateway(gitlab_backend(fake_gitlab.url))
    fake_gitlab.configure(hang=True)
    result = status(gw, "glpat-whoever-hang-000001")
    assert result["authenticated"] is False
    assert result["error"].startswith("gitlab: ")
    assert "timed out" in result["error"] or "no answer within" in result["error"]


def test_refused_connection_is_unavailable(gateway: Callable[..., GatewayProcess]) -> None:
    gw = gateway(gitlab_backend(f"http://127.0.0.1:{free_port()}"))
    assert_unavailable(status(gw, "glpat-whoever-refused-001"), "connection failed")


def test_wrong_base_url_is_a_configuration_problem(
    fake_gitlab: FakeGitLab, gateway: Callable[..., GatewayProcess]
) -> None:
    gw = gateway(gitlab_backend(fake_gitlab.url + "/not-gitlab"))
    assert_unavailable(status(gw, "glpat-whoever-base-url-01"), "404", "check base_url")


def test_tokens_never_reach_the_shared_gateway_log(shared: GatewayProcess) -> None:
    logs = shared.logs()
    for secret in ("glpat-alice-personal-0001", oauth(1), "glpat-carol-pages-000001"):
        assert secret not in logs
