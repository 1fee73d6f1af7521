"""The introspection backend (RFC 7662) on real processes, against the fake issuer's
``/introspect`` over HTTPS; call counts are the issuer's own."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from authn_gateway.config import ConfigError, parse_config
from backends.introspection import IntrospectionSettings, answer_refusal
from tests.support.fakes.issuer import FakeIssuer
from tests.support.introspection_helpers import introspection_backend


def test_an_introspection_backend_must_say_which_tokens_are_meant_for_it(
    issuer: FakeIssuer, tmp_path: Path
) -> None:
    backend = introspection_backend(issuer, tmp_path / "ca.pem")
    del backend["accept"]
    for accept in (None, {}, {"audiences": []}, {"client_ids": [""]}):
        entry = dict(backend) if accept is None else {**backend, "accept": accept}
        with pytest.raises(ConfigError) as caught:
            parse_config(yaml.safe_dump({"backends": [entry]}), "gw.yaml")
        assert any("backends[0].accept" in p for p in caught.value.problems), (
            accept,
            caught.value.problems,
        )


SETTINGS = IntrospectionSettings.model_validate(
    {
        "name": "opaque",
        "type": "introspection",
        "url": "https://idp.example/introspect",
        "client_id": "gw",
        "client_secret": "introspection-test-only-Wq4Nd8Rk2Lv6Ty0Hb",
        "accept": {"audiences": ["kubernetes"], "client_ids": ["cli"]},
        "claimMappings": {"username": {"claim": "username", "prefix": ""}},
    }
)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3)
    ),
    max_leaves=8,
)

fields = st.sampled_from(["aud", "client_id", "token_type", "exp", "nbf", "username"])


@given(answer=st.dictionaries(fields | st.text(max_size=6), json_values, max_size=8))
def test_any_active_answer_is_checked_without_raising(answer: dict[str, Any]) -> None:
    problem = answer_refusal(answer, SETTINGS, time.time())
    assert problem is None or isinstance(problem, str)
    if problem is None:  # then it names us, by both rules
        assert answer.get("client_id") == "cli"
        aud = answer.get("aud")
        assert aud == "kubernetes" or (isinstance(aud, list) and "kubernetes" in aud)
