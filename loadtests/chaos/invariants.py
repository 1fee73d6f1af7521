"""The invariants, checked on the IdP's own records and the clients' (the reviews).

What each one holds the fleet to, and where a documented bound is ambiguous under a
combination of faults what is checked instead, is written in loadtests/README.md
("Combined faults"); the constants below are the slack named there.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass, field

from .faults import Applied
from .idp import Call
from .load import Review
from .settings import RunSettings

# After a Redis fault ends (or a one-off like FLUSHALL happens): the replicas' retry
# interval, the epoch check (1 s) and its write-back, and 1.5 s for a loaded host.
REDIS_SETTLE_EXTRA = 2.5
# An admin action reaches every replica within a second (docs/operations.md).
PROPAGATION = 1.0
# Calls the IdP received that a breaker admitted just before it opened (the fleet
# guarantees' tests allow 50 ms).
OPENING_SLACK = 0.05
OUTAGES_THAT_ANSWER = ("idp_hang", "idp_500")

Window = tuple[float, float]


@dataclass
class Check:
    name: str
    ok: bool = True
    detail: str = ""
    violations: list[str] = field(default_factory=list)

    def fail(self, text: str) -> None:
        self.ok = False
        if len(self.violations) < 10:
            self.violations.append(text)


@dataclass
class Replicas:
    """Each gateway process of the run: slot, started and stopped (seconds since t0)."""

    processes: list[tuple[int, float, float | None]]

    def stopped(self, slot: int, started: float) -> float | None:
        """When the process of ``slot`` that started at ``started`` was stopped."""
        for s, began, stopped in self.processes:
            if s == slot and abs(began - started) < 1e-6:
                return stopped
        return None


def _overlaps(a: Window, windows: Iterable[Window]) -> bool:
    return any(a[0] <= w[1] and w[0] <= a[1] for w in windows)


def _inside(t: float, windows: Iterable[Window]) -> bool:
    return any(w[0] <= t <= w[1] for w in windows)


class Checker:
    def __init__(
        self,
        run: RunSettings,
        reviews: list[Review],
        calls: list[Call],
        applied: list[Applied],
        replicas: Replicas,
        rss: list[tuple[float, int, float]],
        t0: float,
    ) -> None:
        self.run = run
        self.reviews = sorted(reviews, key=lambda r: r.sent)
        # IdP calls, seconds since t0; readiness probes apart (they bypass the breaker
        # and the bucket by design: one per cold replica every 2 s).
        self.calls = [c for c in calls if not c.probe]
        self.probes = len(calls) - len(self.calls)
        self.t0 = t0
        self.applied = [a for a in applied if a.failed is None]
        self.replicas = replicas
        self.rss = rss
        settle = run.redis_retry + REDIS_SETTLE_EXTRA
        self.redis_windows: list[Window] = [
            (a.began, a.ended + settle) for a in self.applied if a.fault.lane == "redis"
        ]
        self.forced_closed: list[Window] = [
            (a.began, a.ended + PROPAGATION)
            for a in self.applied
            if a.fault.kind == "breaker_force_closed"
        ]
        self.last_fault_end = max((a.ended for a in applied), default=0.0)
        self._ok_by_user: dict[str, list[float]] = {}
        self._refused_by_user: dict[str, list[float]] = {}
        for c in self.calls:
            if c.user is None or c.ended is None:
                continue
            if c.status == 200:
                self._ok_by_user.setdefault(c.user, []).append(self.rel(c.arrived))
            elif c.status == 401:
                self._refused_by_user.setdefault(c.user, []).append(self.rel(c.arrived))

    def rel(self, monotonic: float) -> float:
        return monotonic - self.t0

    def _idp_ok_after(self, user: str, after: float) -> float | None:
        """When the IdP was next asked about ``user`` and said yes, after ``after``."""
        times = self._ok_by_user.get(user, [])
        i = bisect.bisect_right(times, after)
        return times[i] if i < len(times) else None

    def check_all(self) -> list[Check]:
        return [
            self.identities(),
            self.denied_and_evicted(),
            self.known_users_served(),
            self.recovery(),
            self.idp_window_bound(),
            self.idp_in_flight(),
            self.idp_outage_bound(),
            self.forced_open_silence(),
            self.memory(),
        ]

    # ---- the answers ----

    def identities(self) -> Check:
        check = Check("no review gets another identity or a 5xx")
        for r in self.reviews:
            if r.status is not None and r.status >= 500:
                check.fail(f"t={r.sent:.1f}s replica {r.slot}: HTTP {r.status} ({r.kind})")
            if r.authenticated and (r.user is None or r.username != r.user):
                check.fail(
                    f"t={r.sent:.1f}s replica {r.slot}: a {r.kind} token of {r.user!r} "
                    f"answered as {r.username!r}"
                )
        check.detail = f"{len(self.reviews)} reviews"
        return check

    def _holds_on(self, a: Applied, slot: int | None) -> bool:
        """An admin action holds on every replica when the fleet was told, else on the
        replica that was called only (Redis was down: documented)."""
        return bool(a.fleet) or slot == a.via

    def _holds_from(self, a: Applied, r: Review) -> float:
        """When an admin action holds for the process that answered ``r``: a second after
        it answered; but the other replicas learn it through Redis, so where a Redis
        fault began within that second, or the answering process started during one
        (it could not load the list), from a second after that fault settled."""
        start = a.ended + PROPAGATION
        late = r.slot != a.via or (r.process is not None and r.process > a.began)
        for w in self.redis_windows:
            starts_in = a.began <= w[0] <= start
            born_in = r.process is not None and r.process > a.began and w[0] <= r.process <= w[1]
            if late and (starts_in or born_in):
                start = max(start, w[1] + PROPAGATION)
        return start

    def denied_and_evicted(self) -> Check:
        check = Check("no review gets a denied or evicted identity")
        for a in self.applied:
            user = a.fault.params.get("user")
            if a.fault.kind == "deny":
                # From the answer to the deny call (+1 s to reach every replica) to the lift.
                lift = a.fault.start + a.fault.length
                for r in self._of_user(user):
                    if not r.authenticated or not self._holds_on(a, r.slot):
                        continue
                    if self._holds_from(a, r) <= r.sent and r.done <= lift:
                        check.fail(f"t={r.sent:.1f}s replica {r.slot}: denied {user} served")
            elif a.fault.kind == "evict" and user is not None:
                for r in self._of_user(user):
                    if not r.authenticated or not self._holds_on(a, r.slot):
                        continue
                    if r.sent < self._holds_from(a, r):
                        continue
                    asked = self._idp_ok_after(user, a.began)
                    if asked is None or asked > r.done:
                        check.fail(
                            f"t={r.sent:.1f}-{r.done:.1f}s replica {r.slot}: {user}, evicted "
                            f"at {a.began:.1f}s, served{' stale' if r.stale else ''} before "
                            "the IdP said yes again"
                        )
        return check

    def _of_user(self, user: str | None) -> list[Review]:
        return [r for r in self.reviews if r.user == user]

    # ---- known users are served ----

    def _excused_windows(self, user: str) -> list[Window]:
        """When a known user may be refused: denied, evicted (until the IdP says yes
        again), or refused by the IdP itself (until it says yes again)."""
        windows: list[Window] = []
        for a in self.applied:
            if a.fault.params.get("user") != user:
                continue
            if a.fault.kind == "deny":
                windows.append((a.began, a.ended + PROPAGATION))
            elif a.fault.kind == "evict":
                back = self._idp_ok_after(user, a.began)
                windows.append((a.began, (back if back is not None else 1e9) + PROPAGATION))
        # The IdP's own "no" is cached (negative_ttl_seconds, +10 % jitter) where it was
        # asked, and shared: it may answer until the IdP said yes again and that long.
        kept = self.run.negative_ttl * 1.1
        for refused in self._refused_by_user.get(user, []):
            back = self._idp_ok_after(user, refused)
            until = max(back if back is not None else 1e9, refused + kept)
            # From when a review that waited for that very call may have been sent.
            windows.append((refused - self.run.bounds.total_timeout, until + PROPAGATION))
        return windows

    def _forgotten(self, user: str, t: float) -> int:
        """How many times before ``t`` every replica's copy of ``user`` was dropped (an
        eviction, or a refusal from the IdP replacing it)."""
        times = [
            a.began
            for a in self.applied
            if a.fault.kind == "evict" and a.fault.params.get("user") == user
        ]
        times += self._refused_by_user.get(user, [])
        return sum(1 for x in times if x <= t)

    def known_users_served(self) -> Check:
        check = Check("a known user is served (>= 99 % of their reviews)")
        owed: dict[str, int] = {}
        served: dict[str, int] = {}
        excused = 0
        first_served: dict[tuple[int, float, str, int], float] = {}
        for r in self.reviews:
            if r.kind != "known" or r.user is None:
                continue
            proc = None
            if r.slot is not None and r.process is not None:
                proc = (r.process, self.replicas.stopped(r.slot, r.process))
            # What a process learnt of a user is lost when the user is evicted or refused.
            era = self._forgotten(r.user, r.sent)
            key = (r.slot if r.slot is not None else -1, r.process or 0.0, r.user, era)
            if not r.failed and key not in first_served:
                first_served[key] = r.sent
            if self._excused(r, proc, key, first_served):
                excused += 1
                continue
            owed[r.user] = owed.get(r.user, 0) + 1
            if r.failed:
                check.fail(
                    f"t={r.sent:.1f}s replica {r.slot}: {r.user} not served "
                    f"({r.status} {r.error!r})"
                )
            else:
                served[r.user] = served.get(r.user, 0) + 1
        worst = min((served.get(u, 0) / n for u, n in owed.items()), default=1.0)
        check.ok = worst >= 0.99
        total = sum(owed.values())
        check.detail = (
            f"{sum(served.values())}/{total} owed reviews served, worst user {worst:.1%}; "
            f"{excused} excused"
        )
        return check

    def _excused(
        self,
        r: Review,
        proc: tuple[float, float | None] | None,
        key: tuple[int, float, str, int],
        first_served: dict[tuple[int, float, str, int], float],
    ) -> bool:
        assert r.user is not None
        if _inside(r.sent, self._excused_windows(r.user)):
            return True
        if proc is not None and proc[1] is not None and r.sent <= proc[1] + 0.5 <= r.done + 1:
            return True  # in flight on a replica being killed (a crash loses its reviews)
        # A replica that has not served this user since it started, while Redis is cut,
        # slow or has just lost its data, has nowhere to read the user from.
        learnt = first_served.get(key)
        return (learnt is None or learnt >= r.sent) and _inside(r.sent, self.redis_windows)

    def recovery(self) -> Check:
        check = Check("errors stop within the recovery time after the last fault")
        quiet_from = self.last_fault_end + self.run.recovery_seconds
        late = [r for r in self.reviews if r.sent >= quiet_from and r.failed]
        for r in late:
            if r.user is not None and _inside(r.sent, self._excused_windows(r.user)):
                continue
            check.fail(f"t={r.sent:.1f}s replica {r.slot}: {r.kind} {r.status} {r.error!r}")
        after = sum(1 for r in self.reviews if r.sent >= quiet_from)
        check.detail = (
            f"last fault ended at {self.last_fault_end:.1f}s; {after} reviews from "
            f"{quiet_from:.1f}s on"
        )
        if after == 0:
            check.fail("no reviews after the recovery time: the run ended too early")
        return check

    # ---- what the IdP saw ----

    def _arrivals(self) -> list[float]:
        return sorted(self.rel(c.arrived) for c in self.calls)

    def idp_window_bound(self) -> Check:
        """B + R*(t + jitter) in any window; windows that touch a Redis fault get the
        mixed-mode bound 2B + 2R*(t + jitter) (each local replica adds its share of R on
        top of the shared bucket, and its calls are charged only when it returns)."""
        b = self.run.bounds
        check = Check("the IdP sees at most burst + rate*t in any window")
        arrivals = self._arrivals()
        worst = self._worst_excess(arrivals, b.rate)
        if worst > 2 * (b.burst + b.rate * b.jitter):
            check.fail(f"mixed-mode bound exceeded by {worst - 2 * b.burst:.1f} calls")
        calm = [t for t in arrivals if not _inside(t, self.redis_windows)]
        segments: list[list[float]] = [[]]
        for t in arrivals:
            if _inside(t, self.redis_windows):
                segments.append([])
            else:
                segments[-1].append(t)
        worst_calm = max((self._worst_excess(s, b.rate) for s in segments), default=0.0)
        if worst_calm > b.burst + b.rate * b.jitter:
            check.fail(
                f"{worst_calm:.1f} calls over rate*t in a window without Redis faults "
                f"(burst {b.burst}, jitter allowance {b.rate * b.jitter:.0f})"
            )
        check.detail = (
            f"{len(arrivals)} calls ({len(calm)} outside Redis faults, {self.probes} "
            f"readiness probes apart); most over rate*t: {worst_calm:.1f} calm, "
            f"{worst:.1f} overall"
        )
        return check

    @staticmethod
    def _worst_excess(times: list[float], rate: float) -> float:
        """max over windows [t_i, t_j] of (calls in it) - rate*(t_j - t_i)."""
        worst, low = 0.0, float("inf")
        for k, t in enumerate(times):
            low = min(low, k - rate * t)
            worst = max(worst, k + 1 - rate * t - low)
        return worst

    def idp_in_flight(self) -> Check:
        """At most max_limit in flight (2x while Redis faults mix local and shared
        replicas; n x max_limit while an operator forces the breaker closed); a call
        counts as in flight until the gateway gives up on it, at its
        timeouts.total_seconds, whatever the IdP does with it afterwards."""
        b = self.run.bounds
        check = Check("the IdP has at most max_limit calls in flight")
        edges: list[tuple[float, int]] = []
        for c in self.calls:
            start = self.rel(c.arrived)
            # The slot was taken before the call arrived (by up to the jitter allowance)
            # and is freed at total_timeout after that at the latest: so the part of the
            # call that surely held a slot ends total_timeout - jitter after its arrival.
            end = start + b.total_timeout - b.jitter
            if c.ended is not None:
                end = min(end, self.rel(c.ended))
            edges += [(start, 1), (end, -1)]
        depth = peak = 0
        for t, step in sorted(edges, key=lambda e: (e[0], e[1])):
            depth += step
            limit = 2 * b.max_limit if _inside(t, self.redis_windows) else b.max_limit
            if _inside(t, self.forced_closed):
                # Forced closed skips the fleet's admission (and its slots): each replica
                # holds its own limit, max_limit at most (breaker/redis.py, admit()).
                limit = self.run.replicas * b.max_limit
            if depth > limit:
                check.fail(f"t={t:.1f}s: {depth} calls in flight (limit {limit})")
            peak = max(peak, depth)
        check.detail = f"peak {peak} in flight (max_limit {b.max_limit})"
        return check

    def idp_outage_bound(self) -> Check:
        """During an outage the IdP answers (500s, hangs): fail_max + max_limit calls,
        then half_open_probes per reset_timeout. Where Redis faults overlap, the shared
        bound plus the local one (docs: max(fail_max, n) + max(L, n), n*K probes), plus
        a local breaker's share for each replica restarted meanwhile."""
        b, n = self.run.bounds, self.run.replicas
        check = Check("an IdP outage gets fail_max + max_limit calls, then probes")
        arrivals = self._arrivals()
        for a in self.applied:
            if a.fault.kind not in OUTAGES_THAT_ANSWER:
                continue
            w = (a.began, a.ended)
            if _overlaps(w, self.forced_closed):
                continue  # the breaker is disabled by the operator: bucket and slots only
            lo = bisect.bisect_left(arrivals, w[0])
            hi = bisect.bisect_right(arrivals, w[1] + OPENING_SLACK)
            seen = hi - lo
            rounds = int((w[1] - w[0]) // b.reset_timeout) + 1
            bound = b.fail_max + b.max_limit + b.half_open_probes * rounds
            if _overlaps(w, self.redis_windows):
                restarts = sum(
                    1 for s, started, _ in self.replicas.processes if w[0] <= started <= w[1]
                )
                local = max(b.fail_max, n) + max(b.max_limit, n) + n * b.half_open_probes * rounds
                share = max(1, b.fail_max // n) + max(1, b.max_limit // n) + b.half_open_probes
                bound += local + restarts * share
            if seen > bound:
                check.fail(
                    f"#{a.fault.index} {a.fault.kind} {w[0]:.1f}-{w[1]:.1f}s: the IdP got "
                    f"{seen} calls, bound {bound}"
                )
            check.detail += f"#{a.fault.index}: {seen}/{bound} "
        return check

    def forced_open_silence(self) -> Check:
        check = Check("a breaker forced open fleet-wide calls no IdP")
        arrivals = self._arrivals()
        for a in self.applied:
            if a.fault.kind != "breaker_force_open" or not a.fleet:
                continue
            w = (a.began + PROPAGATION, a.fault.start + a.fault.length)
            if w[1] <= w[0] or _overlaps(w, self.redis_windows):
                continue
            seen = bisect.bisect_right(arrivals, w[1]) - bisect.bisect_left(arrivals, w[0])
            if seen:
                check.fail(f"#{a.fault.index} {w[0]:.1f}-{w[1]:.1f}s: {seen} calls")
        return check

    def memory(self) -> Check:
        bound = self.run.memory_bound_mib
        check = Check(f"each replica's RSS stays under {bound:.0f} MiB")
        peak = max((mib for _, _, mib in self.rss), default=0.0)
        for t, slot, mib in self.rss:
            if mib > bound:
                check.fail(f"t={t:.1f}s replica {slot}: {mib:.0f} MiB")
        check.detail = f"peak {peak:.0f} MiB"
        return check
