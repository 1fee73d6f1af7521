"""The fake IdP's capacity mode (the brownout model), over real sockets.

Every assertion is on the fake's own counters or on orders and lower bounds the
model guarantees (a slot is held for at least ``service_time``), never on how fast
this machine happens to be.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import httpx
import pytest

from tests.support.fakes.idp import FakeIdP


def wait_until(check: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


@pytest.fixture
def idp() -> Iterator[FakeIdP]:
    fake = FakeIdP(control_port=0).start_in_thread()
    try:
        yield fake
    finally:
        fake.stop()


def call(idp: FakeIdP, token: str = "good-alice", timeout: float = 30.0) -> int | None:
    """One request on its own connection; None when this caller gave up first."""
    try:
        with httpx.Client(timeout=timeout) as client:
            return client.get(idp.url, headers={"Authorization": f"Bearer {token}"}).status_code
    except httpx.TimeoutException:
        return None


def in_threads(n: int, target: Callable[[int], None]) -> list[threading.Thread]:
    threads = [threading.Thread(target=target, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    return threads


def test_at_most_capacity_in_service_and_capacity_bounds_throughput(idp: FakeIdP) -> None:
    idp.configure(capacity=4, service_time=0.05)
    statuses: list[int | None] = []
    started = time.monotonic()
    for t in in_threads(40, lambda i: statuses.append(call(idp))):
        t.join()
    elapsed = time.monotonic() - started
    st = idp.stats()
    assert statuses == [200] * 40
    assert st.served == 40
    assert st.max_in_service == 4
    # 40 calls through 4 slots of 50 ms: ten rounds at least, i.e. <= C*1000/S = 80/s.
    assert elapsed >= 10 * 0.05
    # Every call's wait was recorded, and some had to wait for a slot.
    assert len(st.queue_waits) == 40
    assert st.max_queued > 0 and max(st.queue_waits) > 0


def test_waiters_are_served_in_arrival_order(idp: FakeIdP) -> None:
    idp.configure(capacity=1, service_time=0.05)
    finished: list[int] = []
    lock = threading.Lock()

    def one(i: int) -> None:
        assert call(idp, f"good-user{i}") == 200
        with lock:
            finished.append(i)

    threads = []
    for i in range(8):
        threads += in_threads(1, lambda _, i=i: one(i))  # type: ignore[misc]
        # The next request arrives only once this one is queued (or in service).
        wait_until(lambda i=i: idp.stats().calls == i + 1, f"request {i} to arrive")  # type: ignore[misc]
    for t in threads:
        t.join()
    assert finished == list(range(8))
    assert idp.stats().max_in_service == 1


def test_a_request_waiting_past_the_bound_gets_503(idp: FakeIdP) -> None:
    idp.configure(capacity=1, service_time=1.0, max_queue_wait=0.2)
    first: list[int | None] = []
    t = in_threads(1, lambda _: first.append(call(idp)))[0]
    wait_until(lambda: idp.stats().in_service == 1, "the first call to be in service")
    assert call(idp) == 503
    t.join()
    st = idp.stats()
    assert first == [200]
    assert st.expired == 1 and st.served == 1
    assert st.by_status == {200: 1, 503: 1}
    # The expired one's wait is recorded as the bound.
    assert sorted(st.queue_waits)[-1] == pytest.approx(0.2)


def test_work_done_for_a_caller_that_gave_up_counts_as_wasted(idp: FakeIdP) -> None:
    idp.configure(capacity=1, service_time=0.5)
    # This caller's timeout is shorter than the service time: it leaves first.
    assert call(idp, timeout=0.1) is None
    # This one waits for its answer (queued behind the abandoned one).
    assert call(idp) == 200
    wait_until(lambda: idp.stats().served == 2, "both calls to be served")
    st = idp.stats()
    assert st.wasted == 1
    assert st.by_status == {200: 2}


def test_a_larger_capacity_admits_waiters_at_once(idp: FakeIdP) -> None:
    idp.configure(capacity=1, service_time=2.0)
    threads = in_threads(3, lambda _: call(idp))
    wait_until(lambda: idp.stats().queued == 2, "two calls to queue behind the first")
    with httpx.Client() as control:
        resp = control.post(
            f"http://127.0.0.1:{idp.control_port}/_fake/faults", json={"capacity": 3}
        )
    assert resp.status_code == 200
    # Admitted now, not when the 2 s service of the first ends.
    wait_until(lambda: idp.stats().in_service == 3, "the waiters to enter service", timeout=1.5)
    for t in threads:
        t.join()
    assert idp.stats().served == 3


def test_capacity_mode_reports_its_figures_on_the_control_port(idp: FakeIdP) -> None:
    idp.configure(capacity=2, service_time=0.01)
    for _ in range(3):
        assert call(idp) == 200
    with httpx.Client() as control:
        doc = control.get(f"http://127.0.0.1:{idp.control_port}/_fake/stats").json()
        bad = control.post(
            f"http://127.0.0.1:{idp.control_port}/_fake/faults", json={"capacity": 0}
        )
    assert doc["served"] == 3 and doc["wasted"] == 0 and doc["expired"] == 0
    assert doc["queue_wait_p50_ms"] is not None and doc["queue_wait_p99_ms"] is not None
    assert bad.status_code == 400
    assert idp.faults.capacity == 2


def test_without_capacity_nothing_queues(idp: FakeIdP) -> None:
    idp.configure(latency=1.0)  # long enough for all ten threads to arrive meanwhile
    for t in in_threads(10, lambda _: call(idp)):
        t.join()
    st = idp.stats()
    assert st.max_in_flight == 10
    assert st.served == 0 and st.queue_waits == []
