"""One state machine (breaker/transitions.py): the in-process Breaker and the fleet's Lua
scripts on a real Redis are fed the same event sequences and must agree after every one.

Each sequence drives both through their public interface, as the breaker layer does:
admissions (a normal call, a probe, a refusal, a busy answer), finished calls settled
ok or failed (in any order: a call admitted while closed may finish after the breaker
opened), tickets given back unused, Retry-After holds, and the probe time passing (the
breakers' ``opened_at`` moved back in both stores, never a sleep). After each step the
state, the failure count, the time until the next probe and the transitions heard so
far must be the same.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from authn_gateway.config import RedisSettings
from authn_gateway.fleet.redis_link import RedisLink
from authn_gateway.layers.breaker import BUSY, Breaker, LocalProbePermits, MemoryOverrides, Ticket
from authn_gateway.layers.breaker.redis import TRANSITIONS, FleetBreaker, FleetTicket
from authn_gateway.layers.breaker.transitions import (
    CLOSED,
    HALF_OPEN,
    OPEN,
    TABLE,
    Event,
    finished,
    step,
)
from authn_gateway.observe.metrics import Metrics
from backends.base import Authenticated, Unavailable, UserInfo
from tests.support.breaker_transitions_helpers import RESET
from tests.support.redis_server import RedisServer

OK, DOWN = Authenticated(UserInfo("u")), Unavailable("down")


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("redis")).start()
    yield server
    server.stop()


# ---- the actions a sequence is made of ------------------------------------------------
@dataclass(frozen=True)
class Admit:
    """A call asks to go out."""


@dataclass(frozen=True)
class Settle:
    """An admitted call (the ``pick``-th still out) finishes, healthy or not."""

    pick: int
    failed: bool


@dataclass(frozen=True)
class Release:
    """An admitted call is never made (the bucket said no): its ticket comes back."""

    pick: int


@dataclass(frozen=True)
class Hold:
    """The IdP sent Retry-After: ``seconds`` (shorter or longer than reset_timeout)."""

    seconds: float


@dataclass(frozen=True)
class Wait:
    """Time passes until the probe is due (opened_at moved back in both stores)."""


@dataclass(frozen=True)
class Age:
    """Ten seconds pass (opened_at moved back in both stores): a later re-stamp of
    opened_at is then ten seconds apart, not a few milliseconds."""


Action = Admit | Settle | Release | Hold | Wait | Age

picks = st.integers(0, 7)

KINDS: dict[str, st.SearchStrategy[Action]] = {
    "admit": st.just(Admit()),
    "fail": st.builds(Settle, picks, st.just(True)),
    "ok": st.builds(Settle, picks, st.just(False)),
    "release": st.builds(Release, picks),
    "hold": st.builds(Hold, st.sampled_from([30.0, 120.0])),
    "wait": st.just(Wait()),
    "age": st.just(Age()),
}

# Where a sequence starts: each state, with a normal call out that was admitted while
# closed (the late answers are where the breakers used to part ways), and probes out.
TWO_PROBES: list[Action] = [Admit(), Hold(30.0), Wait(), Admit(), Admit()]

STARTS: list[list[Action]] = [
    [],
    [Admit()],
    [Admit(), Hold(30.0)],
    [Admit(), Hold(30.0), Wait(), Admit()],
    TWO_PROBES,
    [*TWO_PROBES, Settle(2, failed=False)],  # closed, a probe still out
    [*TWO_PROBES, Settle(2, failed=True)],  # open again, a probe still out
]


@st.composite
def sequences(draw: st.DrawFn) -> list[Action]:
    """A start, then swarm testing: each sequence uses a few kinds of action only, so
    that rare orders of those few come up far more often than in a mix of all seven."""
    start = draw(st.sampled_from(STARTS))
    kinds = sorted(draw(st.sets(st.sampled_from(sorted(KINDS)), min_size=3)))
    # Admissions twice as often: most events need a call out.
    allowed = [KINDS[kind] for kind in kinds] + [KINDS["admit"]]
    return start + draw(st.lists(st.one_of(*allowed), min_size=2, max_size=30))


# ---- the two breakers, side by side ---------------------------------------------------
@dataclass
class Pair:
    local: Breaker
    fleet: FleetBreaker
    link: RedisLink
    pending: list[Awaitable[Any]]
    heard: dict[str, list[str]] = field(default_factory=lambda: {"local": [], "fleet": []})
    out: list[tuple[Ticket, Ticket]] = field(default_factory=list)
    seen: list[str] = field(default_factory=list)  # what happened, for a failure's message
    rows: set[tuple[str, Event]] = field(default_factory=set)  # the rows the sequence took


def pair(link: RedisLink, fail_max: int, probes: int, in_flight: int) -> Pair:
    name = f"idp-{uuid.uuid4().hex[:8]}"
    pending: list[Awaitable[Any]] = []
    heard: dict[str, list[str]] = {"local": [], "fleet": []}
    local = Breaker(
        name,
        fail_max,
        RESET,
        LocalProbePermits(probes),
        on_transition=lambda _, old, new: heard["local"].append(f"{old}->{new}"),
        max_in_flight=in_flight,
    )
    fleet = FleetBreaker(
        name,
        fail_max,
        RESET,
        probes,
        in_flight,
        600.0,
        link,
        # Its own fallback for Redis down, never used here: Redis stays up.
        Breaker(name, fail_max, RESET, LocalProbePermits(probes), max_in_flight=in_flight),
        pending.append,
        MemoryOverrides(),
        on_transition=lambda _, old, new: heard["fleet"].append(f"{old}->{new}"),
    )
    return Pair(local, fleet, link, pending, heard)


def verdict(ticket: Ticket | None) -> str:
    if ticket is None:
        return "refused"
    if ticket is BUSY:
        return "busy"
    probe = ticket.probe if isinstance(ticket, FleetTicket) else ticket.permit is not None
    return "probe" if probe else "call"


async def do(p: Pair, action: Action) -> None:
    """Apply ``action`` to both breakers, and let the fleet's scripts answer."""
    state = p.local.machine_state
    if isinstance(action, Admit):
        local, fleet = await p.local.admit(), await p.fleet.admit()
        await settled(p)
        p.seen.append(f"admit: {verdict(local)} / {verdict(fleet)}")
        assert verdict(local) == verdict(fleet), p.seen
        if local is not None and local is not BUSY:
            assert fleet is not None
            p.out.append((local, fleet))
            if verdict(local) == "probe":
                p.rows.add((state, Event.DUE))
    elif isinstance(action, Settle | Release):
        if not p.out:
            return
        local, fleet = p.out.pop(action.pick % len(p.out))
        if isinstance(action, Release):
            p.seen.append(f"release a {verdict(local)}")
            p.rows.add((state, Event.RELEASE))
            p.local.release(local)
            p.fleet.release(fleet)
        else:
            p.seen.append(f"a {verdict(local)} {'fails' if action.failed else 'is ok'}")
            probe = verdict(local) == "probe"
            p.rows.add((state, finished(probe, action.failed)))
            outcome = DOWN if action.failed else OK
            p.local.record(local, outcome, 0.01)
            p.fleet.record(fleet, outcome, 0.01)
    elif isinstance(action, Hold):
        p.seen.append(f"hold {action.seconds:g} s")
        p.rows.add((state, Event.TRIP))
        p.local.hold_open(action.seconds)
        p.fleet.hold_open(action.seconds)
    elif isinstance(action, Wait):
        p.seen.append("the probe comes due")
        await move_opened_at(p, lambda _: time.time() - RESET - 1)
    else:
        p.seen.append("ten seconds pass")
        await move_opened_at(p, lambda opened: opened - 10.0)
    await settled(p)


