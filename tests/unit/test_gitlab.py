"""The GitLab backend, through real gateway processes, against the fake GitLab on loopback."""

from __future__ import annotations

from datetime import UTC, datetime
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
from tests.support.gitlab_helpers import CAROL, FRANK, add_token, gitlab_backend


def test_user_state_other_than_active_is_rejected() -> None:
    # GitLab answers 403 for its own users' blocked states; any other state it might
    # report in a 200 is refused too.
    assert isinstance(map_user({"id": 7, "username": "x", "state": "banned"}), Rejected)
    assert isinstance(map_user({"id": 7, "username": "x"}), Rejected)
    assert isinstance(map_user({"id": 7, "username": ""}), Unavailable)
    user = map_user({"id": 7, "username": "x", "state": "active"}, "gitlab:")
    assert not isinstance(user, Rejected | Unavailable)
    assert (user.username, user.uid) == ("gitlab:x", "7")


def test_access_token_expiry_date_is_reported_as_midnight_utc() -> None:
    assert parse_expiry_date("2030-01-31") == datetime(2030, 1, 31, tzinfo=UTC).timestamp()
    assert parse_expiry_date(None) is None
    assert parse_expiry_date("not a date") is None


def test_scope_matching_is_literal() -> None:
    assert missing_scopes(["api"], ["read_api"], "all") == ["read_api"]
    assert missing_scopes(["read_api"], ["api", "read_api"], "any") == []
    assert missing_scopes(["read_user"], ["api", "read_api"], "any") == ["api", "read_api"]


def test_next_page_comes_from_x_next_page_then_link() -> None:
    params = {"per_page": 100, "page": 1}
    url = "https://elsewhere.example/api/v4/groups?page=3&per_page=100"
    both = httpx.Response(200, headers={"x-next-page": "2", "link": f'<{url}>; rel="next"'})
    assert next_page_params(both, params) == {"per_page": 100, "page": 2}
    link_only = httpx.Response(200, headers={"x-next-page": "", "link": f'<{url}>; rel="next"'})
    assert next_page_params(link_only, params) == {"per_page": "100", "page": "3"}
    last = httpx.Response(200, headers={"x-next-page": ""})
    assert next_page_params(last, params) is None


async def test_every_follow_up_call_takes_from_the_outbound_budget(fake_gitlab: FakeGitLab) -> None:
    token = add_token(fake_gitlab, "glpat-carol-budget-00001", CAROL, scopes=["read_api"])
    # Room for one follow-up call: the first group page; the second is refused.
    # A frozen clock keeps the bucket from refilling (and its arithmetic exact).
    budget = TokenBucket("t", 1.0, 1, MemoryBucketStore(clock=lambda: 0.0))
    backend = GitLabBackend(
        GitLabSettings.model_validate(gitlab_backend(fake_gitlab.url)), budget=budget
    )
    try:
        outcome = await backend.authenticate(token)
    finally:
        await backend.close()
    assert isinstance(outcome, Unavailable)
    assert "outbound rate limit" in outcome.reason
    assert fake_gitlab.stats().by_path == {"/api/v4/user": 1, "/api/v4/groups": 1}


async def test_backend_alone_maps_a_good_token(fake_gitlab: FakeGitLab) -> None:
    token = add_token(fake_gitlab, "glpat-frank-direct-00001", FRANK, scopes=["read_api"])
    backend = GitLabBackend(GitLabSettings.model_validate(gitlab_backend(fake_gitlab.url)))
    try:
        outcome = await backend.authenticate(token)
    finally:
        await backend.close()
    assert isinstance(outcome, Authenticated)
    assert outcome.user.groups == ("guests", "platform", "platform/sre")


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
