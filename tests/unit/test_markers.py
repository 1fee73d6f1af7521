"""user.extra markers and the identity fingerprint that decides what a reload keeps."""

from __future__ import annotations

from authn_gateway.config import load_config
from authn_gateway.review.carryover import identity_fingerprint
from authn_gateway.review.markers import Markers
from backends.base import UserInfo

ALICE = UserInfo("alice", "1", ("dev",), {"team": ("core",)})


def test_a_stale_answer_carries_both_markers() -> None:
    extra = Markers("authn-gateway.io/", stale=True, backend=True).user_extra(
        ALICE, "ldap", stale=True
    )
    assert extra == {
        "team": ("core",),
        "authn-gateway.io/backend": ("ldap",),
        "authn-gateway.io/stale": ("true",),
    }


def test_a_fresh_answer_names_its_backend_only() -> None:
    extra = Markers("authn-gateway.io/", stale=True, backend=True).user_extra(
        ALICE, "ldap", stale=False
    )
    assert "authn-gateway.io/stale" not in extra
    assert extra["authn-gateway.io/backend"] == ("ldap",)


def test_a_backend_cannot_set_or_clear_the_gateways_markers() -> None:
    forged = UserInfo(
        "mallory", extra={"authn-gateway.io/stale": ("false",), "authn-gateway.io/backend": ("x",)}
    )
    extra = Markers("authn-gateway.io/", stale=True, backend=True).user_extra(
        forged, "ldap", stale=True
    )
    assert extra == {"authn-gateway.io/backend": ("ldap",), "authn-gateway.io/stale": ("true",)}


def test_markers_switch_off_one_at_a_time_and_take_a_prefix() -> None:
    only_stale = Markers("example.com/", stale=True, backend=False)
    assert only_stale.user_extra(ALICE, "ldap", stale=True) == {
        "team": ("core",),
        "example.com/stale": ("true",),
    }
    off = Markers("example.com/", stale=False, backend=False)
    assert off.user_extra(ALICE, "ldap", stale=True) is ALICE.extra


def test_the_fingerprint_ignores_protection_settings_and_follows_identity_settings() -> None:
    [demo] = load_config(None).backends
    same = identity_fingerprint(demo)
    for update in (
        {"timeouts": demo.timeouts.model_copy(update={"total_seconds": 9.0})},
        {"breaker": demo.breaker.model_copy(update={"fail_max": 50})},
        {"bucket": demo.bucket.model_copy(update={"rate": 1.0})},
        {"audiences": ["other"]},
    ):
        assert identity_fingerprint(demo.model_copy(update=update)) == same, update
    assert identity_fingerprint(demo.model_copy(update={"prefix": "x-"})) != same
    assert identity_fingerprint(demo.model_copy(update={"name": "other"})) != same
