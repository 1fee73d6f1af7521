"""One credential, one id (issue 36), through a real gateway process and a real slapd:
the credential sent behind a stripped prefix and sent bare through the chain (the
backend is in both), and its name spelled another way, is logged under one token id,
and a denial of that id through the admin API refuses every one of them, before the
directory is asked."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from tests.support.credential_id_helpers import (
    SECRET,
    ldap_backend,
    ldap_token,
    other_trailing_bits,
)
from tests.support.procs import GatewayProcess, start_gateway
from tests.support.slapd import USERS, Slapd

ADMIN_TOKEN = "admin-test-only-Kd5Tq2Wx8Lm1Vr7Nb4Hs9Jc3Fg6Py0Ez"


@pytest.fixture(scope="module")
def directory(module_slapd: Slapd) -> Slapd:
    return module_slapd


def _review_ids(gw: GatewayProcess, count: int) -> list[str]:
    """The token ids of the first ``count`` review lines, once they are written (by the
    log's writer thread, a little after each answer)."""
    deadline = time.monotonic() + 10
    while True:
        lines = [line for line in gw.logs().splitlines() if "msg=review" in line]
        if len(lines) >= count or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert len(lines) >= count, lines
    return [line.split("token=")[1].split()[0] for line in lines[:count]]


def test_a_denied_token_id_refuses_the_credential_however_it_is_sent(
    directory: Slapd, service_password_file: Path, tmp_path: Path
) -> None:
    gw = start_gateway(
        {
            "secret": SECRET,
            "admin": {"enabled": True, "token": ADMIN_TOKEN},
            "logging": {"reviews": True},
            "backends": [
                ldap_backend(
                    directory, service_password_file, "corp",
                    prefix="s-", strip_prefix=True, in_chain=True,
                ),
            ],
        },
        tmp_path,
    )  # fmt: skip
    try:
        password = USERS["alice"].password
        bare = ldap_token("alice", password)
        sent = ["s-" + bare, bare, "s-" + ldap_token(" Alice", password), other_trailing_bits(bare)]
        for token in sent:
            status = gw.review(token).json()["status"]
            assert status["authenticated"] is True, (token, status)
            assert status["user"]["username"] == "alice"
        ids = set(_review_ids(gw, len(sent)))
        assert len(ids) == 1, ids  # the log shows one id for every way it was sent
        (token_id,) = ids

        denied = httpx.post(
            f"{gw.url}/admin/deny",
            json={"token_id": token_id, "seconds": 600, "by": "test"},
            headers={"authorization": f"Bearer {ADMIN_TOKEN}"},
        )
        assert denied.status_code == 200, denied.text
        binds = directory.operations("Bind")
        for token in sent:
            status = gw.review(token).json()["status"]
            assert status == {"authenticated": False}, (token, status)
        assert directory.operations("Bind") == binds  # refused before the directory was asked
        assert set(_review_ids(gw, 2 * len(sent))) == {token_id}
        assert gw.logs().count("denied by an operator") == len(sent)
        assert password not in gw.logs() and bare not in gw.logs()
    finally:
        gw.stop()
