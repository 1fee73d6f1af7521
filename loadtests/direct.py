"""The brownout's reference: a client that calls the brownout IdP directly, no gateway.

``python -m loadtests.direct`` (also run by ``python -m loadtests.run brownout``, side by
side with the gateway). It offers the calls the gateway would have to make in issue
#15's brownout: never-seen tokens at 30 % of 300 reviews/s (90 calls/s, no fallback) and
the refreshes of 200 known users whose 5 s TTL ran out (40 calls/s, which could be
answered stale), each a Poisson stream, each call with the review's 1 s deadline. The
fake IdP serves 80/s (4 at once, 50 ms each, FIFO).

Variants, each on a fresh IdP queue and counters:

* ``fixed-6, cold first``: at most 6 calls in flight; waiting calls for never-seen
  tokens go before refreshes; a waiter whose deadline passed is never sent.
* ``fixed-6, arrival order``: the same limit, first come first served.
* ``gateway limiter``: the gateway's own :class:`ConcurrencyLimiter` and Vegas limit
  (authn_gateway/layers/concurrency/), cold first, in this light process: the algorithm without the
  gateway's own CPU cost, to tell one from the other.

Every figure is the IdP's own (``/_fake/stats``) except "cold authenticated/s", which
counts 200 answers the client read before its deadline.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from authn_gateway.layers.concurrency.slots import ConcurrencyLimiter, Priority, Refusal, Slot
from authn_gateway.layers.concurrency.vegas import VegasLimit

COLD, REFRESH = Priority.NO_FALLBACK, Priority.HAS_FALLBACK


@dataclass
class Load:
    cold_per_s: float = 90.0
    refresh_per_s: float = 40.0
    deadline: float = 1.0


@dataclass
class Counts:
    authenticated: dict[Priority, int] = field(default_factory=lambda: {COLD: 0, REFRESH: 0})
    refused: int = 0  # never sent: no slot in time
    late: int = 0  # sent, but the answer came after the deadline (or none)


class FixedLimit:
    """At most ``limit`` calls in flight; waiters by priority, or in arrival order.

    As the gateway's limiter does, a waiter gives up once a slot could no longer let its
    call finish by its deadline (the deadline less the recent call latency): a call
    sent with too little time left would be abandoned in the IdP's queue, and its slot
    handed on while the IdP still works for nobody."""

    def __init__(self, limit: int, by_priority: bool) -> None:
        self.limit = limit
        self.by_priority = by_priority
        self.in_flight = 0
        self.recent = 0.0  # exponential mean of call latency (s)
        self._waiting: dict[Priority, deque[asyncio.Future[None]]] = {p: deque() for p in Priority}

    async def acquire(self, priority: Priority, deadline: float) -> bool:
        if self.in_flight < self.limit and not any(self._waiting.values()):
            self.in_flight += 1
            return True
        queue = self._waiting[priority if self.by_priority else COLD]
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        queue.append(future)
        try:
            async with asyncio.timeout_at(deadline - self.recent):
                await future
        except TimeoutError:
            if future.done() and not future.cancelled():
                self.release()  # granted at the very moment we gave up
            return False
        finally:
            if future in queue:
                queue.remove(future)
        return True

    def release(self, latency: float | None = None) -> None:
        if latency is not None:
            self.recent += 0.1 * (latency - self.recent)
        self.in_flight -= 1
        for p in Priority:
            queue = self._waiting[p]
            while queue and self.in_flight < self.limit:
                future = queue.popleft()
                if not future.done():
                    self.in_flight += 1
                    future.set_result(None)
            if queue:
                return


Gate = Callable[[Priority, float], Any]


async def _call(
    client: httpx.AsyncClient, url: str, token: str, priority: Priority, deadline: float
) -> bool:
    loop = asyncio.get_running_loop()
    try:
        resp = await client.get(
            url,
            headers={"authorization": f"Bearer {token}"},
            timeout=max(0.001, deadline - loop.time()),
        )
    except httpx.HTTPError:
        return False
    return resp.status_code == 200


async def run_variant(
    url: str,
    variant: str,
    seconds: float,
    load: Load,
    stats: Callable[[], dict[str, Any]],
    seed: int = 1,
) -> tuple[Counts, float, dict[str, Any]]:
    """Offer the load for ``seconds``; returns the client's counts, its CPU seconds and
    the IdP's stats when the offered window ended."""
    loop = asyncio.get_running_loop()
    rnd = random.Random(seed)
    counts = Counts()
    limiter: ConcurrencyLimiter | None = None
    fixed: FixedLimit | None = None
    if variant == "gateway limiter":
        limiter = ConcurrencyLimiter(VegasLimit())
    else:
        fixed = FixedLimit(6, by_priority=variant.endswith("cold first"))
    tasks: set[asyncio.Task[None]] = set()
    cpu0 = time.process_time()

    async with httpx.AsyncClient(limits=httpx.Limits(max_connections=200)) as client:

        async def one(token: str, priority: Priority) -> None:
            deadline = loop.time() + load.deadline
            slot: Slot | None = None
            if limiter is not None:
                got = await limiter.acquire(priority, deadline)
                if isinstance(got, Refusal):
                    counts.refused += 1
                    return
                slot = got
            elif fixed is not None and not await fixed.acquire(priority, deadline):
                counts.refused += 1
                return
            started = loop.time()
            ok = False
            try:
                ok = await _call(client, url, token, priority, deadline)
            finally:
                if limiter is not None and slot is not None:
                    limiter.release(slot, loop.time() - started, dropped=not ok)
                elif fixed is not None:
                    fixed.release(loop.time() - started)
            if ok and loop.time() <= deadline:
                counts.authenticated[priority] += 1
            else:
                counts.late += 1

        async def stream(rate: float, priority: Priority, tokens: Callable[[int], str]) -> None:
            end = loop.time() + seconds
            n = 0
            at = loop.time()
            while True:
                at += rnd.expovariate(rate)
                if at >= end:
                    return
                await asyncio.sleep(max(0.0, at - loop.time()))
                task = loop.create_task(one(tokens(n), priority))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                n += 1

        await asyncio.gather(
            stream(load.cold_per_s, COLD, lambda n: f"good-direct-cold-{seed}-{n}"),
            stream(load.refresh_per_s, REFRESH, lambda n: f"good-known{n % 200}"),
        )
        cpu = time.process_time() - cpu0
        at_end = await asyncio.to_thread(stats)
        if tasks:
            await asyncio.wait(tasks, timeout=load.deadline + 1)
    return counts, cpu, at_end


