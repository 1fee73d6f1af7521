"""What check-config accepts, a running gateway's reload serves (issue 36, "Fuzz the
config"), over a real process. A gateway gets by SIGHUP: documents with arbitrary values
in one or two of the schema's fields (tests/support/config_fuzz.py); arbitrary YAML
texts (noise, a valid file mutated, deep nesting, alias fans, JSON-ish documents);
documents naming a file the gateway writes (its audit log, its deny list) as any name,
relative (in the gateway's own directory), a device, a FIFO or a directory; and, with a
live Redis, the cache's and Redis' durations and counts at their bounds. A refusal is
one 'config reload refused' line whose problems each name a field or a position, and
the previous config still serves the static token; an applied file serves it without an
internal error (with Redis: a valid user is authenticated, twice, never "internal
error"), and then the first file is reloaded again. A few examples each in the ci
profile (the whole file in well under a minute): the in-process test
(tests/unit/test_config_fuzz.py) takes the many."""

from __future__ import annotations

import copy
import math
import string
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import yaml
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from authn_gateway.config import ConfigError, GatewayConfig, parse_config
from tests.support.config_fuzz import (
    HOSTILE,
    REVIEW,
    SERVING,
    SPOTS,
    TOKEN,
    WRITTEN,
    _constraints,
    check_answer,
    dump,
    field_documents,
    named,
    review_request,
    yaml_texts,
)
from tests.support.config_helpers import STRONG
from tests.support.config_schema import Spot, place
from tests.support.fuzz import examples
from tests.support.hostile_files import hostile_paths
from tests.support.procs import GatewayProcess, start_gateway
from tests.support.redis_server import RedisServer
from tests.support.reload_helpers import REFUSED, authenticated, reload_with

BASE = dump({"backends": [copy.deepcopy(SERVING)]})
SLOW = settings(suppress_health_check=[HealthCheck.too_slow], deadline=None)


def problems_of(line: str, source: str) -> list[str]:
    """The problems of a refusal line: each after the file's name (a problem may hold
    a '; ' of its own)."""
    reasons = line.split("still serving the previous config: ", 1)[1]
    assert reasons.startswith(f"{source}: "), line
    return reasons.removeprefix(f"{source}: ").split(f"; {source}: ")


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    """One gateway for the examples without Redis, in a directory of its own (a relative
    file name lands there): each example leaves it serving BASE again."""
    workdir = tmp_path_factory.mktemp("fuzz-reload")
    gw = start_gateway(yaml.safe_load(BASE), workdir, cwd=workdir)
    yield gw
    gw.stop()


def expect(text: str) -> GatewayConfig | ConfigError:
    try:
        return parse_config(text, "fuzz")
    except ConfigError as exc:
        return exc


def reload_holds(gw: GatewayProcess, text: str, doc: Any) -> GatewayConfig | None:
    """Reload ``gw`` with ``text``: refused in one line of named problems (and the
    previous config serves), or applied as check-config's parse says. The applied
    config (the caller reloads its first file again), None if refused."""
    expected = expect(text)
    done = reload_with(gw, text)
    event("applied" if done.applied else "refused")
    assert "Traceback" not in done.logs and "Task exception" not in done.logs, done.logs
    assert gw.proc.poll() is None, done.logs
    if not done.applied:
        [line] = [ln for ln in done.logs.splitlines() if REFUSED in ln]
        found = problems_of(line, str(gw.config_path))
        assert all(named(p, doc) for p in found), found
        assert authenticated(gw, TOKEN) == "fz"
        return None
    # Applied; check-config may still refuse what only building it finds (a file it
    # names), never the other way round.
    assert not isinstance(expected, ConfigError), (expected, done.logs)
    path, headers = review_request(expected)
    answer = httpx.post(f"{gw.url}{path}", json=REVIEW, headers=headers, timeout=30)
    check_answer(answer)
    assert gw.proc.poll() is None
    return expected


def back_to(gw: GatewayProcess, base: str) -> None:
    assert reload_with(gw, base).applied
    assert authenticated(gw, TOKEN) == "fz"


@settings(SLOW, max_examples=examples(6))
@given(doc=field_documents(leave_out=WRITTEN))
def test_a_reload_with_any_values_is_refused_in_named_lines_or_serves(
    gateway: GatewayProcess, doc: dict[str, Any]
) -> None:
    text = dump(doc)
    done = reload_holds(gateway, text, doc)
    # Nothing here names a file the gateway writes: check-config and the reload agree.
    assert (done is None) == isinstance(expect(text), ConfigError)
    if done is not None:
        back_to(gateway, BASE)


@settings(SLOW, max_examples=examples(8))
@given(text=yaml_texts())
# Most drawn texts are refused; these apply: an anchor and its alias, and a key in quotes.
@example(text=BASE + "audiences: &a [x, y]\nreview_deadline_seconds: 4\n")
@example(text=BASE + "'audiences': [x]\n")
def test_a_reload_with_any_yaml_text_is_refused_in_named_lines_or_serves(
    gateway: GatewayProcess, text: str
) -> None:
    if reload_holds(gateway, text, None) is not None:
        back_to(gateway, BASE)


