"""No command ends in a traceback (issue 36): an error building the gateway, in
``review``, ``check-config`` or ``serve``, is one line and a non-zero exit, by type and
place when it is a bug of ours, never with its message (which may quote the config or a
secret); ``admin``'s own arguments (its token file, CA file, URL, timeout, names) are one
line each too, never echoing the token. In process, through ``cli.main``."""

from __future__ import annotations

import argparse
import io
import os
import re
from collections.abc import Iterator
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

import pytest
import yaml

from authn_gateway import cli
from authn_gateway.config import load_config
from authn_gateway.serve import server
from backends.files import CA_BUNDLE_BYTES
from backends.static import StaticBackend, StaticSettings
from tests.support.config_helpers import MINIMAL, STRONG
from tests.support.hostile_files import make_hostile, refusal

pytestmark = pytest.mark.timeout(60)

#: A message a bug might carry: a config value or a secret, never to be printed.
LEAK = "leaked-secret-Zq9sEcReT"
UNEXPECTED = re.compile(r"unexpected RuntimeError at \w+\.py:\d+ \(please report this\)$")


def run(*argv: str, stdin: io.TextIOBase | None = None) -> tuple[int, list[str], str]:
    """``authn-gateway ARGV``: its exit status, its stderr lines and its stdout."""
    err, out = io.StringIO(), io.StringIO()
    old_stdin = cli.sys.stdin
    if stdin is not None:
        cli.sys.stdin = stdin  # type: ignore[assignment]
    try:
        with redirect_stderr(err), redirect_stdout(out):
            status = cli.main(list(argv))
    finally:
        cli.sys.stdin = old_stdin
    assert "Traceback" not in err.getvalue() and LEAK not in err.getvalue() + out.getvalue()
    return status, err.getvalue().splitlines(), out.getvalue()


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "gw.yaml"
    path.write_text(MINIMAL)
    return path


def _raise(*_: Any, **__: Any) -> Any:
    raise RuntimeError(f"cannot build: {LEAK}")


async def _raise_async(*_: Any, **__: Any) -> Any:
    raise RuntimeError(f"cannot start: {LEAK}")


@pytest.fixture
def build_raises(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(StaticSettings, "build", _raise)
    yield


def test_review_with_a_backend_whose_build_raises_is_one_line(
    config: Path, build_raises: None
) -> None:
    status, lines, out = run("review", "--config", str(config), "t")
    assert status == 1 and out == ""
    [line] = lines
    assert line.startswith(f"{config}: cannot review: ") and UNEXPECTED.search(line), line


def test_review_with_a_backend_whose_start_raises_is_one_line(
    config: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(StaticBackend, "start", _raise_async)
    status, [line], _ = run("review", "--config", str(config), "t")
    assert status == 1
    assert line.startswith(f"{config}: cannot review: ") and UNEXPECTED.search(line), line


def test_check_config_with_a_backend_whose_build_raises_is_one_line(
    config: Path, build_raises: None
) -> None:
    status, lines, _ = run("check-config", str(config))
    assert status == 1
    head, line = lines
    assert head == "invalid configuration:"
    assert line.startswith(f"{config}: cannot be checked: ") and UNEXPECTED.search(line), line


def test_serve_with_a_backend_whose_build_raises_stops_with_one_line(
    config: Path, build_raises: None, caplog: pytest.LogCaptureFixture
) -> None:
    # What serve runs once the config is loaded; it stops before binding the port.
    assert server._run_process(load_config(config), config, 0) == 1
    [line] = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert line.startswith("the gateway stopped: ") and UNEXPECTED.search(line), line
    assert not any(r.exc_info for r in caplog.records)


def test_serve_with_a_tls_file_that_is_not_pem_stops_with_the_line_check_config_gives(
    tmp_path: Path, config: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cert = tmp_path / "tls.crt"
    cert.write_text("not a certificate\n")
    tls = {"cert_file": str(cert), "key_file": str(cert)}
    config.write_text(MINIMAL + yaml.safe_dump({"server": {"tls": tls}}))
    expected = f"{config}: server.tls.cert_file: {cert}: holds no PEM certificate"
    assert run("check-config", str(config))[1] == ["invalid configuration:", expected]
    assert server._run_process(load_config(config), config, 0) == 1
    assert [r.getMessage() for r in caplog.records if r.levelname == "ERROR"] == [expected]


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"garbage\n", "holds no PEM certificate"),
        (b"", "holds no PEM certificate"),
        (
            b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
            "not a PEM CA bundle (",
        ),
    ],
    ids=["garbage", "empty", "broken-pem"],
)
def test_review_with_a_ca_bundle_that_is_garbage_is_one_line(
    tmp_path: Path, config: Path, content: bytes, problem: str
) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_bytes(content)
    userinfo = {"type": "userinfo", "name": "ui", "url": "https://127.0.0.1:9/u"}
    doc = yaml.safe_load(MINIMAL)
    doc["backends"].append({**userinfo, "tls": {"ca_file": str(ca)}})
    config.write_text(yaml.safe_dump(doc))
    status, lines, _ = run("review", "--config", str(config), "t")
    assert status == 1
    head, line = lines
    assert head == "invalid configuration:"
    assert line.startswith(f"{config}: backends[1] (ui): tls.ca_file: {ca}: {problem}"), line


