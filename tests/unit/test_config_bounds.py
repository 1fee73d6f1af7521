"""Every number in the config is finite and bounded (issue 36, item 2): ``.inf``,
``.nan``, ``1e400`` and a 101-digit integer are refused in every int and float field
of the schema, each with one line naming the field; and the whole-number forms that
Redis and uvicorn take are clamped before ``int()``."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml

from authn_gateway.config import ConfigError, parse_config
from backends.durations import WHOLE_MAX_SECONDS, per_second, whole_ms, whole_seconds
from tests.support.config_helpers import MINIMAL, STRONG
from tests.support.config_schema import Spot, document, spots
from tests.support.pki import make_ca

NUMBERS = [s for s in spots() if s.kind in (int, float)]
HOSTILE = [math.inf, -math.inf, math.nan, "1e400", 10**100, "9" * 5001]


def _default(spot: Spot) -> object:
    value = spot.field.get_default(call_default_factory=True)
    return value if isinstance(value, int | float) and not isinstance(value, bool) else 1


def test_the_walk_finds_the_fields_the_issue_named() -> None:
    names = {s.name for s in NUMBERS}
    assert {
        "server.graceful_shutdown_seconds",
        "cache.keep_stale_seconds",
        "backends[0].timeouts.total_seconds",
        "backends[0].bucket.rate",
        "inbound_limit.rate",
        "backends[0].keys.max_stale_seconds",
    } <= names
    assert len(NUMBERS) > 200


@pytest.mark.parametrize("spot", NUMBERS, ids=lambda s: f"{s.backend or 'gateway'}:{s.name}")
def test_every_number_field_refuses_what_is_not_a_sane_finite_number(spot: Spot) -> None:
    # The document is valid with the field's default: the refusal below is the value's.
    parse_config(yaml.safe_dump(document(spot, _default(spot))), "gw.yaml")
    for value in HOSTILE:
        with pytest.raises(ConfigError) as err:
            parse_config(yaml.safe_dump(document(spot, value)), "gw.yaml")
        assert len(err.value.problems) == 1, (value, err.value.problems)
        assert err.value.problems[0].startswith(f"{spot.name}: "), (value, err.value.problems)
        assert "9" * 50 not in str(err.value)


WHOLE = [s for s in NUMBERS if s.kind is int]


@pytest.mark.parametrize("spot", WHOLE, ids=lambda s: f"{s.backend or 'gateway'}:{s.name}")
def test_an_int_field_says_what_it_takes_of_a_number_no_int_can_be(spot: Spot) -> None:
    # A 5,001-digit integer (past what int() reads: safe_yaml reads it as infinity) and
    # .inf are "must be a whole number at most N", not "Input should be a finite number".
    (ceiling,) = {m.le for m in spot.field.metadata if hasattr(m, "le")} or {None}
    for text in ["9" * 5001, ".inf"]:
        source = yaml.safe_dump(document(spot, "NUMBER")).replace("NUMBER", text)
        with pytest.raises(ConfigError) as err:
            parse_config(source, "gw.yaml")
        assert err.value.problems == [f"{spot.name}: must be a whole number at most {ceiling}"]
    with pytest.raises(ConfigError) as err:
        parse_config(yaml.safe_dump(document(spot, -math.inf)), "gw.yaml")
    [problem] = err.value.problems
    assert problem.startswith(f"{spot.name}: must be a whole number at least "), problem


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (".inf", "Input should be a finite number"),
        (".nan", "Input should be a finite number"),
        ("1e400", "Input should be a finite number"),
        ("1.0e+400", "Input should be a finite number"),
        ("301", "Input should be less than or equal to 300"),
    ],
)
def test_an_infinite_timeout_is_one_clear_line(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(MINIMAL + f"review_deadline_seconds: {text}\n", "gw.yaml")
    assert err.value.problems == [f"review_deadline_seconds: {message}"]


@pytest.mark.parametrize("rate", ["9" * 400 + "/second", "1e400/second", "inf", "50/fortnight"])
def test_a_rate_that_is_no_rate_is_one_clear_line(rate: str) -> None:
    text = MINIMAL.replace("type: static", f"type: static\n    bucket: {{rate: '{rate}'}}")
    with pytest.raises(ConfigError) as err:
        parse_config(text, "gw.yaml")
    [problem] = err.value.problems
    assert problem.startswith("backends[0].bucket.rate: "), problem
    assert "9" * 50 not in problem


def test_rates_in_limits_notation_are_per_second() -> None:
    assert per_second("3000/minute") == 50.0
    assert per_second(7) == 7.0
    with pytest.raises(ValueError, match="rate such as 50/second"):
        per_second("9" * 400 + "/second")


@pytest.mark.parametrize(
    ("seconds", "ms"),
    [
        (0.25, 250),
        (0.0, 1),
        (-5.0, 1),
        (math.inf, int(WHOLE_MAX_SECONDS * 1000)),
        (1e400, int(WHOLE_MAX_SECONDS * 1000)),
        (-math.inf, 1),
        (math.nan, 1),
    ],
)
def test_whole_ms_is_clamped_before_int(seconds: float, ms: int) -> None:
    assert whole_ms(seconds) == ms


def test_whole_ms_may_keep_zero_for_an_expired_entry() -> None:
    assert whole_ms(-3.0, at_least=0) == 0
    assert whole_ms(2.5, at_least=0) == 2500


@pytest.mark.parametrize(
    ("seconds", "whole"),
    [(10.0, 10), (0.5, 0), (math.inf, int(WHOLE_MAX_SECONDS)), (math.nan, 0), (-1.0, 0)],
)
def test_whole_seconds_is_clamped_before_int(seconds: float, whole: int) -> None:
    assert whole_seconds(seconds) == whole


REDIS_PASSWORD = "Zq9sEcReTpAsS"


def redis_problems(url: str) -> list[str]:
    text = MINIMAL + f"secret: {STRONG}\nredis: {{url: '{url}'}}\n"
    with pytest.raises(ConfigError) as err:
        parse_config(text, "gw.yaml")
    assert REDIS_PASSWORD not in str(err.value)
    return err.value.problems


@pytest.mark.parametrize(
    ("query", "name"),
    [
        # Each went to redis-py past the section's bounds, over timeout_seconds.
        ("socket_timeout=inf&socket_connect_timeout=nan", "socket_timeout"),
        ("socket_connect_timeout=nan", "socket_connect_timeout"),
        ("health_check_interval=" + "9" * 20, "health_check_interval"),
        ("db=0&socket_timeout=1e400", "socket_timeout"),
        ("ssl_cert_reqs=none", "ssl_cert_reqs"),  # would turn off certificate checks
        ("max_connections=0", "max_connections"),
    ],
)
def test_a_query_parameter_in_the_redis_url_is_refused_naming_it(query: str, name: str) -> None:
    for scheme in ("redis", "rediss"):
        url = f"{scheme}://:{REDIS_PASSWORD}@127.0.0.1:6379/0?{query}"
        assert redis_problems(url) == [
            f"redis.url: query parameter {name!r} is not taken (only db is; timeouts are "
            "redis.timeout_seconds)"
        ]


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("redis://h:1/0?db=1&db=2", "query parameter 'db' is given twice"),
        ("redis://h:1/0?db=99999999999999999999", "query parameter 'db' must be a whole number"),
        ("unix:///r.sock?db=-1", "query parameter 'db' must be a whole number"),
        ("redis://h:1/0?db", "its query must be name=value pairs (only db is taken)"),
        (f"redis://h:1/0?{REDIS_PASSWORD}", "its query must be name=value pairs"),
        (f"redis://h:1/0?a%0a{REDIS_PASSWORD}=1", "query parameter with that name is not taken"),
        ("redis://h:1/99999999999999999999", "the database (its path) must be a whole number"),
        ("redis://h:1/-1", "the database (its path) must be a whole number"),
    ],
)
def test_the_database_in_the_redis_url_is_bounded(url: str, problem: str) -> None:
    [line] = redis_problems(url.replace("h:1", f":{REDIS_PASSWORD}@h:1"))
    assert line.startswith(f"redis.url: {problem}"), line


@pytest.mark.parametrize(
    "url", ["redis://h:6379/3", "redis://h:6379", "unix:///run/redis.sock?db=3", "rediss://h/0"]
)
def test_a_redis_url_with_a_database_and_no_other_parameter_is_taken(url: str) -> None:
    text = MINIMAL + f"secret: {STRONG}\nredis: {{url: '{url}'}}\n"
    assert parse_config(text, "gw.yaml").redis is not None


def test_a_private_ca_for_rediss_is_redis_tls_ca_file_and_a_bad_one_is_one_line(
    tmp_path: Path,
) -> None:
    """With the query closed to ssl_* arguments, a rediss:// url's private CA is a
    field of its own, read and checked as the backends' CA files are."""
    ca = make_ca("redis-ca")
    good, empty = tmp_path / "ca.pem", tmp_path / "empty.pem"
    good.write_bytes(ca.cert_pem())
    empty.write_text("no certificate here\n")

    def problems(url: str, ca_file: Path) -> list[str]:
        text = (
            MINIMAL + f"secret: {STRONG}\nredis: {{url: '{url}', tls: {{ca_file: '{ca_file}'}}}}\n"
        )
        with pytest.raises(ConfigError) as err:
            parse_config(text, "gw.yaml")
        return err.value.problems

    text = (
        MINIMAL + f"secret: {STRONG}\nredis: {{url: 'rediss://h/0', tls: {{ca_file: '{good}'}}}}\n"
    )
    redis = parse_config(text, "gw.yaml").redis
    assert redis is not None and redis.tls.ca_file == good
    assert problems("redis://h/0", good) == ["redis: tls.ca_file: takes a rediss:// url (TLS)"]
    assert problems("rediss://h/0", empty) == [
        f"redis: tls.ca_file: {empty}: holds no PEM certificate"
    ]
    [missing] = problems("rediss://h/0", tmp_path / "nope.pem")
    assert missing.startswith(f"redis: tls.ca_file: {tmp_path / 'nope.pem'}: cannot read"), missing