VARIANTS = ("fixed-6, cold first", "fixed-6, arrival order", "gateway limiter")


def compare(
    idp_url: str,
    control: Callable[[str, dict[str, Any] | None], dict[str, Any]],
    capacity: int,
    service_time: float,
    seconds: float,
    load: Load | None = None,
) -> dict[str, dict[str, Any]]:
    """Run every variant against the IdP; ``control(path, body)`` talks to its control port."""
    load = load or Load()
    out: dict[str, dict[str, Any]] = {}
    for i, variant in enumerate(VARIANTS):
        control("/_fake/reset", None)
        control("/_fake/faults", {"capacity": capacity, "service_time": service_time})
        counts, cpu, st = asyncio.run(
            run_variant(
                idp_url, variant, seconds, load, lambda: control("/_fake/stats", None), i + 1
            )
        )
        time.sleep(0.2)  # the last answers' accounting
        wasted = int(control("/_fake/stats", None).get("wasted") or 0)
        served = int(st.get("served") or 0)
        out[variant] = {
            "cold_authenticated_per_s": counts.authenticated[COLD] / seconds,
            "cold_offered_per_s": load.cold_per_s,
            "refreshes_per_s": counts.authenticated[REFRESH] / seconds,
            "refused": counts.refused,
            "late": counts.late,
            "idp_served": served,
            "idp_max_in_flight": int(st.get("max_in_flight") or 0),
            "idp_utilisation": served / (capacity / service_time * seconds),
            "idp_wasted": wasted,
            "idp_wasted_share": wasted / max(1, served),
            "queue_wait_p50_ms": st.get("queue_wait_p50_ms"),
            "queue_wait_p99_ms": st.get("queue_wait_p99_ms"),
            "client_cpu_cores": cpu / seconds,
        }
    control("/_fake/reset", None)
    return out


def rows(figures: dict[str, dict[str, Any]], capacity_per_s: float) -> list[tuple[str, ...]]:
    names = list(figures)
    table: list[tuple[str, ...]] = [("direct client (no gateway)", *names)]

    def add(label: str, fmt: Callable[[dict[str, Any]], str]) -> None:
        table.append((label, *(fmt(figures[n]) for n in names)))

    add(
        "cold authenticated/s (offered)",
        lambda f: f"{f['cold_authenticated_per_s']:.1f} ({f['cold_offered_per_s']:.0f})",
    )
    add(
        "  share of the IdP's capacity",
        lambda f: f"{100 * f['cold_authenticated_per_s'] / capacity_per_s:.0f} %",
    )
    add("refreshes answered/s", lambda f: f"{f['refreshes_per_s']:.1f}")
    add("IdP utilisation", lambda f: f"{100 * f['idp_utilisation']:.0f} %")
    add("IdP wasted", lambda f: f"{f['idp_wasted']} ({100 * f['idp_wasted_share']:.0f} %)")
    add("IdP queue wait p50 ms", lambda f: _ms(f["queue_wait_p50_ms"]))
    add("IdP queue wait p99 ms", lambda f: _ms(f["queue_wait_p99_ms"]))
    add("refused before sending", lambda f: str(f["refused"]))
    add("client CPU cores", lambda f: f"{f['client_cpu_cores']:.2f}")
    return table


def _ms(v: Any) -> str:
    return "-" if v is None else f"{v:.1f}"


def main(argv: list[str] | None = None) -> int:
    from loadtests.run import fake_server, print_table

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=15.0, help="per variant (15)")
    args = parser.parse_args(argv)
    import tempfile

    with (
        tempfile.TemporaryDirectory(prefix="authn-direct-") as tmp,
        fake_server("idp", Path(tmp)) as fake,
    ):
        figures = compare(
            f"http://127.0.0.1:{fake.port}/userinfo", fake.control_call, 4, 0.05, args.seconds
        )
    print(print_table(rows(figures, 80.0)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
