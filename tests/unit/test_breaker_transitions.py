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

import time
from datetime import UTC, datetime

import pybreaker

from authn_gateway.layers.breaker import Breaker, LocalProbePermits
from authn_gateway.layers.breaker.redis import TRANSITIONS
from authn_gateway.layers.breaker.transitions import (
    CLOSED,
    HALF_OPEN,
    OPEN,
    TABLE,
    Count,
    Event,
    Stamp,
)
from tests.support.breaker_transitions_helpers import RESET


# ---- the table itself, and its Lua rendering ----------------------------------------
def test_the_table_has_one_row_for_every_state_and_event() -> None:
    assert set(TABLE) == {(s, e) for s in (CLOSED, OPEN, HALF_OPEN) for e in Event}
    # Our names are pybreaker's: its open()/half_open()/close() keep them.
    assert (CLOSED, OPEN, HALF_OPEN) == (
        pybreaker.STATE_CLOSED,
        pybreaker.STATE_OPEN,
        pybreaker.STATE_HALF_OPEN,
    )


def test_only_a_probe_answer_closes_and_only_a_closed_breaker_counts() -> None:
    closers = {key for key, row in TABLE.items() if row.to == CLOSED and key[0] != CLOSED}
    assert closers == {(HALF_OPEN, Event.PROBE_OK)}
    counters = {key for key, row in TABLE.items() if row.count is Count.ADD}
    assert counters == {(CLOSED, Event.FAIL)}
    stamps = {key for key, row in TABLE.items() if row.stamp is not Stamp.KEEP}
    assert all(TABLE[key].to == OPEN for key in stamps)


def test_lua_rows_render_the_table() -> None:
    for (state, event), row in TABLE.items():
        assert f"['{state} {event}'] = {{'{row.to}', '{row.count}', '{row.stamp}'}}," in (
            TRANSITIONS
        )


def test_time_moved_back_makes_the_probe_due_without_a_sleep() -> None:
    """The harness's Wait moves opened_at back; this is what it relies on."""
    b = Breaker("idp", 1, RESET, LocalProbePermits(1))
    b.hold_open(RESET)
    assert b.fails_fast()
    b.storage.opened_at = datetime.fromtimestamp(time.time() - RESET - 1, UTC)
    assert not b.fails_fast()
