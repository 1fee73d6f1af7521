"""Config validation: every error names the file and the field, and nothing starts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from backends.files import CA_BUNDLE_BYTES
from tests.support.config_helpers import MINIMAL, STRONG
from tests.support.hostile_files import make_hostile, refusal


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
        assert f"{config}: backends[0] (s): file: {tmp_path}/none.csv: cannot read" in result.stderr
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
    assert f"backends[0] (sso): tls.ca_file: {bad_ca}: holds no PEM certificate" in result.stderr


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


@pytest.mark.parametrize(
    "server_or_redis, named",
    [
        ({"server": {"tls": {"cert_file": "{d}/absent.crt", "key_file": "{d}/k"}}}, "absent.crt"),
        ({"server": {"tls": {"cert_file": "{d}", "key_file": "{d}/k"}}}, "a directory"),
        ({"redis": {"url": "redis://127.0.0.1:notaport/0"}, "secret": STRONG}, "redis"),
        ({"server": {"audit_log": "{d}/nope/audit.jsonl"}}, "nope"),
        ({"server": {"tls": {"cert_file": "{d}/gw.yaml", "key_file": "{d}/gw.yaml"}}}, "no PEM"),
    ],
    ids=["missing-cert", "directory-as-cert", "redis-port", "audit-log-dir", "cert-not-pem"],
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


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_a_ca_file_that_never_ends_is_one_line_from_check_config_and_serve(
    tmp_path: Path, kind: str
) -> None:
    """A FIFO with no writer, or /dev/zero, as a CA bundle hung both once."""
    ca_file = make_hostile(kind, tmp_path / "ca.pem")
    path = tmp_path / "gw.yaml"
    backend = {"name": "ui", "type": "userinfo", "url": "https://127.0.0.1:9/u"}
    path.write_text(
        MINIMAL
        + "  - "
        + orjson.dumps({**backend, "tls": {"ca_file": str(ca_file)}}).decode()
        + "\n"
    )
    line = f"{path}: backends[1] (ui): tls.ca_file: {ca_file}: {refusal(kind, CA_BUNDLE_BYTES)}"
    for command in (["check-config", str(path)], ["serve", "--config", str(path)]):
        assert line in _one_clean_line(_cli(*command, timeout=30)), command


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


def test_a_config_that_is_not_utf8_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "gw.yaml"
    path.write_bytes(MINIMAL.encode() + b"# caf\xe9\n")
    assert f"{path}: not UTF-8 text" in _one_clean_line(_cli("check-config", str(path)))


@pytest.mark.parametrize(
    "port, message",
    [
        ("70000", "argument --port: must be a whole number from 0 to 65535"),
        ("abc", "argument --port: must be a whole number from 0 to 65535"),
    ],
)
def test_a_bad_port_on_the_command_line_is_one_line(port: str, message: str) -> None:
    stderr = _one_clean_line(_cli("serve", "--port", port))
    assert message in stderr
    assert len(stderr.strip().splitlines()) == 1
