"""The static token-file backend: CSV format, bad lines, reload on change."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from backends.base import Authenticated, Rejected
from backends.static import StaticBackend, StaticSettings, TokenFileError, parse_token_file


def settings(path: Path, **kw: object) -> StaticSettings:
    return StaticSettings.model_validate({"name": "s", "type": "static", "file": str(path), **kw})


def test_parses_kube_apiserver_token_file_format() -> None:
    text = '# comment\n\nt1,alice,1,"devs,ops"\nt2,bob,2\nt3,carol,3,single\n'
    entries = dict(parse_token_file(text, "tokens.csv"))
    assert entries["t1"].groups == ("devs", "ops")
    assert entries["t2"].username == "bob"
    assert entries["t2"].groups == ()
    assert entries["t3"].groups == ("single",)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("t1,alice\n", "tokens.csv:1: expected token,user,uid[,groups], got 2 fields"),
        ("ok,a,1\n,bob,2\n", "tokens.csv:2: empty token"),
        ("t1,,1\n", "tokens.csv:1: empty user name"),
        ("t1,a,1\n\nt1,b,2\n", "tokens.csv:3: duplicate token (user b), first at line 1"),
    ],
)
def test_bad_lines_name_file_and_line(text: str, message: str) -> None:
    with pytest.raises(TokenFileError) as err:
        parse_token_file(text, "tokens.csv")
    assert str(err.value) == message


def test_bad_line_errors_do_not_contain_the_token() -> None:
    with pytest.raises(TokenFileError) as err:
        parse_token_file("supersecret,a,1\nsupersecret,b,2\n", "f")
    assert "supersecret" not in str(err.value)


async def test_authenticates_and_rejects(tmp_path: Path) -> None:
    path = tmp_path / "tokens.csv"
    path.write_text('tok-a,alice,1,"g1,g2"\n')
    backend = StaticBackend(settings(path))
    outcome = await backend.authenticate("tok-a")
    assert isinstance(outcome, Authenticated)
    assert outcome.user.username == "alice"
    assert isinstance(await backend.authenticate("tok-b"), Rejected)
    # A prefix of a valid token is not valid.
    assert isinstance(await backend.authenticate("tok-"), Rejected)


def test_unreadable_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(TokenFileError, match=r"absent\.csv: cannot read"):
        StaticBackend(settings(tmp_path / "absent.csv"))


async def wait_until(check: object, timeout: float = 5.0) -> bool:
    for _ in range(int(timeout / 0.05)):
        if await check():  # type: ignore[operator]
            return True
        await asyncio.sleep(0.05)
    return False


async def test_reloads_when_the_file_changes(tmp_path: Path) -> None:
    path = tmp_path / "tokens.csv"
    path.write_text("old,alice,1\n")
    backend = StaticBackend(settings(path, reload_interval_seconds=0.05))
    await backend.start()
    try:
        path.write_text("new,bob,2\n")

        async def reloaded() -> bool:
            return isinstance(await backend.authenticate("new"), Authenticated)

        assert await wait_until(reloaded)
        assert isinstance(await backend.authenticate("old"), Rejected)
    finally:
        await backend.close()


async def test_broken_reload_keeps_previous_tokens_and_logs_the_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "tokens.csv"
    path.write_text("good,alice,1\n")
    backend = StaticBackend(settings(path, reload_interval_seconds=0.05))
    await backend.start()
    try:
        path.write_text("good,alice,1\nbroken-line\n")
        os.utime(path, None)

        async def logged() -> bool:
            return "tokens.csv:2" in caplog.text

        assert await wait_until(logged)
        assert isinstance(await backend.authenticate("good"), Authenticated)
    finally:
        await backend.close()