def test_review_refuses_a_token_on_stdin_past_the_bound_without_holding_it(
    config: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cli, "MAX_TOKEN_BYTES", 64)
    status, lines, _ = run("review", "--config", str(config), stdin=io.StringIO("x" * 65 + "\n"))
    assert (status, lines) == (2, ["the token on stdin is longer than 64 characters"])
    status, _, out = run("review", "--config", str(config), stdin=io.StringIO("t" + "\n"))
    assert status == 0 and '"authenticated": true' in out


def test_review_of_a_token_on_stdin_that_is_not_utf8_is_one_line(config: Path) -> None:
    stdin = io.TextIOWrapper(io.BytesIO(b"\xff\xfe\n"), encoding="utf-8", errors="strict")
    status, lines, _ = run("review", "--config", str(config), stdin=stdin)
    assert (status, lines) == (2, ["the token on stdin is not UTF-8 text"])


# -- admin: its own arguments


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "admin-token"
    path.write_text(STRONG + "\n")
    return path


#: An address nothing listens on (the discard port, on loopback).
NOWHERE = "http://127.0.0.1:9"


def admin(*argv: str) -> tuple[int, list[str]]:
    status, lines, _ = run("admin", *argv)
    return status, lines


@pytest.mark.parametrize("kind", ["device", "fifo", "directory", "huge"])
def test_admin_with_a_hostile_ca_file_is_one_line(
    tmp_path: Path, token_file: Path, kind: str
) -> None:
    ca = make_hostile(kind, tmp_path / "ca")
    status, lines = admin("--token-file", str(token_file), "--ca-file", str(ca), "breakers")
    assert (status, lines) == (2, [f"--ca-file: {ca}: {refusal(kind, CA_BUNDLE_BYTES)}"])


