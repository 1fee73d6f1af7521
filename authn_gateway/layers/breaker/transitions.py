"""The breaker's state machine, as one table: (state, event) -> what follows.

Both breakers follow this table and nothing else: the in-process :class:`.machine.Breaker`
applies :func:`step` to its own store, and the fleet's Lua scripts (``admit.lua``,
``settle.lua``, ``hold.lua``) apply the same rows on Redis, rendered into Lua by
:func:`lua_rows` and put in front of each script with ``transitions.lua`` (the same
``step`` in Lua). ``tests/{process,unit}/test_breaker_transitions.py`` feeds both the same event
sequences and compares them after every event.

Times are Unix seconds. ``opened_at`` is when the breaker opened, as far as the next
probe goes: a probe may go out from ``opened_at + reset_timeout``. A hold (Retry-After)
moves it forward so that this sum is the time asked for.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

CLOSED, OPEN, HALF_OPEN = "closed", "open", "half-open"
STATES = (CLOSED, OPEN, HALF_OPEN, "forced_open", "forced_closed")


class Event(enum.StrEnum):
    #: A normal call's healthy answer (a rejected token is a healthy answer too).
    OK = "ok"
    #: A normal call's failure: unavailable, and the IdP's doing.
    FAIL = "fail"
    #: A half-open probe's healthy answer.
    PROBE_OK = "probe_ok"
    #: A half-open probe's failure.
    PROBE_FAIL = "probe_fail"
    #: An admission once the probe time has come, with a probe permit free.
    DUE = "due"
    #: Open until a given probe time: the IdP's Retry-After, a failure-rate or slow-call
    #: rule, or a fleet replica that opened its breaker locally while Redis was down.
    TRIP = "trip"
    #: A ticket given back unused (the call was never made).
    RELEASE = "release"


class Count(enum.StrEnum):
    """What happens to the count of consecutive failures."""

    KEEP = "keep"
    RESET = "reset"
    #: One more; the ``fail_max``-th opens the breaker (see :func:`step`).
    ADD = "add"


class Stamp(enum.StrEnum):
    """What happens to ``opened_at``."""

    KEEP = "keep"
    #: Opened now: the next probe after ``reset_timeout``.
    NOW = "now"
    #: The trip's ``opened_at``, unless already open with a later one.
    TRIP = "trip"


def finished(probe: bool, failed: bool) -> Event:
    """The event a finished call is (settle.lua names it the same way)."""
    if probe:
        return Event.PROBE_FAIL if failed else Event.PROBE_OK
    return Event.FAIL if failed else Event.OK


@dataclass(frozen=True)
class Row:
    to: str
    count: Count = Count.KEEP
    stamp: Stamp = Stamp.KEEP


# Why each row is what it is:
# * Only a probe's answer closes the breaker. A normal call admitted while closed may
#   answer after the breaker opened or went half-open; a late success then says nothing
#   about the IdP now, and closing on it would let every waiting call through at once.
# * A normal call's failure counts only while closed: one that started before the
#   breaker opened and failed after it is already accounted for by the opening.
# * A probe's failure opens the breaker now, from any state.
# * DUE moves open to half-open only at an admission that got a probe permit.
# * A trip never shortens a longer hold already in force.
TABLE: dict[tuple[str, Event], Row] = {
    (CLOSED, Event.OK): Row(CLOSED, Count.RESET),
    (CLOSED, Event.FAIL): Row(CLOSED, Count.ADD),
    (CLOSED, Event.PROBE_OK): Row(CLOSED, Count.RESET),
    (CLOSED, Event.PROBE_FAIL): Row(OPEN, Count.RESET, Stamp.NOW),
    (CLOSED, Event.DUE): Row(CLOSED),
    (CLOSED, Event.TRIP): Row(OPEN, Count.RESET, Stamp.TRIP),
    (CLOSED, Event.RELEASE): Row(CLOSED),
    (OPEN, Event.OK): Row(OPEN, Count.RESET),
    (OPEN, Event.FAIL): Row(OPEN),
    (OPEN, Event.PROBE_OK): Row(OPEN, Count.RESET),
    (OPEN, Event.PROBE_FAIL): Row(OPEN, Count.RESET, Stamp.NOW),
    (OPEN, Event.DUE): Row(HALF_OPEN),
    (OPEN, Event.TRIP): Row(OPEN, Count.RESET, Stamp.TRIP),
    (OPEN, Event.RELEASE): Row(OPEN),
    (HALF_OPEN, Event.OK): Row(HALF_OPEN, Count.RESET),
    (HALF_OPEN, Event.FAIL): Row(HALF_OPEN),
    (HALF_OPEN, Event.PROBE_OK): Row(CLOSED, Count.RESET),
    (HALF_OPEN, Event.PROBE_FAIL): Row(OPEN, Count.RESET, Stamp.NOW),
    (HALF_OPEN, Event.DUE): Row(HALF_OPEN),
    (HALF_OPEN, Event.TRIP): Row(OPEN, Count.RESET, Stamp.TRIP),
    (HALF_OPEN, Event.RELEASE): Row(HALF_OPEN),
}


@dataclass(frozen=True)
class Step:
    """Where one event leaves the breaker."""

    state: str
    failures: int
    opened_at: float


def step(
    state: str,
    event: Event,
    failures: int,
    opened_at: float,
    *,
    now: float,
    fail_max: int,
    trip_opened_at: float = 0.0,
) -> Step:
    """Apply ``event`` by :data:`TABLE`. ``trip_opened_at`` is a :attr:`Event.TRIP`'s
    ``opened_at`` (the probe time asked for, less ``reset_timeout``)."""
    row = TABLE[(state, event)]
    to, stamp = row.to, row.stamp
    if row.count is Count.ADD:
        failures += 1
        if failures >= fail_max:
            to, failures, stamp = OPEN, 0, Stamp.NOW
    elif row.count is Count.RESET:
        failures = 0
    if stamp is Stamp.NOW:
        opened_at = now
    elif stamp is Stamp.TRIP and not (state == OPEN and opened_at >= trip_opened_at):
        opened_at = trip_opened_at
    return Step(to, failures, opened_at)


def lua_rows() -> str:
    """:data:`TABLE` as a Lua table, ``ROWS['state event'] = {to, count, stamp}``, for
    ``transitions.lua`` and the scripts that include it."""
    lines = ["local ROWS = {"]
    for (state, event), row in TABLE.items():
        lines.append(f"  ['{state} {event}'] = {{'{row.to}', '{row.count}', '{row.stamp}'}},")
    lines.append("}")
    return "\n".join(lines) + "\n"
