"""Config validation: every error names the file and the field, and nothing starts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from authn_gateway.config import ConfigError, load_config, parse_config

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


# --- check-config passes if and only if serve would ------------------------------------


def _cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "authn_gateway", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def _one_clean_line(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    return result.stderr


STRONG = "test-only-Hn4Wq8zR2mK6vT1xB9cY3uL7aE5sD0fGjPiNbV"


@pytest.mark.parametrize(
    "server_or_redis, named",
    [
        ({"server": {"tls": {"cert_file": "{d}/absent.crt", "key_file": "{d}/k"}}}, "absent.crt"),
        ({"server": {"tls": {"cert_file": "{d}", "key_file": "{d}/k"}}}, "Is a directory"),
        ({"redis": {"url": "redis://127.0.0.1:notaport/0"}, "secret": STRONG}, "redis"),
        ({"server": {"audit_log": "{d}/nope/audit.jsonl"}}, "nope"),
    ],
    ids=["missing-cert", "directory-as-cert", "redis-port", "audit-log-dir"],
)
def test_check_config_and_serve_refuse_the_same_files(
    tmp_path: Path, server_or_redis: dict[str, object], named: str
) -> None:
    import yaml

    text = yaml.safe_dump(server_or_redis).replace("{d}", str(tmp_path))
    path = tmp_path / "gw.yaml"
    path.write_text(MINIMAL + text)
    checked = _one_clean_line(_cli("check-config", str(path)))
    served = _one_clean_line(_cli("serve", "--config", str(path), timeout=30))
    assert named in checked and named in served


def test_check_config_builds_the_tls_context_from_the_real_files(tmp_path: Path) -> None:
    from tests.support.pki import issue, make_ca

    ca = make_ca("server-ca")
    cert, key = issue(ca, "gw", server=True).write(tmp_path, "tls")
    other_cert, _ = issue(ca, "other", server=True).write(tmp_path, "other")
    good = tmp_path / "good.yaml"
    good.write_text(MINIMAL + f"server: {{tls: {{cert_file: {cert}, key_file: {key}}}}}\n")
    assert _cli("check-config", str(good)).returncode == 0
    bad = tmp_path / "bad.yaml"
    bad.write_text(MINIMAL + f"server: {{tls: {{cert_file: {other_cert}, key_file: {key}}}}}\n")
    assert "not a matching PEM certificate and key" in _one_clean_line(
        _cli("check-config", str(bad))
    )


# --- errors never echo secrets -----------------------------------------------------------


@pytest.mark.parametrize("value", ["*Hunter2SecretValue", "!Hunter2SecretValue x"])
def test_a_secret_that_yaml_misreads_is_never_printed(tmp_path: Path, value: str) -> None:
    path = tmp_path / "gw.yaml"
    path.write_text(MINIMAL + f"secret: {value}\n")
    for args in (
        ("check-config", str(path)),
        ("serve", "--config", str(path)),
        ("review", "--config", str(path), "some-token"),
    ):
        stderr = _one_clean_line(_cli(*args, timeout=30))
        assert "Hunter2" not in stderr, args
        assert "line 6" in stderr and "quote" in stderr


# --- secrets strong enough, and needed only when used ---------------------------------------


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

    root = Path(__file__).parent.parent
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


# --- duplicates name both places -----------------------------------------------------------


def test_a_duplicate_yaml_key_names_both_lines() -> None:
    text = MINIMAL + "server: {port: 1}\nlogging: {}\nserver: {port: 2}\n"
    assert problems(text) == ["line 8: key 'server' given twice: at line 6 and line 8"]


def test_a_static_token_inline_and_in_the_file_names_both_places(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.csv"
    tokens.write_text("# comment\nother,carol,3\nsame-token,bob,2\n")
    path = tmp_path / "gw.yaml"
    path.write_text(
        "backends:\n  - name: demo\n    type: static\n"
        f"    file: {tokens}\n    tokens: [{{token: same-token, username: u}}]\n"
    )
    stderr = _one_clean_line(_cli("check-config", str(path)))
    assert f"{tokens}:3: duplicate token (user bob), also at tokens[0]" in stderr
    assert "same-token" not in stderr


def test_two_equal_inline_static_tokens_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "gw.yaml"
    path.write_text(
        MINIMAL.replace(
            "[{token: t, username: u}]", "[{token: t, username: u}, {token: t, username: v}]"
        )
    )
    stderr = _one_clean_line(_cli("check-config", str(path)))
    assert "tokens[1]: duplicate token (user v), also at tokens[0]" in stderr


# --- bad input, one line, never a traceback ---------------------------------------------------


def test_a_config_that_is_not_utf8_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "gw.yaml"
    path.write_bytes(MINIMAL.encode() + b"# caf\xe9\n")
    assert f"{path}: not UTF-8 text" in _one_clean_line(_cli("check-config", str(path)))


@pytest.mark.parametrize(
    "port, message",
    [
        ("70000", "--port: Input should be less than or equal to 65535"),
        ("abc", "invalid int value"),
    ],
)
def test_a_bad_port_on_the_command_line_is_one_line(port: str, message: str) -> None:
    stderr = _one_clean_line(_cli("serve", "--port", port))
    assert message in stderr
    assert len(stderr.strip().splitlines()) == 1