def test_admin_with_a_ca_file_that_is_garbage_is_one_line(tmp_path: Path, token_file: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("garbage\n")
    status, lines = admin("--token-file", str(token_file), "--ca-file", str(ca), "breakers")
    assert (status, lines) == (2, [f"--ca-file: {ca}: holds no PEM certificate"])


@pytest.mark.parametrize(
    ("url", "problem"),
    [("http://[::1", "is not a URL"), ("ftp://x", "is not an http:// or https:// URL")],
)
def test_admin_with_a_url_it_cannot_send_to_is_one_line(
    token_file: Path, url: str, problem: str
) -> None:
    status, lines = admin("--url", url, "--token-file", str(token_file), "breakers")
    assert (status, lines) == (2, [f"--url: {url} {problem}"])


@pytest.mark.parametrize("timeout", ["nan", "inf", "-1", "0", "1e400"])
def test_admin_with_a_timeout_no_socket_takes_is_one_line(token_file: Path, timeout: str) -> None:
    err = io.StringIO()
    with redirect_stderr(err), pytest.raises(SystemExit) as exit_:
        cli.main(["admin", "--timeout", timeout, "--token-file", str(token_file), "breakers"])
    assert exit_.value.code == 1
    assert err.getvalue().splitlines() == [
        "authn-gateway admin: argument --timeout: must be above 0 and at most 300 seconds "
        "(see --help)"
    ]


def usage_error(argv: list[str]) -> list[str]:
    """The lines argparse prints for ``argv`` (exit status 1, no traceback)."""
    err = io.StringIO()
    with redirect_stderr(err), pytest.raises(SystemExit) as exit_:
        cli.main(argv)
    assert exit_.value.code == 1
    assert "Traceback" not in err.getvalue()
    return err.getvalue().splitlines()


HUGE = "99999999999999999999999999"


@pytest.mark.parametrize(
    ("argv", "flag", "problem"),
    [
        # --seconds 99999999999999999999999999 was "unexpected TypeError at
        # admin_cli.py:232" once the request was encoded.
        (["deny", "--user", "a", "--seconds"], "--seconds", "of seconds from 1 to 31622400"),
        (["deny", "--token-id", "ab", "--seconds"], "--seconds", "of seconds from 1 to 31622400"),
        (["force-open", "b", "--seconds"], "--seconds", "of seconds from 1 to 2592000"),
        (["force-closed", "b", "--seconds"], "--seconds", "of seconds from 1 to 2592000"),
    ],
)
@pytest.mark.parametrize("value", [HUGE, "-1", "0", "1.5", "nan", "inf", "1e3", "9" * 5000, "x"])
def test_every_admin_number_is_bounded_in_one_line_naming_its_flag(
    token_file: Path, argv: list[str], flag: str, problem: str, value: str
) -> None:
    command = ["admin", "--url", NOWHERE, "--token-file", str(token_file), *argv, value]
    [line] = usage_error(command)
    prog = f"authn-gateway admin {argv[0]}"
    assert line == f"{prog}: argument {flag}: must be a whole number {problem} (see --help)"


@pytest.mark.parametrize("value", [HUGE, "-1", "65536", "80.5", "nan", "9" * 5000, "x"])
def test_serve_port_is_bounded_in_one_line_naming_it(value: str) -> None:
    [line] = usage_error(["serve", "--port", value])
    assert line == (
        "authn-gateway serve: argument --port: must be a whole number from 0 to 65535 (see --help)"
    )


def test_every_numeric_flag_of_every_command_is_a_bounded_type() -> None:
    # review and check-config have none; serve and admin have theirs above.
    found = []

    def walk(parser: argparse.ArgumentParser, name: str) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub, child in action.choices.items():
                    walk(child, f"{name} {sub}")
            elif action.type in (int, float):
                found.append(f"{name} {action.option_strings}")

    walk(cli._parser(), "authn-gateway")
    assert found == []


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (f"tök-{LEAK}".encode(), "the admin token ({where}) is not printable ASCII without spaces"),
        (b"\xff" + LEAK.encode(), "--token-file: {path}: not UTF-8 text (byte 0)"),
    ],
    ids=["not-ascii", "not-utf8"],
)
def test_admin_with_a_token_no_header_takes_is_one_line_without_it(
    tmp_path: Path, content: bytes, problem: str
) -> None:
    path = tmp_path / "admin-token"
    path.write_bytes(content)
    status, lines = admin("--url", NOWHERE, "--token-file", str(path), "breakers")
    where = f"--token-file {path}"
    assert (status, lines) == (2, [problem.format(where=where, path=path)])


@pytest.mark.parametrize("kind", ["device", "directory", "huge"])
def test_admin_with_a_hostile_token_file_is_one_line(tmp_path: Path, kind: str) -> None:
    path = make_hostile(kind, tmp_path / "admin-token")
    status, lines = admin("--url", NOWHERE, "--token-file", str(path), "breakers")
    assert status == 2
    assert lines == [f"--token-file: {path}: {refusal(kind, 64 * 1024)}"]


def test_admin_reads_its_token_from_a_pipe_and_a_fifo_nobody_writes_is_no_token(
    tmp_path: Path,
) -> None:
    read_end, write_end = os.pipe()
    os.write(write_end, STRONG.encode() + b"\n")
    os.close(write_end)
    try:
        # As --token-file <(kubectl get secret ...) passes it: the token is read (and the
        # request then fails to connect).
        status, [line] = admin("--url", NOWHERE, "--token-file", f"/dev/fd/{read_end}", "breakers")
    finally:
        os.close(read_end)
    assert status == 1 and line.startswith(f"cannot reach the gateway at {NOWHERE}: "), line
    fifo = make_hostile("fifo", tmp_path / "fifo")
    status, lines = admin("--url", NOWHERE, "--token-file", str(fifo), "breakers")
    assert (status, lines) == (
        2,
        ["no admin token: use --token-file FILE or set AUTHN_GATEWAY_ADMIN_TOKEN"],
    )


@pytest.mark.parametrize(
    ("argv", "problem"),
    [
        (["force-open", "\udcff"], "BACKEND: not UTF-8 text"),
        (["evict", "--user", "a\udcffb"], "--user: not UTF-8 text"),
        (["--as", "\udcff", "breakers"], "--as: not UTF-8 text"),
    ],
)
def test_admin_with_a_name_that_is_not_utf8_is_one_line(
    token_file: Path, argv: list[str], problem: str
) -> None:
    # An argument's bytes that are not UTF-8 arrive as lone surrogates.
    status, lines = admin("--url", NOWHERE, "--token-file", str(token_file), *argv)
    assert (status, lines) == (2, [problem])
