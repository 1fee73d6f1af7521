"""Rotating the gateway secret (previous_secrets) without a cold start: real gateway
processes, a real redis-server and the fake IdP, following docs/operations.md
("Rotate the gateway secret") step by step."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from authn_gateway.config import ConfigError, parse_config
from authn_gateway.keyed_hashes import TokenHasher
from tests.support.rotation_helpers import MINIMAL, NEW, OLD


def test_entries_name_their_secret_and_stay_readable_by_the_previous_version() -> None:
    import hmac

    import orjson

    from authn_gateway.layers.cache import CacheEntry
    from authn_gateway.layers.cache.redis import EntryCodec
    from backends.base import Authenticated, UserInfo

    key, now = b"k" * 32, time.time()
    entry = CacheEntry(Authenticated(UserInfo("ann")), now + 300, now + 900)
    new, old = TokenHasher(NEW.encode()), TokenHasher(OLD.encode())
    rotating = TokenHasher(NEW.encode(), [OLD.encode()])
    value = EntryCodec(new).encode(key, entry)
    # The previous version's check: HMAC over key and payload, then the JSON.
    signature, payload = value[:32], value[32:]
    assert hmac.compare_digest(signature, new.sign(key + payload))
    assert orjson.loads(payload)["v"] == new.key_id.hex()
    # Signed with a previous secret: read by a replica that accepts it, by no other.
    by_old = EntryCodec(old).encode(key, entry)
    assert EntryCodec(rotating).decode(key, by_old) == entry
    assert EntryCodec(new).decode(key, by_old) is None
    # A key id swapped for the current one does not make the old signature pass.
    forged = by_old.replace(old.key_id.hex().encode(), new.key_id.hex().encode())
    assert EntryCodec(rotating).decode(key, forged) is None
    # Written before key ids: checked against the secret whose key found it.
    legacy_payload = orjson.dumps({k: v for k, v in orjson.loads(payload).items() if k != "v"})
    legacy = old.sign(key + legacy_payload) + legacy_payload
    assert EntryCodec(rotating).decode(key, legacy, found_by=rotating.previous[0]) == entry
    assert EntryCodec(rotating).decode(key, legacy) is None


def problems(text: str) -> list[str]:
    with pytest.raises(ConfigError) as err:
        parse_config(text, "gw.yaml")
    return err.value.problems


@pytest.mark.parametrize(
    ("previous", "why"),
    [
        ("REPLACE-with-32-random-bytes-base64", "looks like a placeholder"),
        ("changeme-please-Hn4Wq8zR2mK6vT1xB9cY3uL7aE5sD0fGj", "looks like a placeholder"),
        ("short-Hn4Wq8", "too weak ("),
        ("a" * 64, "too weak ("),
    ],
)
def test_a_weak_or_placeholder_previous_secret_is_refused_without_echoing_it(
    previous: str, why: str
) -> None:
    [problem] = problems(MINIMAL + f"secret: '{NEW}'\nprevious_secrets: ['{previous}']\n")
    assert problem.startswith(f"previous_secrets[0]: {why}")
    assert "head -c 32 /dev/urandom | base64" in problem
    assert previous not in problem and NEW not in problem


def test_a_previous_secret_from_a_missing_variable_or_file_is_named(tmp_path: Path) -> None:
    text = MINIMAL + f"secret: '{NEW}'\nprevious_secrets: ['{OLD}', env:AUTHN_GW_UNSET_PREV]\n"
    assert problems(text) == [
        "previous_secrets[1]: environment variable AUTHN_GW_UNSET_PREV is not set"
    ]
    missing = tmp_path / "nope"
    text = MINIMAL + f"secret: '{NEW}'\nprevious_secrets: ['file:{missing}']\n"
    [problem] = problems(text)
    assert (
        problem
        == f"previous_secrets[0]: secret file {missing}: cannot read: No such file or directory"
    )


def test_previous_secrets_from_a_file_are_read(tmp_path: Path) -> None:
    path = tmp_path / "old"
    path.write_text(OLD + "\n")
    config = parse_config(MINIMAL + f"secret: '{NEW}'\nprevious_secrets: ['file:{path}']\n", "x")
    assert [s.get_secret_value() for s in config.previous_secrets] == [OLD]


def test_previous_secrets_need_a_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AUTHN_GATEWAY_SECRET", raising=False)
    [problem] = problems(MINIMAL + f"previous_secrets: ['{OLD}']\n")
    assert problem.startswith("previous_secrets: needs secret")