async def settled(p: Pair) -> None:
    while p.pending:
        work, p.pending[:] = list(p.pending), []
        await asyncio.gather(*work)


async def move_opened_at(p: Pair, to: Callable[[float], float]) -> None:
    """Move an open breaker's opened_at back, in both stores (and in the fleet breaker's
    mirror, as its sync would): time passing, without a sleep."""
    opened = p.local.storage.opened_at
    if p.local.machine_state == OPEN and opened is not None:
        p.local.storage.opened_at = datetime.fromtimestamp(to(opened.timestamp()), UTC)
    key = p.fleet.keys.state
    state, stored = await p.link.client.hmget(key, "state", "opened_at")
    if state == b"open":
        moved = to(float(stored))
        await p.link.client.hset(key, "opened_at", repr(moved))
        p.fleet.adopt(OPEN, moved)


@dataclass(frozen=True)
class Seen:
    state: str
    failures: int
    until_probe: float


async def observe(p: Pair) -> tuple[Seen, Seen]:
    """Each breaker's state, count and seconds to the next probe: the in-process one from
    itself, the fleet's from Redis (its mirror must say the same state)."""
    local = Seen(p.local.machine_state, p.local.failures, p.local.seconds_until_probe())
    fields = await p.link.client.hmget(p.fleet.keys.state, "state", "opened_at")
    state = fields[0].decode() if fields[0] else CLOSED
    failures = int(await p.link.client.get(p.fleet.keys.failures) or 0)
    opened = float(fields[1] or 0)
    until = max(0.0, opened + RESET - time.time()) if state == OPEN else 0.0
    assert p.fleet.machine_state == state, (p.seen, "mirror", p.fleet.machine_state, state)
    return local, Seen(state, failures, until)


