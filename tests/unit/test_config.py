"""Config validation: every error names the file and the field, and nothing starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from authn_gateway.config import ConfigError, load_config, parse_config
from tests.support.config_helpers import MINIMAL, STRONG


def problems(text: str) -> list[str]:
    with pytest.raises(ConfigError) as err:
        parse_config(text, "gw.yaml")
    assert str(err.value).startswith("gw.yaml: ")
    return err.value.problems


def test_embedded_default_is_valid() -> None:
    config = load_config(None)
    assert config.server.host == "127.0.0.1"
    assert [b.type for b in config.backends] == ["static"]


def test_minimal_config_gets_production_defaults() -> None:
    config = parse_config(MINIMAL, "gw.yaml")
    backend = config.backends[0]
    assert backend.timeouts.total_seconds == 2.0
    assert config.cache.positive_ttl_seconds == 300
    assert config.cache.negative_ttl_seconds == 30
    assert config.cache.max_entries == 100_000
    assert config.server.max_body_bytes == 64 * 1024
    assert config.server.review_path == "/authenticate"


def test_negative_timeout_names_the_field() -> None:
    text = (
        MINIMAL
        + """
  - name: other
    type: userinfo
    url: http://127.0.0.1:1/userinfo
    timeouts: {total_seconds: 0}
"""
    )
    assert problems(text) == ["backends[1].timeouts.total_seconds: Input should be greater than 0"]


def test_unknown_key_is_an_error() -> None:
    assert problems(MINIMAL + "cach: {}\n") == ["cach: Extra inputs are not permitted"]


def test_unknown_backend_type_is_named() -> None:
    text = "backends:\n  - {name: x, type: kerberos}\n"
    [problem] = problems(text)
    assert problem.startswith("backends[0]: Input tag 'kerberos'")


def test_duplicate_backend_names_are_refused() -> None:
    text = MINIMAL + "  - {name: demo, type: static, tokens: [{token: a, username: b}]}\n"
    assert problems(text) == ["backends[1].name: 'demo' is used twice"]


def test_backend_deadline_must_fit_in_review_deadline() -> None:
    text = MINIMAL.replace("type: static", "type: static\n    timeouts: {total_seconds: 9}")
    assert "must be below review_deadline_seconds" in problems(text)[0]


def test_no_backends_is_an_error() -> None:
    assert problems("backends: []\n")[0].startswith("backends: List should have at least 1")


def test_yaml_syntax_error_names_the_line() -> None:
    [problem] = problems("backends:\n  - name: [unclosed\n")
    assert problem.startswith("line ")


def test_secret_from_missing_env_var_is_named() -> None:
    [problem] = problems(MINIMAL + "secret: env:AUTHN_GW_TEST_UNSET_VAR\n")
    assert problem == "secret: environment variable AUTHN_GW_TEST_UNSET_VAR is not set"


def test_secret_from_file_and_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    secret_file = tmp_path / "secret"
    secret_file.write_text(f"file-{STRONG}\n")
    config = parse_config(MINIMAL + f"secret: file:{secret_file}\n", "gw.yaml")
    assert config.secret is not None
    assert config.secret.get_secret_value() == f"file-{STRONG}"
    monkeypatch.setenv("GW_SECRET", f"env-{STRONG}")
    config = parse_config(MINIMAL + "secret: env:GW_SECRET\n", "gw.yaml")
    assert config.secret is not None
    assert config.secret.get_secret_value() == f"env-{STRONG}"
    assert STRONG not in repr(config)


def test_rates_accept_limits_notation() -> None:
    text = MINIMAL.replace("type: static", "type: static\n    bucket: {rate: 600/minute}")
    assert parse_config(text, "gw.yaml").backends[0].bucket.rate == 10.0


def test_missing_config_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(tmp_path / "absent.yaml")
    assert "absent.yaml: cannot read" in str(err.value)


def test_breaker_failure_rate_is_optional_and_validated() -> None:
    assert parse_config(MINIMAL, "gw.yaml").backends[0].breaker.failure_rate is None
    text = MINIMAL.replace(
        "type: static", "type: static\n    breaker: {failure_rate: {threshold: 1.5}}"
    )
    assert problems(text) == [
        "backends[0].breaker.failure_rate.threshold: Input should be less than or equal to 1"
    ]


@pytest.mark.parametrize(
    "secret",
    [
        "x",
        "fleet-secret",
        "0123456789abcdef" * 2,  # 32 hex characters: 16 bytes
        "a" * 64,
        # The placeholder shipped in deploy/base/secret.example.yaml.
        "REPLACE-with-32-random-bytes-base64",
    ],
)
def test_fleet_mode_refuses_a_weak_or_placeholder_secret(secret: str) -> None:
    text = MINIMAL + f"redis: {{url: 'redis://127.0.0.1:1/0'}}\nsecret: '{secret}'\n"
    [problem] = problems(text)
    assert problem.startswith("secret: ")
    assert secret not in problem
    assert "head -c 32 /dev/urandom | base64" in problem


def test_the_shipped_placeholder_is_the_one_refused() -> None:
    import yaml

    root = Path(__file__).resolve().parents[2]
    docs = list(yaml.safe_load_all((root / "deploy/base/secret.example.yaml").read_text()))
    placeholder = docs[0]["stringData"]["gateway-secret"]
    text = MINIMAL + f"redis: {{url: 'redis://127.0.0.1:1/0'}}\nsecret: '{placeholder}'\n"
    assert "placeholder" in problems(text)[0]


def test_fleet_mode_accepts_32_random_bytes_as_generated_in_the_docs() -> None:
    import base64
    import os

    for secret in (base64.b64encode(os.urandom(32)).decode(), os.urandom(32).hex()):
        text = MINIMAL + f"redis: {{url: 'redis://127.0.0.1:1/0'}}\nsecret: '{secret}'\n"
        assert parse_config(text, "gw.yaml").redis is not None


def test_a_weak_secret_from_the_environment_is_refused_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUTHN_GATEWAY_SECRET", "short")
    [problem] = problems(MINIMAL + "redis: {url: 'redis://127.0.0.1:1/0'}\n")
    assert problem.startswith("secret (from AUTHN_GATEWAY_SECRET): too weak")


def test_a_disabled_admin_endpoint_needs_no_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AUTHN_GW_UNSET_ADMIN", raising=False)
    text = MINIMAL + "admin: {enabled: false, token: env:AUTHN_GW_UNSET_ADMIN}\n"
    assert parse_config(text, "gw.yaml").admin.token is None
    enabled = text.replace("enabled: false", "enabled: true")
    assert problems(enabled) == [
        "admin.token: environment variable AUTHN_GW_UNSET_ADMIN is not set"
    ]


def test_a_duplicate_yaml_key_names_both_lines() -> None:
    text = MINIMAL + "server: {port: 1}\nlogging: {}\nserver: {port: 2}\n"
    assert problems(text) == ["line 8: key 'server' given twice: at line 6 and line 8"]
