"""What check-config accepts, a running gateway's reload serves (issue 36, "Fuzz the
config"), over a real process: documents with arbitrary values in one to three of the
schema's fields (tests/support/config_fuzz.py) go to a gateway by SIGHUP. A refusal is
one 'config reload refused' line whose problems each name a field or a position, and
the previous config still serves the static token; an applied file serves it without an
internal error, and then the first file is reloaded again. A few examples in the ci
profile: the in-process test (tests/unit/test_config_fuzz.py) takes the many."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import yaml
from hypothesis import HealthCheck, event, given, settings

from authn_gateway.config import ConfigError, parse_config
from tests.support.config_fuzz import (
    REVIEW,
    SERVING,
    TOKEN,
    WRITTEN,
    check_answer,
    dump,
    field_documents,
    named,
    review_request,
)
from tests.support.fuzz import examples
from tests.support.procs import GatewayProcess, start_gateway
from tests.support.reload_helpers import REFUSED, authenticated, reload_with

BASE = dump({"backends": [copy.deepcopy(SERVING)]})


def problems_of(line: str, source: str) -> list[str]:
    """The problems of a refusal line: each after the file's name (a problem may hold
    a '; ' of its own)."""
    reasons = line.split("still serving the previous config: ", 1)[1]
    assert reasons.startswith(f"{source}: "), line
    return reasons.removeprefix(f"{source}: ").split(f"; {source}: ")


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    """One gateway for all the examples: each leaves it serving BASE again."""
    gw = start_gateway(yaml.safe_load(BASE), tmp_path_factory.mktemp("fuzz-reload"))
    yield gw
    gw.stop()


@settings(max_examples=examples(6), suppress_health_check=[HealthCheck.too_slow])
@given(doc=field_documents(leave_out=WRITTEN))
def test_a_reload_with_any_values_is_refused_in_named_lines_or_serves(
    gateway: GatewayProcess, doc: dict[str, Any]
) -> None:
    gw = gateway
    text = dump(doc)
    try:
        expected: Any = parse_config(text, "fuzz")
    except ConfigError as exc:
        expected = exc
    done = reload_with(gw, text)
    event("applied" if done.applied else "refused")
    assert "Traceback" not in done.logs and "Task exception" not in done.logs, done.logs
    assert done.applied == (not isinstance(expected, ConfigError)), (expected, done.logs)
    if not done.applied:
        [line] = [ln for ln in done.logs.splitlines() if REFUSED in ln]
        found = problems_of(line, str(gw.config_path))
        assert all(named(p, doc) for p in found), found
        assert authenticated(gw, TOKEN) == "fz"
        return
    path, headers = review_request(expected)
    answer = httpx.post(f"{gw.url}{path}", json=REVIEW, headers=headers, timeout=30)
    check_answer(answer)
    assert gw.proc.poll() is None
    assert reload_with(gw, BASE).applied
    assert authenticated(gw, TOKEN) == "fz"
