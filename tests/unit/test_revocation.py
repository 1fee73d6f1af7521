"""The deny list, the eviction bus and operator actions, over memory, a file and real Redis."""

from __future__ import annotations

import asyncio
import os
import stat
from pathlib import Path

import pytest

from authn_gateway.layers.cache.memory import MemoryStore
from authn_gateway.revocation import subject as subjects
from authn_gateway.revocation.actions import Revocations
from authn_gateway.revocation.denylist import DenyList
from authn_gateway.revocation.eviction import Evictor
from authn_gateway.revocation.memory import FileDenyStore, LocalBus, MemoryDenyStore
from authn_gateway.revocation.subject import BadSubject, Subject
from tests.support.revocation_helpers import ALICE, LEAKED, TOKEN, Clock, Tier, entry


def test_a_subject_is_exactly_one_of_user_or_token_id() -> None:
    assert subjects.from_request({"user": "alice"}) == ALICE
    assert subjects.from_request({"token_id": "0123456789ab"}) == TOKEN
    for bad in ({}, {"user": "a", "token_id": "0123456789ab"}, {"user": 3}, [], {"user": ""}):
        with pytest.raises(BadSubject):
            subjects.from_request(bad)


def test_a_token_id_that_looks_like_a_token_is_refused_without_echoing_it() -> None:
    secret = "glpat-abcdefghijklmnopqrst"
    with pytest.raises(BadSubject) as caught:
        subjects.from_request({"token_id": secret})
    assert secret not in str(caught.value)


@pytest.mark.parametrize(
    "near_miss",
    [
        "01cab284ec36\n",
        "\n01cab284ec36",
        "01cab284ec36 ",
        "01CAB284EC36",
        "01cab284ec3",
        "01cab284ec36a",
    ],
)
def test_a_token_id_must_be_exactly_twelve_lowercase_hex_digits(near_miss: str) -> None:
    # Issue 29, finding 11: re.match with "$" took a trailing newline, answered "denied",
    # and the entry matched nothing.
    assert subjects.token_id("01cab284ec36").value == "01cab284ec36"
    with pytest.raises(BadSubject, match="token_id: "):
        subjects.token_id(near_miss)
    with pytest.raises(BadSubject):
        Subject.from_key(f"token:{near_miss}")


def test_a_credential_id_is_kubes_form_whole_and_round_trips() -> None:
    # kube's credential ids: "JTI=<jti>" for a JWT (oidc.go getCredentialID),
    # "X509SHA256=<hex>" for a client certificate.
    assert subjects.from_request({"credential_id": "JTI=7f3c2a-leaked"}) == LEAKED
    assert subjects.credential_id("X509SHA256=ab12").to_json() == {
        "credential_id": "X509SHA256=ab12"
    }
    assert Subject.from_key(LEAKED.key) == LEAKED
    assert LEAKED.key == "credential:JTI=7f3c2a-leaked"
    for near_miss in ("7f3c2a", "jti=7f3c2a", "JTI=", "JTI=a\nb", "=x", "JTI=" + "x" * 513):
        with pytest.raises(BadSubject, match="credential_id: ") as caught:
            subjects.credential_id(near_miss)
        assert len(near_miss) < 6 or near_miss not in str(caught.value)
    with pytest.raises(BadSubject, match="exactly one of"):
        subjects.from_request({"credential_id": "JTI=a", "user": "alice"})


def test_usernames_with_control_characters_are_refused() -> None:
    with pytest.raises(BadSubject):
        subjects.user("alice\nINFO forged log line")


async def test_the_token_id_is_not_computed_while_no_token_is_denied(tmp_path: Path) -> None:
    deny = DenyList(MemoryDenyStore())
    await deny.add(ALICE, 60, by="ops")

    def never() -> str:
        raise AssertionError("hashed a token with no token denied")

    assert not deny.denies_token(never)


async def test_the_deny_file_is_private_and_shared_by_processes_that_read_it(
    tmp_path: Path,
) -> None:
    path = tmp_path / "state" / "deny.json"
    one, two = DenyList(FileDenyStore(path)), DenyList(FileDenyStore(path))
    await one.add(ALICE, 60, by="ops")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    await two.refresh()
    assert two.denies_user("alice")
    await two.lift(ALICE)
    await one.refresh()
    assert not one.denies_user("alice")


async def test_a_broken_deny_file_keeps_the_entries_already_loaded(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "deny.json"
    deny = DenyList(FileDenyStore(path))
    await deny.add(ALICE, 60, by="ops")
    path.write_text("{not json")
    await deny.refresh()
    assert deny.denies_user("alice")
    assert "not valid JSON" in caplog.text


async def test_an_unwritable_deny_file_is_reported_and_the_denial_still_holds(
    tmp_path: Path,
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    deny = DenyList(FileDenyStore(blocker / "deny.json"))  # its parent is a file
    _, stored = await deny.add(ALICE, 60, by="ops")
    assert not stored
    assert deny.denies_user("alice")


async def test_without_redis_actions_apply_to_this_replica_and_say_so() -> None:
    tier = Tier(("alice", "aaaaaaaaaaaa"))
    evictor = Evictor(guard_seconds=5.0)
    evictor.add_tier(tier)
    revocations = Revocations(DenyList(MemoryDenyStore()), evictor, LocalBus(), "solo")
    await revocations.start()
    try:
        evicted = await revocations.evict(subjects.token_id("aaaaaaaaaaaa"), by="ops")
        assert (evicted["local_entries"], evicted["fleet"]) == (1, False)
        denied = await revocations.deny(ALICE, 10, by="ops")
        assert (denied["stored_in"], denied["fleet"]) == ("memory", False)
    finally:
        await revocations.close()


def test_an_answer_started_before_an_eviction_is_not_written_back() -> None:
    clock = Clock()
    evictor = Evictor(guard_seconds=5.0, clock=clock)
    started = clock.now
    clock.now += 1
    asyncio.run(evictor.evict(ALICE))
    assert evictor.evicted_since("alice", None, started)
    assert not evictor.evicted_since("bob", "0123456789ab", started)
    assert not evictor.evicted_since("alice", None, clock.now + 1)  # began after it
    asyncio.run(evictor.evict(LEAKED))
    assert evictor.evicted_since("bob", None, started, ("JTI=7f3c2a-leaked",))
    assert not evictor.evicted_since("bob", None, started, ("JTI=other",))


async def test_the_memory_tier_drops_a_users_or_a_tokens_entries_only() -> None:
    store = MemoryStore(100)
    await store.put(b"k1", entry("alice", "aaaaaaaaaaaa"))
    await store.put(b"k2", entry("alice", "cccccccccccc"))
    await store.put(b"k3", entry("bob", "bbbbbbbbbbbb"))
    assert await store.evict_local(ALICE) == 2
    assert await store.get(b"k1") is None and await store.get(b"k3") is not None
    assert await store.evict_local(subjects.token_id("bbbbbbbbbbbb")) == 1
    assert len(store) == 0


async def test_the_memory_tier_drops_the_entries_carrying_a_credential_id_only() -> None:
    store = MemoryStore(100)
    await store.put(b"k1", entry("alice", "aaaaaaaaaaaa", "JTI=7f3c2a-leaked"))
    await store.put(b"k2", entry("alice", "cccccccccccc", "JTI=other"))
    await store.put(b"k3", entry("alice", "dddddddddddd"))
    assert await store.evict_local(LEAKED) == 1
    assert await store.get(b"k1") is None
    assert await store.get(b"k2") is not None and await store.get(b"k3") is not None