#: Names for a file the gateway writes: relative ones (in its directory, made or not,
#: a directory of it missing), stdout, devices, and a FIFO and a directory (by absolute
#: path: never anywhere else, as the tests run as root).
WRITTEN_NAMES = st.one_of(
    st.text(string.ascii_letters + string.digits + "._-/", min_size=1, max_size=16).filter(
        lambda name: not name.startswith("/")
    ),
    st.sampled_from(["-", ".", "..", "audit.log", "deny.json", "sub/dir/x", "/dev/null"]),
    st.sampled_from([p for p in hostile_paths() if p != "/dev/zero"]),
    HOSTILE.filter(lambda v: not (isinstance(v, str) and v.startswith("/"))),
)
WRITTEN_SPOTS = [s for s in SPOTS if s.name in WRITTEN]


@st.composite
def written_documents(draw: st.DrawFn) -> dict[str, Any]:
    """The serving document with a name in a field naming a file the gateway writes,
    and maybe another field's arbitrary value."""
    if draw(st.booleans()):
        doc = draw(field_documents(leave_out=WRITTEN))
    else:
        doc = {"backends": [copy.deepcopy(SERVING)]}
    for spot in draw(st.lists(st.sampled_from(WRITTEN_SPOTS), min_size=1, max_size=2)):
        place(doc, spot, draw(WRITTEN_NAMES))
    return doc


def test_the_written_fields_are_found() -> None:
    assert {s.name for s in WRITTEN_SPOTS} == WRITTEN


@settings(SLOW, max_examples=examples(6))
@given(doc=written_documents())
def test_a_reload_naming_any_file_to_write_is_refused_in_named_lines_or_serves(
    gateway: GatewayProcess, doc: dict[str, Any]
) -> None:
    if reload_holds(gateway, dump(doc), doc) is not None:
        back_to(gateway, BASE)


# With a live Redis: durations and counts of the cache and of Redis at their bounds.


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("fuzz-redis")).start()
    yield server
    server.stop()


def redis_base(server: RedisServer) -> str:
    return dump({"secret": STRONG, "redis": {"url": server.url}, "backends": [SERVING]})


@pytest.fixture(scope="module")
def redis_gateway(
    tmp_path_factory: pytest.TempPathFactory, redis_server: RedisServer
) -> Iterator[GatewayProcess]:
    workdir = tmp_path_factory.mktemp("fuzz-reload-redis")
    gw = start_gateway(yaml.safe_load(redis_base(redis_server)), workdir, cwd=workdir)
    yield gw
    gw.stop()


#: The cache's durations and counts (the gateway's and the serving backend's) and
#: Redis' own: keep_stale_seconds at 30 days with Redis was "internal error" while
#: .inf was taken.
BOUNDED = [
    s
    for s in SPOTS
    if s.kind in (int, float)
    and (s.name.startswith(("cache.", "redis.")) or s.name.startswith("backends[0].cache."))
    and (s.backend in (None, "static"))
]


def at_bounds(spot: Spot) -> st.SearchStrategy[int | float]:
    """A value the field takes: at its lower bound (or just above it), at its upper
    bound, or between."""
    bounds = _constraints(spot)
    low = bounds.get("ge", math.nextafter(bounds.get("gt", 0.0), math.inf))
    high = bounds["le"]
    if spot.kind is int:
        lo, hi = math.ceil(low), math.floor(high)
        return st.sampled_from([lo, hi, lo + 1, hi - 1]) | st.integers(lo, hi)
    return st.sampled_from([low, high, 0.001, 1.0, (low + high) / 2]).filter(
        lambda v: low <= v <= high
    ) | st.floats(low, high)


@st.composite
def bounded_documents(draw: st.DrawFn, url: str) -> dict[str, Any]:
    doc: dict[str, Any] = {"secret": STRONG, "redis": {"url": url}}
    doc["backends"] = [copy.deepcopy(SERVING)]
    chosen = draw(st.lists(st.sampled_from(BOUNDED), min_size=1, max_size=3, unique=True))
    for spot in chosen:
        place(doc, spot, draw(at_bounds(spot)), backend=0)
    return doc


def test_the_bounded_fields_include_the_ones_the_issue_named() -> None:
    names = {s.name for s in BOUNDED}
    assert {
        "cache.keep_stale_seconds",
        "cache.max_stale_seconds",
        "backends[0].cache.keep_stale_seconds",
        "redis.timeout_seconds",
        "redis.coalesce_wait_seconds",
    } <= names


@settings(SLOW, max_examples=examples(8))
@given(data=st.data())
def test_durations_at_their_bounds_with_a_live_redis_never_answer_internal_error(
    redis_gateway: GatewayProcess, redis_server: RedisServer, data: st.DataObject
) -> None:
    gw, base = redis_gateway, redis_base(redis_server)
    doc = data.draw(bounded_documents(redis_server.url))
    text = dump(doc)
    expected = expect(text)
    done = reload_holds(gw, text, doc)
    if isinstance(expected, ConfigError):
        assert done is None  # values within their bounds, refused only by a cross-check
        return
    assert done is not None, expected
    # A valid user, answered from the IdP, then from the cache or Redis: never an
    # internal error (authenticated() fails the test on one).
    assert authenticated(gw, TOKEN) == "fz"
    assert authenticated(gw, TOKEN) == "fz"
    back_to(gw, base)
