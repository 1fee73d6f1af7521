"""Config validation: every error names the file and the field, and nothing starts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from authn_gateway.config import BACKEND_TYPES, ConfigError, load_config, parse_config

MINIMAL = """
backends:
  - name: demo
    type: static
    tokens: [{token: t, username: u}]
"""


def problems(text: str) -> list[str]:
    with pytest.raises(ConfigError) as err:
        parse_config(text, "gw.yaml")
    assert str(err.value).startswith("gw.yaml: ")
    return err.value.problems


def test_embedded_default_is_valid() -> None:
    config = load_config(None)
    assert config.server.host == "127.0.0.1"
    assert [b.type for b in config.backends] == ["static"]


def test_reference_config_is_valid(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUTHN_GATEWAY_SECRET", "s")
    monkeypatch.setenv("AUTHN_GATEWAY_ADMIN_TOKEN", "a")
    monkeypatch.setenv("KEYSTONE_SERVICE_PASSWORD", "k")
    monkeypatch.setenv("INTROSPECTION_CLIENT_SECRET", "i")
    config = load_config(Path(__file__).parent.parent / "config" / "gateway.yaml")
    # Every backend type is documented in the reference config.
    assert {b.type for b in config.backends} == set(BACKEND_TYPES)


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
    secret_file.write_text("from-file\n")
    config = parse_config(MINIMAL + f"secret: file:{secret_file}\n", "gw.yaml")
    assert config.secret is not None
    assert config.secret.get_secret_value() == "from-file"
    monkeypatch.setenv("GW_SECRET", "from-env")
    config = parse_config(MINIMAL + "secret: env:GW_SECRET\n", "gw.yaml")
    assert config.secret is not None
    assert config.secret.get_secret_value() == "from-env"
    assert "from-env" not in repr(config)


def test_rates_accept_limits_notation() -> None:
    text = MINIMAL.replace("type: static", "type: static\n    bucket: {rate: 600/minute}")
    assert parse_config(text, "gw.yaml").backends[0].bucket.rate == 10.0


def test_check_config_command_exits_non_zero_with_located_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(MINIMAL + "review_deadline_seconds: -1\n")
    result = subprocess.run(
        [sys.executable, "-m", "authn_gateway", "check-config", str(bad)],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 1
    assert f"{bad}: review_deadline_seconds: Input should be greater than 0" in result.stderr


def test_check_config_accepts_a_good_file(tmp_path: Path) -> None:
    good = tmp_path / "good.yaml"
    good.write_text(MINIMAL)
    result = subprocess.run(
        [sys.executable, "-m", "authn_gateway", "check-config", str(good)],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    assert "demo (static)" in result.stdout


def test_serve_refuses_an_invalid_config(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("backends: nope\n")
    result = subprocess.run(
        [sys.executable, "-m", "authn_gateway", "serve", "--config", str(bad)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 1
    assert f"{bad}: backends: " in result.stderr


def test_missing_config_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(tmp_path / "absent.yaml")
    assert "absent.yaml: cannot read" in str(err.value)


def test_unreadable_token_file_is_a_config_error_naming_the_backend(tmp_path: Path) -> None:
    config = tmp_path / "gw.yaml"
    config.write_text(f"backends:\n  - {{name: s, type: static, file: {tmp_path}/none.csv}}\n")
    for command in (["check-config", str(config)], ["serve", "--config", str(config)]):
        result = subprocess.run(
            [sys.executable, "-m", "authn_gateway", *command],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert result.returncode == 1
        assert f"{config}: backends[0] (s): {tmp_path}/none.csv: cannot read" in result.stderr
        assert "Traceback" not in result.stderr


def test_unloadable_ca_bundle_is_a_config_error(tmp_path: Path) -> None:
    bad_ca = tmp_path / "ca.pem"
    bad_ca.write_text("not a certificate\n")
    config = tmp_path / "gw.yaml"
    config.write_text(
        "backends:\n  - {name: sso, type: userinfo, url: 'https://127.0.0.1:1/u', "
        f"tls: {{ca_file: {bad_ca}}}}}\n"
    )
    result = subprocess.run(
        [sys.executable, "-m", "authn_gateway", "check-config", str(config)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 1
    assert f"backends[0] (sso): tls.ca_file: cannot load {bad_ca}" in result.stderr


def test_breaker_failure_rate_is_optional_and_validated() -> None:
    assert parse_config(MINIMAL, "gw.yaml").backends[0].breaker.failure_rate is None
    text = MINIMAL.replace(
        "type: static", "type: static\n    breaker: {failure_rate: {threshold: 1.5}}"
    )
    assert problems(text) == [
        "backends[0].breaker.failure_rate.threshold: Input should be less than or equal to 1"
    ]
