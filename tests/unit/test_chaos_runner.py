"""The chaos runner's own parts (loadtests/chaos): schedules replay from their seed, the
shrinker finds the faults that matter, and the checkers catch what they are for. No
fleet here; the seeded runs against a real fleet are in test_chaos_seeds.py."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loadtests.chaos.faults import Applied
from loadtests.chaos.idp import Call
from loadtests.chaos.invariants import Checker, Replicas
from loadtests.chaos.load import Review
from loadtests.chaos.plot import plot, summary
from loadtests.chaos.run import Outcome
from loadtests.chaos.schedule import LANES, Fault, generate
from loadtests.chaos.settings import RunSettings
from loadtests.chaos.shrink import ddmin


def test_a_seed_gives_the_same_schedule_every_time_and_another_seed_another() -> None:
    first = generate(7, 4.0, 50.0, 3, 20)
    again = generate(7, 4.0, 50.0, 3, 20)
    assert [f.to_json() for f in first] == [f.to_json() for f in again]
    assert [f.to_json() for f in first] != [f.to_json() for f in generate(8, 4.0, 50.0, 3, 20)]


@settings(deadline=None)
@given(st.integers(min_value=0, max_value=10**9), st.integers(min_value=1, max_value=6))
def test_faults_stay_in_their_window_and_a_lane_never_overlaps_itself(
    seed: int, replicas: int
) -> None:
    faults = generate(seed, 4.0, 60.0, replicas, 20)
    assert faults, "a minute of faults drew none"
    assert [f.index for f in faults] == list(range(len(faults)))
    for f in faults:
        assert f.start >= 4.0 and f.end <= 60.0, f.describe()
        assert f.kind in dict(LANES[f.lane]), f.describe()
        if "replica" in f.params:
            assert 0 <= f.params["replica"] < replicas
    for lane in LANES:
        mine = [f for f in faults if f.lane == lane]
        for a, b in itertools.pairwise(mine):
            assert a.end <= b.start, f"{a.describe()} overlaps {b.describe()}"


@settings(deadline=None)
@given(st.data())
def test_the_shrinker_keeps_exactly_the_faults_the_failure_needs(data: st.DataObject) -> None:
    n = data.draw(st.integers(min_value=1, max_value=24))
    faults = [Fault(i, "idp_500", "idp", float(i), 1.0) for i in range(n)]
    culprits = data.draw(st.sets(st.integers(min_value=0, max_value=n - 1), min_size=1))
    runs = []

    def fails(candidate: list[Fault]) -> bool:
        runs.append(len(candidate))
        return culprits <= {f.index for f in candidate}

    assert {f.index for f in ddmin(faults, fails)} == culprits
    assert len(runs) <= max(4, 2 * n * n), f"{len(runs)} runs for {n} faults"


@settings(deadline=None)
@given(
    st.lists(st.floats(min_value=0, max_value=20, allow_nan=False), max_size=40),
    st.floats(min_value=0.5, max_value=50),
)
def test_the_window_bound_is_the_worst_window_counted_by_hand(
    times: list[float], rate: float
) -> None:
    times = sorted(times)
    by_hand = max(
        (
            j - i + 1 - rate * (times[j] - times[i])
            for i in range(len(times))
            for j in range(i, len(times))
        ),
        default=0.0,
    )
    assert abs(Checker._worst_excess(times, rate) - by_hand) < 1e-6


RUN = RunSettings(seed=1, duration=30, replicas=2)


def checker(reviews: list[Review], calls: list[Call] = (), applied: list[Applied] = ()) -> Checker:  # type: ignore[assignment]
    return Checker(
        RUN, reviews, list(calls), list(applied), Replicas([(0, -5, None), (1, -5, None)]), [], 0.0
    )


def served(
    t: float, slot: int, user: str, as_user: str | None = None, kind: str = "known"
) -> Review:
    return Review(t, t + 0.01, slot, -5.0, kind, user, 200, True, as_user or user)


def test_an_answer_naming_another_user_or_a_5xx_is_caught() -> None:
    check = checker(
        [served(1, 0, "known1", "known2"), Review(2, 2, 1, -5.0, "junk", None, 503)]
    ).identities()
    assert not check.ok and len(check.violations) == 2, check


def test_an_evicted_user_served_before_the_idp_said_yes_again_is_caught() -> None:
    evict = Fault(0, "evict", "admin", 5.0, 0.0, {"user": "known1", "via": 0})
    applied = [Applied(evict, 5.0, 5.1, fleet=True, via=0)]
    late_yes = Call(8.0, 8.01, 200, "known1", False)
    assert not checker([served(7, 1, "known1")], [late_yes], applied).denied_and_evicted().ok
    # After the IdP said yes again, serving is right.
    assert checker([served(9, 1, "known1")], [late_yes], applied).denied_and_evicted().ok
    # Not told to the fleet (Redis down): it holds on the replica that was called only.
    applied[0].fleet = False
    assert checker([served(7, 1, "known1")], [], applied).denied_and_evicted().ok
    assert not checker([served(7, 0, "known1")], [], applied).denied_and_evicted().ok


def test_a_known_user_refused_is_caught_unless_the_idp_refused_them_first() -> None:
    refused = Review(10, 10.01, 0, -5.0, "known", "known3", 200, error="idp: circuit breaker open")
    reviews = [served(t, 0, "known3") for t in range(1, 10)] + [refused]
    assert not checker(reviews).known_users_served().ok
    idp_said_no = Call(9.5, 9.6, 401, "known3", False)
    assert checker(reviews, [idp_said_no]).known_users_served().ok


def small_run() -> Outcome:
    fault = Fault(0, "idp_500", "idp", 2.0, 3.0)
    outcome = Outcome(
        RUN,
        [fault],
        applied=[Applied(fault, 2.0, 5.0)],
        reviews=[served(t / 2, 0, "known1") for t in range(20)],
        calls=[(t / 3, Call(t / 3, t / 3 + 0.01, 200, "known1", False)) for t in range(20)],
        ended=10.0,
    )
    outcome.checks = checker(outcome.reviews).check_all()
    return outcome


def test_a_run_is_summarised() -> None:
    doc = summary(small_run())
    assert doc["seed"] == 1 and doc["per_second"]["known_served_share"][0] == 1.0, doc


def test_a_run_is_drawn(tmp_path: Path) -> None:
    # The drawing is the loadtest extra's (matplotlib); the unit tier runs without it.
    pytest.importorskip("matplotlib", reason="the loadtest extra draws the plots")
    plot(small_run(), tmp_path / "run.png")
    assert (tmp_path / "run.png").stat().st_size > 10_000


def test_a_rolls_new_process_is_not_credited_with_what_the_old_one_served() -> None:
    # During a roll the new process shares its slot with the old one until the swap; a
    # user the old one served is not known to the new one, which has nowhere to read
    # them from while Redis is cut: excused. The same process failing them is not.
    cut = Fault(0, "redis_cut", "redis", 10.0, 5.0)
    applied = [Applied(cut, 10.0, 15.0)]
    old = served(9.0, 1, "known4")
    new_process = Review(12.0, 12.01, 1, 11.0, "known", "known4", 200, error="breaker open")
    check = Checker(
        RUN, [old, new_process], [], applied, Replicas([(1, -5.0, 11.5), (1, 11.0, None)]), [], 0.0
    )
    assert check.known_users_served().ok
    same_process = Review(12.0, 12.01, 1, -5.0, "known", "known4", 200, error="breaker open")
    check = Checker(RUN, [old, same_process], [], applied, Replicas([(1, -5.0, None)]), [], 0.0)
    assert not check.known_users_served().ok
