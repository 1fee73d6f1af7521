"""Files the config names are read by one bounded reader (backends/files.py): a device,
a FIFO, a directory or a huge sparse file named by any path field is one line naming
the field and the file from check-config, never a hang or a traceback (and from a
reload: tests/unit/test_reloader.py); a watched file replaced by one at run time (the
static token file, the TLS files, the policy file, the deny list) is one log line, and
the old content stays in use. In process, with real files
(tests/support/hostile_files.py)."""

from __future__ import annotations

import asyncio
import io
import logging
import os
import ssl
from collections.abc import Callable
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from authn_gateway import cli
from authn_gateway.authorization.webhook import AuthorizationWebhook
from authn_gateway.config import TLSSettings
from authn_gateway.config.authorization import AuthorizationSettings
from authn_gateway.edge.tls import ServerTLS
from authn_gateway.observe.metrics import Metrics
from authn_gateway.revocation.memory import FileDenyStore
from backends import files
from backends.base import Authenticated
from backends.files import (
    CA_BUNDLE_BYTES,
    DENY_LIST_BYTES,
    PEM_BYTES,
    POLICY_BYTES,
    SECRET_BYTES,
    TOKEN_FILE_BYTES,
    FileRefused,
    read_file,
)
from backends.static import StaticBackend, StaticSettings
from tests.support.config_helpers import STRONG
from tests.support.hostile_files import KINDS, make_hostile, refusal, replace_with_hostile
from tests.support.pki import issue, make_ca

# A FIFO read the old way hangs for ever: such a test fails alone, and soon.
pytestmark = pytest.mark.timeout(60)

STATIC = {"type": "static", "name": "s", "tokens": [{"token": "t", "username": "u"}]}
USERINFO = {"type": "userinfo", "name": "ui", "url": "https://127.0.0.1:9/u"}
POLICY = [
    {
        "resource": {"verbs": ["get"], "resources": ["pods"], "version": "*", "namespace": "*"},
        "match": [{"type": "role", "values": ["member"]}],
    }
]


@dataclass
class Good:
    """Usable TLS files, for the fields a hostile one is not put in."""

    cert: Path
    key: Path
    ca: Path


@pytest.fixture
def good(tmp_path: Path) -> Good:
    ca = make_ca("files-ca")
    cert, key = issue(ca, "gw", server=True).write(tmp_path, "tls")
    ca_file = tmp_path / "ca.crt"
    ca_file.write_bytes(ca.cert_pem())
    return Good(cert, key, ca_file)


def _tls(**files: str) -> dict[str, Any]:
    return {"server": {"tls": files}}


#: Each path field: the bound of its kind, the document that names ``p`` in it (the
#: other files usable), and how its problem line starts before the file's name.
FIELDS: dict[str, tuple[int, Callable[[str, Good], dict[str, Any]], str]] = {
    "server.tls.cert_file": (
        PEM_BYTES,
        lambda p, g: _tls(cert_file=p, key_file=str(g.key)),
        "server.tls.cert_file: ",
    ),
    "server.tls.key_file": (
        PEM_BYTES,
        lambda p, g: _tls(cert_file=str(g.cert), key_file=p),
        "server.tls.key_file: ",
    ),
    "server.tls.client_ca_file": (
        CA_BUNDLE_BYTES,
        lambda p, g: _tls(cert_file=str(g.cert), key_file=str(g.key), client_ca_file=p),
        "server.tls.client_ca_file: ",
    ),
    "userinfo tls.ca_file": (
        CA_BUNDLE_BYTES,
        lambda p, g: {
            "backends": [
                STATIC,
                {
                    "type": "userinfo",
                    "name": "ui",
                    "url": "https://127.0.0.1:9/u",
                    "tls": {"ca_file": p},
                },
            ]
        },
        "backends[1] (ui): tls.ca_file: ",
    ),
    "ldap tls.ca_file": (
        CA_BUNDLE_BYTES,
        lambda p, g: {
            "backends": [
                STATIC,
                {
                    "type": "ldap",
                    "name": "dir",
                    "url": "ldaps://127.0.0.1:9",
                    "user_dn_template": "uid={username},dc=example",
                    "tls": {"ca_file": p},
                },
            ]
        },
        "backends[1] (dir): tls.ca_file: ",
    ),
    "static file": (
        TOKEN_FILE_BYTES,
        lambda p, g: {"backends": [{"type": "static", "name": "s", "file": p}]},
        "backends[0] (s): file: ",
    ),
    "authorization.keystone_policy_file": (
        POLICY_BYTES,
        lambda p, g: {"authorization": {"keystone_policy_file": p}},
        "authorization.keystone_policy_file: ",
    ),
    "secret file:": (SECRET_BYTES, lambda p, g: {"secret": f"file:{p}"}, "secret: secret file "),
    "deny_list.file": (
        DENY_LIST_BYTES,
        lambda p, g: {"deny_list": {"file": p}},
        "deny_list.file: ",
    ),
}