async def run(
    redis_server: RedisServer,
    sequence: list[Action],
    fail_max: int = 3,
    probes: int = 2,
    in_flight: int = 4,
) -> Pair:
    """Feed ``sequence`` to both breakers, comparing them after every action."""
    settings = RedisSettings(
        url=redis_server.url, key_prefix=f"t{uuid.uuid4().hex[:8]}", timeout_seconds=5.0
    )
    link = RedisLink(settings, Metrics())
    p = pair(link, fail_max, probes, in_flight)
    try:
        for action in sequence:
            await do(p, action)
            local, fleet = await observe(p)
            assert (local.state, local.failures) == (fleet.state, fleet.failures), (
                p.seen,
                local,
                fleet,
            )
            # The same probe time, to within the two clocks' reading apart.
            assert abs(local.until_probe - fleet.until_probe) < 1.0, (p.seen, local, fleet)
            assert p.local.fails_fast() == p.fleet.fails_fast(), (p.seen, local, fleet)
            assert p.heard["local"] == p.heard["fleet"], (p.seen, p.heard)
        return p
    finally:
        await link.close()


# ---- the same sequences to both --------------------------------------------------------
# Three times the profile's examples (a few seconds): rare orders of events need them.
@settings(max_examples=3 * settings().max_examples)
@given(
    sequence=sequences(),
    fail_max=st.integers(1, 4),
    probes=st.integers(1, 2),
    in_flight=st.integers(2, 5),
)
def test_both_breakers_follow_one_table(
    redis_server: RedisServer, sequence: list[Action], fail_max: int, probes: int, in_flight: int
) -> None:
    asyncio.run(run(redis_server, sequence, fail_max, probes, in_flight))


def opened(fail_max: int = 3) -> list[Action]:
    """``fail_max`` calls admitted and failed (the latest first): open."""
    return [Admit()] * fail_max + [Settle(-1, failed=True)] * fail_max


# ---- every row, reached on purpose ----------------------------------------------------
# Each starts with one normal call out (admitted while closed, index 0), then reaches the
# state with, where it can, a probe out too (index 1).
EVENTS: dict[Event, list[Action]] = {
    Event.OK: [Settle(0, failed=False)],
    Event.FAIL: [Settle(0, failed=True)],
    Event.PROBE_OK: [Settle(1, failed=False)],
    Event.PROBE_FAIL: [Settle(1, failed=True)],
    Event.DUE: [Wait(), Admit()],
    Event.TRIP: [Hold(30.0)],
    Event.RELEASE: [Release(0)],
}


def reach(state: str) -> list[Action]:
    """From closed with one normal call out, to ``state`` with a probe out as well."""
    probes_out = [*opened(), Wait(), Admit(), Admit()]  # two probes: index 1 and 2
    if state == CLOSED:
        return [*probes_out, Settle(2, failed=False)]  # the second probe closes it
    if state == OPEN:
        return [*probes_out, Settle(2, failed=True)]  # the second probe re-opens it
    return [*opened(), Wait(), Admit()]


@pytest.mark.parametrize(
    ("state", "event"),
    # A closed breaker has no probe time to come due: admit.lua and Breaker only take
    # that row's event on the probe path (its row keeps everything as it is).
    [key for key in TABLE if key != (CLOSED, Event.DUE)],
    ids=lambda v: str(v),
)
async def test_every_row_the_same_in_both_and_as_the_table_says(
    redis_server: RedisServer, state: str, event: Event
) -> None:
    # Ten seconds on, so that an event that re-stamps opened_at shows.
    before = [Admit(), *reach(state), Age()]
    p = await run(redis_server, before, probes=2)
    assert p.local.machine_state == state, p.seen
    p = await run(redis_server, [*before, *EVENTS[event]], probes=2)
    assert (state, event) in p.rows, (p.seen, p.rows)
    assert p.local.machine_state == TABLE[(state, event)].to, p.seen


# ---- the in-process breaker's old departures from the table, by name -------------------
async def test_a_late_normal_success_does_not_close_a_half_open_breaker(
    redis_server: RedisServer,
) -> None:
    """pybreaker's call() closed a half-open breaker on any success: one slow call admitted
    before the outage, answering late, let every waiting call through at once."""
    early = [Admit()]  # out since before the outage
    p = await run(redis_server, early + opened() + [Wait(), Admit(), Settle(0, failed=False)])
    assert p.local.machine_state == HALF_OPEN, p.seen
    assert verdict(p.out[0][0]) == "probe", p.seen  # the probe is still out


