"""A reload (SIGHUP) that fails for any reason is refused, logged in one line, counted,
and the running config keeps serving; the next reload is handled as this one was
(issue 36, item 3), and so is one naming a file no reader may open (a FIFO, /dev/zero).
In process, over a real gateway of the static backend; the process tier sends the
signal (tests/process/test_config_reload.py)."""

from __future__ import annotations

import asyncio
import base64
import logging
import os
import re
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import yaml

from authn_gateway.config import GatewayConfig, load_config
from authn_gateway.serve import reloader as reloader_module
from authn_gateway.serve.app import GatewayApp
from authn_gateway.serve.gateway import Gateway
from authn_gateway.serve.generation import Generation
from authn_gateway.serve.reloader import Reloader
from backends.files import CA_BUNDLE_BYTES
from tests.support.config_helpers import MINIMAL
from tests.support.hostile_files import KINDS, make_hostile, refusal, replace_with_hostile

REFUSED = "config reload refused, still serving the previous config: "


@pytest.fixture
async def reloader(tmp_path: Path) -> AsyncIterator[Reloader]:
    path = tmp_path / "gw.yaml"
    path.write_text(MINIMAL)
    config = load_config(path)
    app = GatewayApp(Gateway(config, source=str(path)))
    await app.generation.start()
    yield Reloader(app, path, config)
    await app.generation.close()


def reloads(r: Reloader, result: str) -> float:
    value = r.app.gateway.metrics.registry.get_sample_value(
        "authn_gateway_config_reloads_total", {"result": result}
    )
    return value or 0.0


def last_successful(r: Reloader) -> float | None:
    registry = r.app.gateway.metrics.registry
    return registry.get_sample_value("authn_gateway_config_last_reload_successful")


def refusals(caplog: pytest.LogCaptureFixture) -> list[str]:
    lines = [
        rec.getMessage() for rec in caplog.records if "config reload refused" in rec.getMessage()
    ]
    assert all("\n" not in line for line in lines), lines
    return lines


async def verdict_of(r: Reloader, token: str) -> str:
    verdict = await r.app.gateway.pipeline.review(token, (), caller="test")
    return type(verdict.outcome).__name__


async def test_a_file_nested_5000_deep_is_refused_then_a_valid_one_applies(
    reloader: Reloader, caplog: pytest.LogCaptureFixture
) -> None:
    assert last_successful(reloader) == 1
    running = reloader.app.generation
    assert reloader.source is not None
    reloader.source.write_text("[" * 5000 + "]" * 5000)
    with caplog.at_level(logging.INFO):
        assert await reloader.reload() is False
    [line] = refusals(caplog)
    # The column is where the scanner stopped: libyaml's reads ahead to its own bound.
    where = f"{re.escape(REFUSED)}{reloader.source}: line 1, column \\d+: "
    assert re.fullmatch(where + "nested more than 64 levels deep", line), line
    assert reloads(reloader, "refused") == 1
    assert last_successful(reloader) == 0
    assert reloader.app.generation is running
    assert await verdict_of(reloader, "t") == "Authenticated"

    reloader.source.write_text(MINIMAL.replace("token: t,", "token: t2,"))
    assert await reloader.reload() is True
    assert reloads(reloader, "applied") == 1
    assert last_successful(reloader) == 1
    assert reloader.app.generation is not running
    assert await verdict_of(reloader, "t2") == "Authenticated"
    assert await verdict_of(reloader, "t") == "Rejected"


