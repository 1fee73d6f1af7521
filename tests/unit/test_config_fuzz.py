"""What check-config accepts, serve runs (issue 36, "Fuzz the config"), in process.

Arbitrary YAML documents, and valid documents with arbitrary values (inf, nan, huge,
negative, wrong types, deep nesting, and values of the field's own type at and past its
bounds) in one to three of the schema's fields (tests/support/config_fuzz.py), go to
``authn-gateway check-config`` (its main, in this process). Either it exits 1 with
"invalid configuration" and lines that each name a field or a position, or it exits 0,
and then what serve builds before it listens is built from the file (the gateway, the
edge's limits, uvicorn's config) and a review of the static token is answered through
the ASGI app without an internal error. A field that names a file the gateway reads
also gets a device, a FIFO, a directory or a huge sparse file (a test of its own draws
those fields first). tests/process/test_config_fuzz_reload.py holds a running
gateway's reload to the same property."""

from __future__ import annotations

import asyncio
import contextlib
import io
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

import httpx
from hypothesis import event, example, given, settings

from authn_gateway import cli
from authn_gateway.config import GatewayConfig, load_config
from authn_gateway.serve.app import GatewayApp
from authn_gateway.serve.gateway import Gateway
from authn_gateway.serve.server import CallersOnly, ReviewOnly, _uvicorn_config, edge_limits
from tests.support.config_fuzz import (
    FILE_SPOTS,
    REVIEW,
    SERVING,
    check_answer,
    dump,
    field_documents,
    named,
    review_request,
    yaml_texts,
)
from tests.support.config_helpers import STRONG
from tests.support.config_schema import BACKENDS
from tests.support.fuzz import examples


def check_config(text: str) -> tuple[int, list[str], GatewayConfig | None]:
    """check-config's exit status and problem lines for ``text``, and the config if valid."""
    with TemporaryDirectory() as tmp:
        path = Path(tmp) / "gw.yaml"
        path.write_text(text, encoding="utf-8", errors="surrogatepass")
        err, out = io.StringIO(), io.StringIO()
        with redirect_stderr(err), redirect_stdout(out):
            status = cli.main(["check-config", str(path)])
        if status != 0:
            head, *lines = err.getvalue().splitlines()
            assert head == "invalid configuration:", err.getvalue()
            assert lines and all(line.startswith(f"{path}: ") for line in lines), lines
            return status, [line[len(f"{path}: ") :] for line in lines], None
        assert out.getvalue().startswith(f"{path}: ok; backends: "), out.getvalue()
        return status, [], load_config(path)


async def serve_one_review(config: GatewayConfig) -> tuple[httpx.Response, float]:
    """What serve builds before it listens, then one review of the static token through
    the app; the answer and the internal errors counted."""
    app = GatewayApp(Gateway(config, source="fuzz"))
    edge = edge_limits(config, None)
    front: Any = app
    if config.server.ops is not None:
        front = ReviewOnly(app)
    elif config.server.callers_must_authenticate:
        front = CallersOnly(app)
    _uvicorn_config(front, config, edge)
    await app.generation.start()
    try:
        path, headers = review_request(config)
        transport = httpx.ASGITransport(app=front)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
            answer = await client.post(path, json=REVIEW, headers=headers)
    finally:
        await app.generation.close()
    registry = app.gateway.metrics.registry
    errors = sum(
        s.value
        for metric in registry.collect()
        if metric.name == "authn_gateway_internal_errors"
        for s in metric.samples
        if s.name.endswith("_total")
    )
    return answer, errors


def holds(text: str, doc: dict[str, Any] | None = None) -> None:
    # In a directory of its own: a config may name an audit log or a deny-list file.
    with TemporaryDirectory() as cwd, contextlib.chdir(cwd):
        _holds(text, doc)


def _holds(text: str, doc: dict[str, Any] | None) -> None:
    status, problems, config = check_config(text)
    event("refused" if status else "accepted")
    if status != 0:
        assert all(named(p, doc) for p in problems), problems
        return
    assert config is not None
    answer, errors = asyncio.run(serve_one_review(config))
    check_answer(answer)
    assert errors == 0, answer.text


def test_the_serving_document_itself_is_accepted_and_authenticates() -> None:
    status, problems, config = check_config(dump({"backends": [SERVING]}))
    assert status == 0 and config is not None, problems
    answer, errors = asyncio.run(serve_one_review(config))
    assert answer.json()["status"]["authenticated"] is True, answer.text
    assert errors == 0


@settings(max_examples=examples(40))
@given(field_documents())
# Found by the fuzz: a Redis Cluster down at start-up failed the start, and an audit
# log name open() cannot take passed check-config.
@example({"backends": [SERVING], "server": {"audit_log": "9" * 4301}})
@example(
    {
        "backends": [SERVING],
        "secret": STRONG,
        "redis": {"url": "redis://127.0.0.1:9", "cluster": True},
    }
)
def test_any_values_in_the_fields_are_named_errors_or_a_config_that_serves(
    doc: dict[str, Any],
) -> None:
    holds(dump(doc), doc)


def test_the_walk_finds_every_file_the_gateway_reads() -> None:
    names = {(s.backend, s.name) for s in FILE_SPOTS}
    assert {
        (None, "server.tls.cert_file"),
        (None, "server.tls.client_ca_file"),
        (None, "authorization.keystone_policy_file"),
        (None, "deny_list.file"),
        (None, "secret"),
        ("static", "backends[0].file"),
        ("ldap", "backends[0].tls.ca_file"),
        ("keystone", "backends[0].service.password"),
    } <= names


@settings(max_examples=examples(30))
@given(field_documents(among=FILE_SPOTS))
# A FIFO with no writer as a CA bundle hung check-config; /dev/zero as a token file
# was read until memory ran out.
@example({"backends": [SERVING, {**BACKENDS["userinfo"], "tls": {"ca_file": "/dev/zero"}}]})
def test_a_hostile_file_in_any_field_naming_a_file_is_a_named_error(doc: dict[str, Any]) -> None:
    # Mostly the files of tests/support/hostile_files.py, in one field that names a file
    # (and maybe another value elsewhere): never a hang, always a line naming a field.
    holds(dump(doc), doc)


@settings(max_examples=examples(40))
@given(yaml_texts())
# Found by the fuzz: a key with a line break, and an empty key, were lines without a place.
@example('"\\x1E": null\nbackends: null\n')
@example("? ''\n: null\nbackends: null\n")
def test_any_yaml_document_is_named_errors_or_a_config_that_serves(text: str) -> None:
    holds(text)
