"""SIGHUP with a file no loader can take (nested 5,000 deep, a 5,001-digit integer, an
alias bomb, an infinite duration) is refused in one line, counted, and the running
config keeps serving; the next SIGHUP with a valid file applies (issue 36, item 3).
check-config says the same of the same files, as "invalid configuration", exit 1."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
import yaml

from authn_gateway.config.loading import MAX_PROBLEMS
from authn_gateway.config.safe_yaml import MAX_BYTES
from tests.support.hostile_files import make_hostile, refusal, replace_with_hostile
from tests.support.procs import GatewayProcess
from tests.support.reload_helpers import REFUSED, authenticated, reload_with, reloads

STATIC = {"name": "demo", "type": "static", "tokens": [{"token": "tok-1", "username": "alice"}]}

HOSTILE = {
    "nested": "[" * 5000 + "]" * 5000,
    "huge-integer": "review_deadline_seconds: " + "1" * 5001 + "\n",
    "alias-bomb": "l0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n"
    + "".join(f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 9) + "]\n" for i in range(1, 10)),
    "infinite-grace": "server: {graceful_shutdown_seconds: .inf}\n",
    "infinite-stale": "cache: {keep_stale_seconds: .inf}\n",
}


#: The one problem check-config and the reload name for each.
EXPECTED = {
    "nested": "nested more than 64 levels deep",
    "huge-integer": "review_deadline_seconds: Input should be a finite number",
    "alias-bomb": "expands to more than 200000 nodes (an alias counts as a copy of its anchor)",
    "infinite-grace": "server.graceful_shutdown_seconds: Input should be a finite number",
    "infinite-stale": "cache.keep_stale_seconds: Input should be a finite number",
}


def config_text(token: str, extra: str = "") -> str:
    """A valid file with one static token, and ``extra`` after it. Without ``server:``:
    a reload keeps the listeners' settings as they run."""
    backend = {**STATIC, "tokens": [{"token": token, "username": "alice"}]}
    return yaml.safe_dump({"backends": [backend]}) + extra


def test_a_reload_with_a_hostile_file_is_refused_in_one_line_and_the_next_applies(
    gateway_factory: Callable[..., GatewayProcess],
) -> None:
    gw = gateway_factory({"backends": [STATIC]})
    assert authenticated(gw, "tok-1") == "alice"
    for i, (name, text) in enumerate(HOSTILE.items(), start=1):
        # The hostile part is added to a valid file: the refusal is the hostile part's.
        done = reload_with(gw, text if name == "nested" else config_text("tok-x", text))
        assert not done.applied, (name, done.logs)
        assert done.logs.count(REFUSED) == 1, (name, done.logs)
        [line] = [ln for ln in done.logs.splitlines() if REFUSED in ln]
        assert f"{gw.config_path}: " in line and line.endswith(EXPECTED[name]), line
        assert "Traceback" not in done.logs and "Task exception" not in done.logs, done.logs
        assert "1" * 20 not in done.logs
        assert reloads(gw, "refused") == i
        assert authenticated(gw, "tok-1") == "alice", name
        assert authenticated(gw, "tok-x") is None, name
    done = reload_with(gw, config_text("tok-2"))
    assert done.applied, done.logs
    assert reloads(gw, "applied") == 1
    assert authenticated(gw, "tok-2") == "alice"
    assert authenticated(gw, "tok-1") is None
    assert gw.proc.poll() is None


def check_config(path: Path) -> subprocess.CompletedProcess[str]:
    """``authn-gateway check-config PATH``; the timeout is a hang's guard (a FIFO)."""
    return subprocess.run(
        [sys.executable, "-m", "authn_gateway", "check-config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_check_config_says_invalid_configuration_of_the_same_files(
    tmp_path: Path, name: str
) -> None:
    path = tmp_path / f"{name}.yaml"
    path.write_text(HOSTILE[name] if name == "nested" else config_text("tok-1", HOSTILE[name]))
    result = check_config(path)
    assert result.returncode == 1, result
    head, *lines = result.stderr.splitlines()
    assert head == "invalid configuration:"
    assert len(lines) == 1 and lines[0].startswith(f"{path}: "), result.stderr
    assert "Traceback" not in result.stderr
    assert lines[0].endswith(EXPECTED[name]), lines


@pytest.mark.parametrize("kind", ["fifo", "device", "directory"])
def test_check_config_on_a_file_that_is_not_regular_is_one_line(tmp_path: Path, kind: str) -> None:
    # A FIFO with no writer hung check-config in open(); the timeout is the hang's guard.
    path = make_hostile(kind, tmp_path / "gw.yaml")
    result = check_config(path)
    assert result.returncode == 1, result
    assert result.stderr.splitlines() == [
        "invalid configuration:",
        f"{path}: {refusal(kind, MAX_BYTES)}",
    ]


def test_a_sighup_with_the_config_replaced_by_a_fifo_is_refused_and_the_gateway_serves(
    gateway_factory: Callable[..., GatewayProcess],
) -> None:
    # The reload opened the FIFO on the event loop and waited there for a writer:
    # /healthz and every review timed out from the signal on.
    gw = gateway_factory({"backends": [STATIC]})
    valid = gw.config_path.read_text()
    before = gw.logs()
    replace_with_hostile("fifo", gw.config_path)
    gw.proc.send_signal(signal.SIGHUP)
    logs = gw.wait_for_log(REFUSED, timeout=30)[len(before) :]
    assert httpx.get(f"{gw.url}/healthz", timeout=10).status_code == 200
    assert authenticated(gw, "tok-1") == "alice"
    [line] = [ln for ln in logs.splitlines() if REFUSED in ln]
    assert line.endswith(f"{gw.config_path}: a FIFO, not a regular file"), line
    assert reloads(gw, "refused") == 1
    gw.config_path.unlink()
    done = reload_with(gw, valid)
    assert done.applied, done.logs
    assert authenticated(gw, "tok-1") == "alice"


#: 100,000 invalid items: each its own problem, of which the first 50 are said.
MANY_PROBLEMS = "audiences: [" + ",".join(["1"] * 100_000) + "]\n"


def test_a_file_of_100k_problems_is_51_lines_from_check_config_and_on_reload(
    gateway_factory: Callable[..., GatewayProcess], tmp_path: Path
) -> None:
    # It was 100,000 lines (and aliases expanding to 480,000 items, 480,004 lines).
    path = tmp_path / "many.yaml"
    path.write_text(config_text("tok-1", MANY_PROBLEMS))
    result = subprocess.run(
        [sys.executable, "-m", "authn_gateway", "check-config", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1, result.stderr[-500:]
    head, *lines = result.stderr.splitlines()
    assert head == "invalid configuration:"
    assert len(lines) == MAX_PROBLEMS + 1, len(lines)
    assert lines[0] == f"{path}: audiences[0]: Input should be a valid string"
    assert lines[-1] == f"{path}: ... and {100_000 - MAX_PROBLEMS} more problems"

    gw = gateway_factory({"backends": [STATIC]})
    done = reload_with(gw, config_text("tok-x", MANY_PROBLEMS), timeout=60)
    assert not done.applied
    [line] = [ln for ln in done.logs.splitlines() if REFUSED in ln]
    assert line.count(f"{gw.config_path}: audiences[") == MAX_PROBLEMS, len(line)
    assert line.endswith(f"{gw.config_path}: ... and {100_000 - MAX_PROBLEMS} more problems")
    assert reloads(gw, "refused") == 1
    assert authenticated(gw, "tok-1") == "alice"
