"""The strength of the secrets the operator generates is read from their structure
(issue 36, item 4): real random secrets always pass; repeats, periods, runs and
alphabets in order fail, each with its own reason, never with the length's bits, and
never quoting the secret."""

from __future__ import annotations

import base64
import secrets
import string
from random import Random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from authn_gateway.config import ConfigError, parse_config
from authn_gateway.secret_strength import (
    MIN_SECRET_BITS,
    SLACK_BITS,
    measure,
    secret_weakness,
)
from tests.support.config_helpers import MINIMAL, STRONG

B64 = string.ascii_letters + string.digits + "+/"
B64_IN_ORDER = string.ascii_uppercase + string.ascii_lowercase + string.digits + "+/"


def generated(r: Random) -> list[str]:
    """The three ways the docs and Python generate a secret, from ``r``'s bytes."""
    raw = r.randbytes(32)
    url = base64.urlsafe_b64encode(r.randbytes(32)).decode().rstrip("=")  # token_urlsafe(32)
    return [base64.b64encode(raw).decode(), raw.hex(), url]


@given(st.randoms(use_true_random=True))
def test_real_random_secrets_always_pass(r: Random) -> None:
    for value in generated(r):
        assert secret_weakness(value) is None, (value, measure(value))


PRINTABLE = string.ascii_letters + string.digits + string.punctuation


@given(
    st.randoms(use_true_random=True),
    st.integers(32, 64),
    st.sampled_from(["hex", "base64", "urlsafe", "password"]),
)
def test_random_secrets_of_sufficient_length_pass(r: Random, size: int, kind: str) -> None:
    # size random bytes, as each generator writes them; a password of size + 8 (40 to
    # 72) characters drawn from the 94 printable ones (6.55 bits each: 262 bits at 40).
    raw = r.randbytes(size)
    value = {
        "hex": raw.hex(),
        "base64": base64.b64encode(raw).decode(),
        "urlsafe": base64.urlsafe_b64encode(raw).decode().rstrip("="),
        "password": "".join(r.choice(PRINTABLE) for _ in range(size + 8)),
    }[kind]
    assert secret_weakness(value) is None, (value, measure(value))


def test_a_password_that_ends_in_an_equals_sign_counts_it() -> None:
    # "=" was dropped as base64's padding from any secret: a 40-character password
    # ending in one was "too short: 40 characters" (39 counted).
    value = "Cfxo9HeV1qOy`]r`Ui/pnUx1P3Kp^:p~y!@{ymt="
    assert measure(value).nominal == measure(value[:-1] + "x").nominal
    assert secret_weakness(value) is None


def test_the_generators_themselves_pass() -> None:
    for value in (secrets.token_urlsafe(32), secrets.token_hex(32)):
        assert secret_weakness(value) is None, (value, measure(value))


def refused(value: str) -> str:
    weakness = secret_weakness(value)
    assert weakness is not None, (value, measure(value))
    assert value not in weakness
    assert not any(value[i : i + 8] in weakness for i in range(len(value) - 7))
    assert weakness.endswith("use 32 random bytes, e.g. head -c 32 /dev/urandom | base64")
    return weakness


@pytest.mark.parametrize(
    ("value", "reasons"),
    [
        ("0123456789abcdef" * 4, ["follows an alphabet in order", "repeats a pattern"]),
        (B64_IN_ORDER, ["follows an alphabet in order"]),
        (
            "0123456789" * 7,  # 70 decimal digits: 233 bits by length
            ["follows an alphabet in order", "repeats a pattern", "too short: 70 characters"],
        ),
        ("caller-" + "ab12" * 10, ["too few distinct characters: 9", "repeats a pattern"]),
        ("a" * 64, ["too few distinct characters: 1", "repeats one character"]),
        ("Hunter2", ["too few distinct characters: 7", "too short: 7 characters"]),
    ],
)
def test_a_patterned_secret_is_refused_for_what_it_is(value: str, reasons: list[str]) -> None:
    weakness = refused(value)
    assert weakness.startswith(f"too weak ({'; '.join(reasons)}): about "), weakness
    bits = float(weakness.split("about ")[1].split(" bits")[0])
    assert bits < MIN_SECRET_BITS - SLACK_BITS, weakness  # never the length's ~282 bits


