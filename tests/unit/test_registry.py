"""backends/registry.py: a settings class registers its type; a backend kept apart from its
settings (keystone) registers itself as what they build, so the settings module never
imports the backend that imports it (tests/unit/test_layout.py, no import cycle)."""

from __future__ import annotations

import json
from typing import Any, Literal, cast

import pytest

from authn_gateway.config import parse_config
from backends.budget import UNLIMITED
from backends.keystone import KeystoneBackend, KeystoneSettings
from backends.keystone.groups import GroupLookup
from backends.registry import build_registered, builds
from backends.settings import BackendSettings

KEYSTONE = {
    "name": "ks",
    "type": "keystone",
    "auth_url": "https://keystone.example:5000",
    "service": {"username": "gw", "password": "pw", "system_scope": "all"},
}


def test_settings_build_the_backend_that_registered_itself() -> None:
    settings = parse_config(json.dumps({"backends": [KEYSTONE]}), "gw.yaml").backends[0]
    assert isinstance(settings, KeystoneSettings)
    assert type(settings.build()) is KeystoneBackend
    assert type(build_registered(settings, UNLIMITED)) is KeystoneBackend


def test_settings_with_no_registered_backend_say_so_by_their_type() -> None:
    class Unbuilt(BackendSettings):
        type: Literal["unbuilt"]

    with pytest.raises(NotImplementedError) as err:
        build_registered(Unbuilt(type="unbuilt", name="nobody"), UNLIMITED)
    assert "'unbuilt'" in str(err.value) and "@builds" in str(err.value), str(err.value)


def test_a_second_backend_for_the_same_settings_is_refused() -> None:
    class Twice(BackendSettings):
        type: Literal["twice"]

    builds(Twice)(KeystoneBackend)
    builds(Twice)(KeystoneBackend)  # the same one again: harmless (a re-import)
    with pytest.raises(ValueError, match="Twice builds two backends"):
        builds(Twice)(cast(Any, GroupLookup))
    with pytest.raises(ValueError, match="KeystoneSettings builds two backends"):
        builds(KeystoneSettings)(cast(Any, GroupLookup))
    settings = parse_config(json.dumps({"backends": [KEYSTONE]}), "gw.yaml").backends[0]
    assert type(settings.build()) is KeystoneBackend