async def test_a_late_normal_failure_does_not_reopen_a_half_open_breaker(
    redis_server: RedisServer,
) -> None:
    p = await run(redis_server, [Admit(), *opened(), Wait(), Admit(), Settle(0, failed=True)])
    assert p.local.machine_state == HALF_OPEN, p.seen
    p = await run(redis_server, [Admit(), *opened(), Wait(), Admit(), Settle(1, failed=False)])
    assert p.local.machine_state == CLOSED, p.seen  # the probe's answer closes it


async def test_a_late_success_once_the_probe_is_due_leaves_the_breaker_open(
    redis_server: RedisServer,
) -> None:
    """pybreaker's call() on an open breaker past its timeout went half-open inside the
    record, and the late success closed it with no probe made."""
    p = await run(redis_server, [Admit(), *opened(), Wait(), Settle(0, failed=False)])
    assert p.local.machine_state == OPEN, p.seen
    assert not p.local.fails_fast(), p.seen  # and the next admission is a probe


async def test_a_shorter_retry_after_never_shortens_a_longer_hold(
    redis_server: RedisServer,
) -> None:
    p = await run(redis_server, [Hold(120.0), Hold(30.0)])
    assert p.local.seconds_until_probe() > 100, p.seen


async def test_open_goes_half_open_only_when_a_probe_gets_its_permit(
    redis_server: RedisServer,
) -> None:
    """One permit, held by a probe still out when a Retry-After re-opened the breaker:
    once the probe time comes, the next admission is refused and the breaker stays open
    (the in-process breaker went half-open first, then found no permit)."""
    sequence = [*opened(), Wait(), Admit(), Hold(30.0), Wait(), Admit()]
    p = await run(redis_server, sequence, probes=1)
    assert p.local.machine_state == OPEN, p.seen
    assert p.seen[-1] == "admit: refused / refused", p.seen


async def test_a_probe_failing_after_another_closed_the_breaker_opens_it(
    redis_server: RedisServer,
) -> None:
    """Two probes out; one closes the breaker, the other then fails: open again at once
    (the in-process breaker counted it as one failure of a closed breaker)."""
    sequence = [
        *opened(fail_max=3),
        Wait(),
        Admit(),
        Admit(),
        Settle(0, failed=False),
        Settle(0, failed=True),
    ]
    p = await run(redis_server, sequence, probes=2)
    assert p.local.machine_state == OPEN, p.seen


async def test_no_probe_while_every_slot_is_taken_and_the_breaker_stays_open(
    redis_server: RedisServer,
) -> None:
    """The in-flight ceiling full of calls admitted before a Retry-After opened it: the
    probe's admission is busy, and only an admission that goes out moves open to
    half-open."""
    sequence = [Admit(), Admit(), Admit(), Hold(30.0), Wait(), Admit()]
    p = await run(redis_server, sequence, in_flight=3)
    assert p.seen[-1] == "admit: busy / busy", p.seen
    assert p.local.machine_state == OPEN, p.seen


async def test_lua_step_gives_what_python_step_gives_for_every_row(
    redis_server: RedisServer,
) -> None:
    """transitions.lua's step, run by Redis over the rendered table, against every row,
    failure count and trip time that matter."""
    cases = [
        (state, event, failures, opened, trip)
        for (state, event) in TABLE
        for failures in (0, 1, 2)
        for opened in (1000.0, 5000.0)
        for trip in (0.0, 3000.0)
    ]
    body = """
local out = {}
for i = 1, #ARGV, 5 do
  local to, failures, opened = step(ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2]),
    tonumber(ARGV[i + 3]), 2000, 3, tonumber(ARGV[i + 4]))
  out[#out + 1] = to .. ' ' .. failures .. ' ' .. string.format('%.1f', opened)
end
return out
"""
    args = [str(v) for case in cases for v in case]
    link = RedisLink(RedisSettings(url=redis_server.url, timeout_seconds=5.0), Metrics())
    try:
        answers = await link.client.eval(TRANSITIONS + body, 0, *args)
    finally:
        await link.close()
    for case, answer in zip(cases, answers, strict=True):
        state, event, failures, opened, trip = case
        want = step(state, event, failures, opened, now=2000, fail_max=3, trip_opened_at=trip)
        assert answer.decode() == f"{want.state} {want.failures} {want.opened_at:.1f}", case