async def test_an_unexpected_exception_while_loading_is_refused_in_one_line(
    reloader: Reloader, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(path: Path | None) -> None:
        raise RecursionError("maximum recursion depth exceeded, near 'Zq9sEcReT'")

    monkeypatch.setattr(reloader_module, "load_config", broken)
    assert await reloader.reload() is False
    assert await reloader.reload() is False  # and again: nothing was left locked or broken
    lines = refusals(caplog)
    assert len(lines) == 2
    assert lines[0].startswith(f"{REFUSED}{reloader.source}: unexpected RecursionError at "), lines
    assert "Zq9sEcReT" not in caplog.text
    assert reloads(reloader, "refused") == 2
    monkeypatch.undo()
    assert await reloader.reload() is True


async def test_a_generation_that_fails_to_start_is_refused_and_closed(
    reloader: Reloader, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    running = reloader.app.generation
    started: list[Generation] = []
    closed: list[Generation] = []
    real_close = Generation.close

    async def failing_start(self: Generation) -> None:
        started.append(self)
        raise OverflowError("cannot convert float infinity to integer")

    async def counted_close(self: Generation) -> None:
        closed.append(self)
        await real_close(self)

    monkeypatch.setattr(Generation, "start", failing_start)
    monkeypatch.setattr(Generation, "close", counted_close)
    assert await reloader.reload() is False
    [line] = refusals(caplog)
    assert f"{reloader.source}: unexpected OverflowError at " in line
    assert closed == started and len(started) == 1
    assert reloader.app.generation is running
    assert await verdict_of(reloader, "t") == "Authenticated"
    assert reloads(reloader, "refused") == 1
    assert reloads(reloader, "applied") == 0


def test_the_first_caller_token_on_a_tls_port_warns_that_it_needs_a_restart(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # With mutual TLS, the handshake requires a certificate unless caller tokens were
    # configured at start: a reload that adds the first one cannot let a token-only
    # kube-apiserver connect (tried, issue 37), so it says so.
    tls = {"cert_file": "/tls/a.crt", "key_file": "/tls/a.key", "client_ca_file": "/tls/ca.crt"}
    backends = [{"name": "s", "type": "static", "tokens": [{"token": "t", "username": "u"}]}]
    token = {"name": "dev-apiserver", "token": base64.b64encode(os.urandom(32)).decode()}

    def config(**server: object) -> GatewayConfig:
        return GatewayConfig.model_validate({"server": server, "backends": backends})

    def warnings(before: GatewayConfig, after: GatewayConfig) -> list[str]:
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            Reloader(None, None, before)._keep_listeners(after)  # type: ignore[arg-type]
        return [r.getMessage() for r in caplog.records if "caller_tokens" in r.getMessage()]

    with_tls, plain = config(tls=tls), config()
    [added] = warnings(with_tls, config(tls=tls, caller_tokens=[token]))
    assert added == (
        "config reload: server.caller_tokens added; whether a caller may connect without a "
        "client certificate changes on restart only"
    )
    assert token["token"] not in added
    assert warnings(config(tls=tls, caller_tokens=[token]), with_tls)  # removed
    # Another token beside the first, or tokens on a plain port: nothing to say.
    other = {"name": "ci-apiserver", "token": base64.b64encode(os.urandom(32)).decode()}
    assert (
        warnings(
            config(tls=tls, caller_tokens=[token]), config(tls=tls, caller_tokens=[token, other])
        )
        == []
    )
    assert warnings(plain, config(caller_tokens=[token])) == []


@pytest.mark.parametrize("kind", KINDS)
async def test_a_file_naming_a_hostile_ca_file_is_refused_in_one_line_naming_the_field(
    reloader: Reloader, tmp_path: Path, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    # A FIFO or /dev/zero read the old way hung the reload, and the event loop with it.
    hostile = make_hostile(kind, tmp_path / f"hostile-{kind}")
    running = reloader.app.generation
    assert reloader.source is not None
    doc = yaml.safe_load(MINIMAL)
    userinfo = {"type": "userinfo", "name": "ui", "url": "https://127.0.0.1:9/u"}
    doc["backends"].append({**userinfo, "tls": {"ca_file": str(hostile)}})
    reloader.source.write_text(yaml.safe_dump(doc))
    with caplog.at_level(logging.INFO):
        assert await reloader.reload() is False
    assert refusals(caplog) == [
        f"{REFUSED}{reloader.source}: backends[1] (ui): tls.ca_file: {hostile}: "
        f"{refusal(kind, CA_BUNDLE_BYTES)}"
    ]
    assert reloader.app.generation is running
    assert await verdict_of(reloader, "t") == "Authenticated"


async def test_a_reload_that_turns_the_backend_marker_off_warns_that_the_webhook_goes_unasked(
    reloader: Reloader, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    # deploy/apiserver/authorization-config.yaml asks the webhook only about users whose
    # extra carries the backend marker: with it off, kube-apiserver never asks.
    policy = tmp_path / "policy.json"
    policy.write_text("[]")
    config = yaml.safe_load(MINIMAL)
    config["authorization"] = {"keystone_policy_file": str(policy)}
    assert reloader.source is not None

    async def warned(doc: dict[str, object]) -> list[str]:
        assert reloader.source is not None
        reloader.source.write_text(yaml.safe_dump(doc))
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            assert await reloader.reload() is True
        return [r.getMessage() for r in caplog.records if "matchCondition" in r.getMessage()]

    [line] = await warned({**config, "markers": {"backend": False}})
    assert line.startswith("authorization: markers.backend is off: ")
    assert await warned(config) == []


async def test_reviews_are_answered_while_a_reload_reads_and_parses_its_file(
    reloader: Reloader, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A 1 MiB file takes a while to parse; it was read and parsed on the event loop, so
    # every review waited for it. Now load_config runs in a worker thread: here it
    # waits (at most 30 s, so that the old way fails rather than hangs) until a
    # review has been answered on the loop meanwhile.
    real = reloader_module.load_config
    loading, reviewed = threading.Event(), threading.Event()
    order: list[str] = []

    def slow_load(path: Path | None) -> GatewayConfig:
        loading.set()
        reviewed.wait(30)
        order.append("loaded")
        return real(path)

    monkeypatch.setattr(reloader_module, "load_config", slow_load)
    task = asyncio.create_task(reloader.reload())
    while not loading.is_set():
        await asyncio.sleep(0.01)  # the reload is reading its file from here on
    assert await verdict_of(reloader, "t") == "Authenticated"
    order.append("reviewed")
    reviewed.set()
    assert await task is True
    assert order == ["reviewed", "loaded"]


async def test_a_config_file_replaced_by_a_fifo_is_refused_in_one_line(
    reloader: Reloader, caplog: pytest.LogCaptureFixture
) -> None:
    # The FIFO's open waited for a writer, on the event loop: the gateway froze.
    assert reloader.source is not None
    running = reloader.app.generation
    replace_with_hostile("fifo", reloader.source)
    with caplog.at_level(logging.INFO):
        done = await asyncio.wait_for(reloader.reload(), 60)
    assert done is False
    assert refusals(caplog) == [f"{REFUSED}{reloader.source}: a FIFO, not a regular file"]
    assert reloader.app.generation is running
    assert await verdict_of(reloader, "t") == "Authenticated"
    assert reloads(reloader, "refused") == 1