QWERTY_WALK = "qwertyuiop[]asdfghjkl;'zxcvbnm,./QWERTYUIOP{}ASDFGHJKL:ZXCVBNM<>?1234567890-="
#: Patterned secrets that passed (issue 36, the audit), each with its reason.
PATTERNED = {
    "bytes 0..31 in hex": (bytes(range(32)).hex(), "counts up or down in fixed-width numbers"),
    "bytes 31..0 in hex": (bytes(range(31, -1, -1)).hex(), "counts up or down in fixed"),
    "a hex counter": ("".join(f"{i:04x}" for i in range(16)), "counts up or down"),
    "a decimal counter": ("".join(f"{i:02d}" for i in range(40)), "counts up or down"),
    "a counter by 3s": ("".join(f"{i:03d}" for i in range(0, 120, 3)), "counts up or down"),
    "base64 of bytes 0..31": (base64.b64encode(bytes(range(32))).decode(), "counts up or down"),
    "base64 every 3rd": ((B64_IN_ORDER * 3)[::3][:64], "steps through an alphabet"),
    "base64 every 5th": ((B64_IN_ORDER * 5)[::5][:64], "steps through an alphabet"),
    "hex every 7th": ("".join("0123456789abcdef"[i * 7 % 16] for i in range(64)), "repeats"),
    "interleaved alphabets": (
        "".join(a + b for a, b in zip(string.ascii_lowercase, string.ascii_uppercase, strict=True)),
        "steps through an alphabet at a stride or interleaves such sequences",
    ),
    "letters and digits interleaved": (
        "".join(
            a + b
            for a, b in zip(string.ascii_lowercase, (string.digits * 3)[::-1][:26], strict=True)
        ),
        "interleaves such sequences",
    ),
    "a qwerty keyboard walk by rows": (QWERTY_WALK, "follows an alphabet in order"),
    "a keyboard walk by columns": ("1qaz2wsx3edc4rfv5tgb6yhn7ujm8ik,9ol.0p;/-['=]", "in order"),
    "a keyboard zig-zag": ("qazxswedcvfrtgbnhyujm,kiol./;p[']" * 2, "walks along the keyboard"),
    "a shifted zig-zag": ('!QAZXSW@#EDCVFR$%TGBNHY^&UJM<KI*(OL>?:P)_{"}+', "walks along the"),
}


@pytest.mark.parametrize("name", sorted(PATTERNED))
def test_a_patterned_secret_that_passed_is_refused_saying_why(name: str) -> None:
    value, reason = PATTERNED[name]
    weakness = refused(value)
    assert reason in weakness, weakness
    bits = float(weakness.split("about ")[1].split(" bits")[0])
    assert bits < MIN_SECRET_BITS - SLACK_BITS, weakness


@given(st.text(B64, min_size=1, max_size=30), st.integers(2, 8))
def test_a_repeated_chunk_is_refused(chunk: str, times: int) -> None:
    value = chunk * max(times, -(-64 // len(chunk)))  # at least 64 characters
    weakness = refused(value)
    assert any(why in weakness for why in ("repeats", "too few distinct", "placeholder")), weakness


@given(
    st.sampled_from([string.digits + string.ascii_lowercase, B64_IN_ORDER, string.printable[:94]]),
    st.integers(0, 200),
    st.integers(44, 120),
    st.booleans(),
)
def test_an_alphabet_in_order_is_refused(
    alphabet: str, start: int, length: int, down: bool
) -> None:
    cycled = (alphabet * 8)[start % len(alphabet) :][:length]
    value = cycled[::-1] if down else cycled
    assert "follows an alphabet in order" in refused(value)


@given(st.randoms(use_true_random=True), st.integers(20, 30), st.sampled_from(B64))
def test_a_long_run_of_one_character_is_refused(r: Random, random_part: int, char: str) -> None:
    head = base64.b64encode(r.randbytes(32)).decode()[:random_part]
    assert "repeats one character" in refused(head + char * 40)


def test_a_long_random_secret_is_measured_and_passes() -> None:
    value = base64.b64encode(Random(7).randbytes(48 * 1024)).decode()
    assert secret_weakness(value) is None


@pytest.mark.parametrize(
    "value",
    [
        "0123456789abcdef" * 4,
        B64_IN_ORDER,
        "0123456789" * 7,
        "caller-" + "ab12" * 10,
        bytes(range(32)).hex(),
        base64.b64encode(bytes(range(32))).decode(),
        (B64_IN_ORDER * 3)[::3][:64],
    ],
)
@pytest.mark.parametrize(
    "field",
    ["secret", "previous_secrets[0]", "admin.token", "server.caller_tokens[0].token"],
)
def test_the_config_refuses_them_as_the_gateway_secret_and_tokens(value: str, field: str) -> None:
    caller = f"{{name: c, token: '{value}'}}"
    doc = {
        "secret": f"secret: '{value}'\n",
        "previous_secrets[0]": f"secret: {STRONG}\nprevious_secrets: ['{value}']\n",
        "admin.token": f"admin: {{enabled: true, token: '{value}'}}\n",
        "server.caller_tokens[0].token": f"server: {{caller_tokens: [{caller}]}}\n",
    }[field]
    with pytest.raises(ConfigError) as err:
        parse_config(MINIMAL + doc, "gw.yaml")
    [problem] = err.value.problems
    assert problem.startswith(f"{field}: too weak ("), problem
    assert value not in problem