def check_config(path: Path) -> tuple[int, list[str]]:
    err, out = io.StringIO(), io.StringIO()
    with redirect_stderr(err), redirect_stdout(out):
        status = cli.main(["check-config", str(path)])
    assert "Traceback" not in err.getvalue()
    return status, err.getvalue().splitlines()


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("field", sorted(FIELDS))
def test_a_hostile_file_in_any_path_field_is_one_line_from_check_config(
    tmp_path: Path, good: Good, field: str, kind: str
) -> None:
    limit, document, prefix = FIELDS[field]
    hostile = make_hostile(kind, tmp_path / f"hostile-{kind}")
    doc = {"backends": [STATIC], **document(str(hostile), good)}
    path = tmp_path / "gw.yaml"
    path.write_text(yaml.safe_dump(doc))
    status, lines = check_config(path)
    assert status == 1
    assert lines == [
        "invalid configuration:",
        f"{path}: {prefix}{hostile}: {refusal(kind, limit)}",
    ]


def test_the_same_fields_with_usable_files_pass_check_config(tmp_path: Path, good: Good) -> None:
    """The documents above are refused for the hostile file alone."""
    usable = {
        "server.tls.cert_file": good.cert,
        "server.tls.key_file": good.key,
        "server.tls.client_ca_file": good.ca,
        "userinfo tls.ca_file": good.ca,
        "ldap tls.ca_file": good.ca,
        "authorization.keystone_policy_file": tmp_path / "policy.json",
        "static file": tmp_path / "tokens.csv",
        "secret file:": tmp_path / "secret",
        "deny_list.file": tmp_path / "deny.json",
    }
    usable["authorization.keystone_policy_file"].write_bytes(orjson.dumps(POLICY))
    usable["static file"].write_text("tok,user,1\n")
    usable["secret file:"].write_text(STRONG + "\n")
    usable["deny_list.file"].write_text('{"entries": []}')
    for field, (_, document, _) in FIELDS.items():
        path = tmp_path / "gw.yaml"
        path.write_text(
            yaml.safe_dump({"backends": [STATIC], **document(str(usable[field]), good)})
        )
        assert check_config(path) == (0, []), field


def test_an_encrypted_key_is_one_line_not_a_passphrase_prompt(tmp_path: Path, good: Good) -> None:
    from cryptography.hazmat.primitives import serialization

    key = serialization.load_pem_private_key(good.key.read_bytes(), password=None)
    encrypted = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"passphrase"),
    )
    good.key.write_bytes(encrypted)
    path = tmp_path / "gw.yaml"
    path.write_text(
        yaml.safe_dump(
            {"backends": [STATIC], **_tls(cert_file=str(good.cert), key_file=str(good.key))}
        )
    )
    status, lines = check_config(path)
    assert status == 1
    assert lines[1] == (
        f"{path}: server.tls.key_file: {good.key}: the private key is encrypted "
        "(a passphrase is not supported)"
    )


def test_a_ca_bundle_with_bytes_past_ascii_in_its_comments_is_read(
    tmp_path: Path, good: Good
) -> None:
    # ssl takes PEM as ASCII text only; certifi's bundle had such comments once.
    good.ca.write_bytes("# Főtanúsítvány\n".encode() + good.ca.read_bytes())
    path = tmp_path / "gw.yaml"
    tls = _tls(cert_file=str(good.cert), key_file=str(good.key), client_ca_file=str(good.ca))
    userinfo = {**USERINFO, "tls": {"ca_file": str(good.ca)}}
    path.write_text(yaml.safe_dump({"backends": [STATIC, userinfo], **tls}))
    assert check_config(path) == (0, [])


# -- the reader itself


def test_a_fifo_put_in_place_after_the_check_is_refused_without_blocking(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fifo = make_hostile("fifo", tmp_path / "fifo")
    # As if the file were swapped for the FIFO between the check and the open.
    monkeypatch.setattr(files, "check_file", lambda path, limit, pipes=False: None)
    with pytest.raises(FileRefused) as err:
        read_file(fifo, 1024)
    assert str(err.value) == f"{fifo}: a FIFO, not a regular file"


def test_a_file_at_its_bound_is_read_and_one_byte_more_is_not(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"x" * 100)
    assert read_file(path, 100) == b"x" * 100
    with pytest.raises(FileRefused, match=r"larger than 99 bytes$"):
        read_file(path, 99)


def test_a_file_that_holds_more_than_its_size_says_is_read_no_further_than_the_bound() -> None:
    # /proc files say 0 bytes and hold more.
    status = Path("/proc/self/status")
    assert os.stat(status).st_size == 0
    with pytest.raises(FileRefused, match=r"larger than 16 bytes$"):
        read_file(status, 16)


def test_a_name_with_a_line_break_is_said_on_one_line(tmp_path: Path) -> None:
    path = tmp_path / "a\nb"
    with pytest.raises(FileRefused) as err:
        read_file(path, 10)
    assert "\n" not in str(err.value) and "a\\nb" in str(err.value)


# -- run time: a watched file replaced


async def wait_for(check: Callable[[], bool], timeout: float = 5.0) -> None:
    for _ in range(int(timeout / 0.02)):
        if check():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("not within the timeout")


def messages(caplog: pytest.LogCaptureFixture, part: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if part in r.getMessage()]


@pytest.mark.parametrize("kind", KINDS)
async def test_a_token_file_replaced_by_a_hostile_one_keeps_the_tokens_with_one_line(
    tmp_path: Path, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "tokens.csv"
    path.write_text("tok-1,alice,1\n")
    settings = StaticSettings.model_validate(
        {"type": "static", "name": "s", "file": str(path), "reload_interval_seconds": 0.02}
    )
    backend = StaticBackend(settings)
    await backend.start()
    try:
        replace_with_hostile(kind, path)
        refused = "token file reload refused, keeping previous"
        await wait_for(lambda: bool(messages(caplog, refused)))
        await asyncio.sleep(0.1)  # more ticks: the same file is not refused again
        [line] = messages(caplog, refused)
        assert line.endswith(f"file: {path}: {refusal(kind, TOKEN_FILE_BYTES)}"), line
        assert isinstance(await backend.authenticate("tok-1"), Authenticated)
    finally:
        await backend.close()


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("which", ["cert_file", "key_file", "client_ca_file"])
def test_a_tls_file_replaced_by_a_hostile_one_keeps_the_context_with_one_line(
    good: Good, which: str, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    settings = TLSSettings(cert_file=good.cert, key_file=good.key, client_ca_file=good.ca)
    tls = ServerTLS(settings)
    before = tls.current()
    path = getattr(settings, which)
    replace_with_hostile(kind, path)
    with caplog.at_level(logging.ERROR):
        assert tls.reload_if_changed() is False
    assert tls.current() is before
    assert isinstance(before, ssl.SSLContext)
    limit = CA_BUNDLE_BYTES if which == "client_ca_file" else PEM_BYTES
    assert messages(caplog, "TLS reload failed") == [
        "TLS reload failed, still serving the previous certificate and CA: "
        f"tls.{which}: {path}: {refusal(kind, limit)}"
    ]


@pytest.mark.parametrize("kind", KINDS)
def test_a_policy_file_replaced_by_a_hostile_one_keeps_the_policy_with_one_line(
    tmp_path: Path, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "policy.json"
    path.write_bytes(orjson.dumps(POLICY))
    settings = AuthorizationSettings.model_validate({"keystone_policy_file": str(path)})
    source = AuthorizationWebhook(settings, Metrics()).source
    policy = source.policy
    assert policy is not None and source.error is None
    replace_with_hostile(kind, path)
    with caplog.at_level(logging.ERROR):
        assert source.check() is False
        assert source.check() is False  # the same file again: no second line
    assert source.policy is policy
    assert messages(caplog, "policy refused") == [
        "authorization: policy refused, keeping the policy in force: "
        f"{path}: {refusal(kind, POLICY_BYTES)}"
    ]


@pytest.mark.parametrize("kind", ["device", "fifo", "huge"])
async def test_a_deny_list_replaced_by_a_hostile_file_keeps_its_entries_with_a_line(
    tmp_path: Path, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "deny.json"
    path.write_text('{"entries": []}')
    store = FileDenyStore(path)
    assert await store.load() == {}
    replace_with_hostile(kind, path)
    with caplog.at_level(logging.ERROR):
        assert await store.load() is None
    assert messages(caplog, "deny list") == [
        f"deny list: {path}: {refusal(kind, DENY_LIST_BYTES)}; keeping the entries already loaded"
    ]
