"""Rehearse a scenario on this machine: ``python -m loadtests.run SCENARIO``.

Starts the fake IdP (or fake Keystone / GitLab), Redis when the scenario needs it,
the gateway (one replica, or three sharing Redis) and locust headless, all on
loopback; plays the scenario's fault schedule; samples the IdP's call counter and
the gateway's /metrics every 0.5 s; then does it all again in pass-through mode.
Prints a summary table and writes ``<out>/<scenario>.png`` and ``<scenario>.json``.

    python -m loadtests.run steady --duration 40
    python -m loadtests.run all --out docs/img
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from loadtests.cpu import cpu_seconds
from loadtests.locustfile import GITLAB_USERS, TOKEN_KINDS
from loadtests.scenarios import SCENARIOS, Scenario, Step
from tests.support.procs import (
    GatewayProcess,
    free_port,
    metric_value,
    review_body,
    start_gateway,
    wait_for_port,
)
from tests.support.redis_server import RedisServer

HERE = Path(__file__).resolve().parent
SECRET = "loadtest-fleet-only-Rk2Xm6Wq0Zn4Tv8Bc1Yf5Ud9Ag3Eh7Ls-JpNi"
# Plotted height of each breaker state.
BREAKER_LEVEL = {"closed": 0, "half-open": 1, "open": 2, "forced_open": 2, "forced_closed": 0}


# ---- processes ---------------------------------------------------------------------


@dataclass
class Fake:
    proc: subprocess.Popen[bytes]
    port: int
    control: int

    def faults(self, changes: dict[str, Any]) -> None:
        httpx.post(f"http://127.0.0.1:{self.control}/_fake/faults", json=changes, timeout=5)

    def stats(self) -> dict[str, Any]:
        return dict(httpx.get(f"http://127.0.0.1:{self.control}/_fake/stats", timeout=2).json())

    def control_call(self, path: str, body: dict[str, Any] | None) -> dict[str, Any]:
        """GET a /_fake/stats path, POST anything else (faults, reset)."""
        url = f"http://127.0.0.1:{self.control}{path}"
        if path.partition("?")[0].endswith("/stats"):
            return dict(httpx.get(url, timeout=5).json())
        return dict(httpx.post(url, json=body or {}, timeout=5).json())


@contextmanager
def fake_server(kind: str, workdir: Path) -> Iterator[Fake]:
    port = free_port()
    cmd = [sys.executable, "-m", f"tests.support.fakes.{kind}", "--port", str(port)]
    if kind == "gitlab":
        # Its control paths (/_fake/...) share the API port.
        control = port
        cmd += ["--synthetic-users", str(GITLAB_USERS), "--groups-per-user", "1"]
        # GitLab's own per-user/per-IP limit (2000/min by default) would add 429s of its
        # own; the scenario's 429s are the only ones wanted.
        cmd += ["--throttle-limit", "0"]
    else:
        control = free_port()
        cmd += ["--control-port", str(control)]
    log = (workdir / f"fake-{kind}.log").open("wb")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for_port(port, proc=proc)
        wait_for_port(control, proc=proc)
        yield Fake(proc, port, control)
    finally:
        _stop(proc)


def _stop(proc: subprocess.Popen[Any]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def backend_config(kind: str, fake: Fake) -> dict[str, Any]:
    base = f"http://127.0.0.1:{fake.port}"
    if kind == "idp":
        return {"name": "idp", "type": "userinfo", "url": f"{base}/userinfo"}
    if kind == "keystone":
        return {
            "name": "keystone",
            "type": "keystone",
            "auth_url": f"{base}/v3",
            "service": {
                "username": "authn-gateway",
                "password": "GatewayPass123",
                "system_scope": "all",
            },
        }
    return {"name": "gitlab", "type": "gitlab", "base_url": base}


def gateway_config(
    scenario: Scenario, fake: Fake, protected: bool, redis: RedisServer | None
) -> dict[str, Any]:
    backend = backend_config(scenario.idp, fake)
    config: dict[str, Any] = {"logging": {"level": "warning"}}
    if protected:
        backend.update(scenario.backend)
        config.update(scenario.gateway)
        if redis is not None:
            config["redis"] = {"url": redis.url}
            config["secret"] = SECRET
    # The backends' own group caches are protections too: off without the gateway.
    elif scenario.idp == "keystone":
        backend["groups"] = {"cache_ttl_seconds": 0.001, "max_stale_seconds": 0}
    elif scenario.idp == "gitlab":
        backend["groups"] = {"cache_ttl_seconds": 0}
    config["backends"] = [backend]
    return config


def start_passthrough(config: dict[str, Any], workdir: Path, name: str) -> GatewayProcess:
    """Run :mod:`loadtests.passthrough` on a free port, the way tests start the gateway."""
    return start_gateway(config, workdir, name=name, command=("loadtests.passthrough",))


# ---- sampling ------------------------------------------------------------------------


@dataclass
class Sample:
    t: float
    idp_calls: int
    breaker: str
    backend_calls: float
    stale: float
    refusals: float
    # The fake IdP's capacity mode (0 outside it).
    idp_queued: int = 0
    idp_in_service: int = 0
    idp_served: int = 0
    idp_wasted: int = 0
    # The gateways' adaptive concurrency limit and calls in flight (summed over replicas).
    limit: float = 0.0
    in_flight: float = 0.0
    breaker_opened: float = 0.0
    # CPU seconds used so far by each watched process (gateway, load generator, IdP).
    cpu: dict[str, float] = field(default_factory=dict)


def _breaker_state(metrics: str) -> str:
    # Label values are pybreaker's state names ("half-open" has a hyphen).
    for state in ("open", "half-open", "forced_open", "forced_closed", "closed"):
        if metric_value(metrics, "authn_gateway_breaker_state", state=state) >= 1:
            return state
    return "closed"


class Sampler(threading.Thread):
    """Every 0.5 s: the fake's call counter and each replica's /metrics."""

    def __init__(self, fake: Fake, gateways: list[GatewayProcess]) -> None:
        super().__init__(daemon=True)
        self.fake = fake
        self.gateways = gateways
        self.samples: list[Sample] = []
        self._halt = threading.Event()
        # role -> pids whose CPU time is sampled (summed per role)
        self.watched: dict[str, list[int]] = {
            "gateway": [g.proc.pid for g in gateways],
            "fake IdP": [fake.proc.pid],
        }
        self._last_cpu: dict[int, float] = {}

    def watch(self, role: str, pid: int) -> None:
        self.watched.setdefault(role, []).append(pid)

    def _cpu(self) -> dict[str, float]:
        out = {}
        for role, pids in self.watched.items():
            for pid in pids:
                used = cpu_seconds(pid)
                if used is not None:
                    self._last_cpu[pid] = used
            out[role] = sum(self._last_cpu.get(pid, 0.0) for pid in pids)
        return out

    def run(self) -> None:
        client = httpx.Client(timeout=2)
        while not self._halt.is_set():
            t = time.time()
            try:
                idp = self.fake.stats()
                calls = int(idp["calls"])
            except (httpx.HTTPError, KeyError, ValueError):
                idp = {}
                calls = self.samples[-1].idp_calls if self.samples else 0
            states, backend_calls, stale, refusals = [], 0.0, 0.0, 0.0
            limit, in_flight, opened = 0.0, 0.0, 0.0
            for gw in self.gateways:
                try:
                    text = client.get(f"{gw.url}/metrics").text
                except httpx.HTTPError:
                    continue
                states.append(_breaker_state(text))
                backend_calls += metric_value(text, "authn_gateway_backend_calls_total")
                stale += metric_value(
                    text, "authn_gateway_cache_lookups_total", result="stale_served"
                )
                refusals += metric_value(text, "authn_gateway_limiter_refusals_total")
                limit += metric_value(text, "authn_gateway_concurrency_limit")
                in_flight += metric_value(text, "authn_gateway_concurrency_in_flight")
                opened += metric_value(
                    text, "authn_gateway_breaker_transitions_total", to_state="open"
                )
            # The worst replica's view: open beats half-open beats closed.
            worst = max(states, key=lambda s: BREAKER_LEVEL.get(s, 0)) if states else "closed"
            self.samples.append(
                Sample(
                    t,
                    calls,
                    worst,
                    backend_calls,
                    stale,
                    refusals,
                    idp_queued=int(idp.get("queued") or 0),
                    idp_in_service=int(idp.get("in_service") or 0),
                    idp_served=int(idp.get("served") or 0),
                    idp_wasted=int(idp.get("wasted") or 0),
                    limit=limit,
                    in_flight=in_flight,
                    breaker_opened=opened,
                    cpu=self._cpu(),
                )
            )
            self._halt.wait(0.5)
        client.close()

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=5)


# ---- one run -------------------------------------------------------------------------


@dataclass
class Result:
    mode: str
    started: float
    duration: float
    timeline: dict[str, Any]
    samples: list[Sample]
    idp_stats: dict[str, Any]
    marks: list[tuple[float, str]] = field(default_factory=list)
    checks: dict[str, Any] = field(default_factory=dict)

    @property
    def idp_calls(self) -> int:
        if not self.samples:
            return 0
        return self.samples[-1].idp_calls - self.samples[0].idp_calls

    def calls_between(self, start: float, end: float) -> int:
        """IdP calls between two offsets from the start (from the 0.5 s samples)."""
        inside = [x.idp_calls for x in self.samples if start <= x.t - self.started <= end]
        return inside[-1] - inside[0] if inside else 0

    def relogins_between(self, start: float, end: float) -> int:
        """Clients' own logins at Keystone in the window: Keystone calls not made by us."""
        rows = self.timeline.get("rows", [])
        return sum(r.get("reauths", 0) for r in rows if start <= r["t"] - self.started <= end)

    @property
    def fault_window(self) -> tuple[float, float] | None:
        """From the first fault to the recovery step."""
        if len(self.marks) < 2:
            return None
        return self.marks[0][0], self.marks[-1][0]

    def known_served(self, start: float = 0.0, end: float = float("inf")) -> float | None:
        """Share of the hot (known) users' reviews answered "authenticated", in a window."""
        served = total = 0
        for r in self.timeline.get("rows", []):
            if start <= r["t"] - self.started <= end:
                hot = r.get("populations", {}).get("hot", {})
                served += hot.get("authenticated", 0)
                total += sum(hot.values())
        return served / total if total else None

    def totals(self) -> dict[str, Any]:
        rows = self.timeline.get("rows", [])
        answers: dict[str, int] = {}
        statuses: dict[str, int] = {}
        for r in rows:
            for k, v in r["answers"].items():
                answers[k] = answers.get(k, 0) + v
            for k, v in r["statuses"].items():
                statuses[k] = statuses.get(k, 0) + v
        reviews = sum(answers.values())
        attempts = sum(r["attempts"] for r in rows)
        by_population: dict[str, int] = {}
        for r in rows:
            for k, v in r.get("by_population", {}).items():
                by_population[k] = by_population.get(k, 0) + v
        return {
            "reviews": reviews,
            "attempts": attempts,
            "answers": answers,
            "by_population": by_population,
            "http_5xx": sum(v for k, v in statuses.items() if k.isdigit() and int(k) >= 500),
            "reauths": sum(r.get("reauths", 0) for r in rows),
        }

    def cpu_cores(self) -> dict[str, float]:
        """Mean CPU cores each watched role used while the clock ran (1.0: one core busy)."""
        s = [x for x in self.samples if self.started <= x.t <= self.started + self.duration]
        if len(s) < 2:
            return {}
        span = s[-1].t - s[0].t
        return {
            role: (s[-1].cpu.get(role, 0.0) - s[0].cpu.get(role, 0.0)) / span for role in s[-1].cpu
        }

    def brownout(self, capacity_per_s: float, until: float | None = None) -> dict[str, Any]:
        """The IdP's own figures for a capacity-mode run, and what each population got,
        from the start of the clock to ``until`` s (the end of the brownout; None: the
        whole run). Rates are per second of reviews answered (the timeline's rows), so a
        load generator that started late on a busy machine does not lower them."""
        s = self.samples
        st = self.idp_stats
        served = s[-1].idp_served - s[0].idp_served if s else 0
        wasted = s[-1].idp_wasted - s[0].idp_wasted if s else 0
        end = self.duration if until is None else until
        rows = [r for r in self.timeline.get("rows", []) if 0 <= r["t"] - self.started < end]
        seconds = max(1, len(rows))
        pop: dict[str, int] = {}
        for r in rows:
            for k, v in r.get("by_population", {}).items():
                pop[k] = pop.get(k, 0) + v
        hot = sum(v for k, v in pop.items() if k.startswith("hot/"))
        return {
            "idp_served": served,
            "idp_utilisation": served / max(1e-9, capacity_per_s * end),
            "idp_wasted": wasted,
            "idp_wasted_share": wasted / max(1, served),
            "idp_503": st.get("by_status", {}).get("503", 0),
            "queue_wait_p50_ms": st.get("queue_wait_p50_ms"),
            "queue_wait_p99_ms": st.get("queue_wait_p99_ms"),
            "breaker_opened": s[-1].breaker_opened - s[0].breaker_opened if s else 0,
            "cold_authenticated_per_s": pop.get("cold/authenticated", 0) / seconds,
            "cold_offered_per_s": sum(v for k, v in pop.items() if k.startswith("cold/")) / seconds,
            "hot_served_share": pop.get("hot/authenticated", 0) / max(1, hot),
            "reviews_per_s": sum(pop.values()) / seconds,
            "errors_stop_after_s": None if until is None else self.errors_stop_after(until),
        }

    def errors_stop_after(self, at: float) -> float:
        """Seconds from ``at`` (an offset) to the end of the last second with an
        unavailable answer or a 5xx (0: none after ``at``)."""
        last = 0.0
        for r in self.timeline.get("rows", []):
            ends = r["t"] + 1 - self.started
            bad = r["answers"].get("unavailable", 0) + sum(
                v for k, v in r["statuses"].items() if k.isdigit() and int(k) >= 500
            )
            if ends > at and bad:
                last = max(last, ends - at)
        return last


def warm_up(gateways: list[GatewayProcess], scenario: Scenario) -> None:
    """Review every hot token once, as a gateway that has been running for a while has.

    Paced at 20 reviews/s so the warm-up stays inside the outbound bucket (50 calls/s,
    burst 100) even for backends that make two calls per review (GitLab).
    """
    tokens = TOKEN_KINDS[scenario.idp]({"hot": 1.0}, scenario.hot, 1)
    with httpx.Client(timeout=10) as client:
        for i, token in enumerate(tokens.hot_tokens()):
            gw = gateways[i % len(gateways)]
            client.post(f"{gw.url}/authenticate?timeout=30s", json=review_body(token))
            time.sleep(0.05)


def run_locust(
    scenario: Scenario,
    gateways: list[GatewayProcess],
    fake: Fake,
    duration: float,
    workdir: Path,
    tag: str,
) -> tuple[subprocess.Popen[bytes], Path]:
    timeline = workdir / f"timeline-{tag}.json"
    env = {
        **os.environ,
        "LOADTEST_HOSTS": ",".join(g.url for g in gateways),
        "LOADTEST_TOKENS": scenario.idp,
        "LOADTEST_MIX": scenario.mix,
        "LOADTEST_HOT": str(scenario.hot),
        "LOADTEST_RATE": str(scenario.rate),
        "LOADTEST_POISSON": "1" if scenario.poisson else "0",
        "LOADTEST_TIMELINE": str(timeline),
    }
    if scenario.reauth:
        env["LOADTEST_REAUTH_URL"] = f"http://127.0.0.1:{fake.port}"
    cmd = [
        sys.executable, "-m", "locust", "-f", str(HERE / "locustfile.py"), "--headless",
        "-u", str(scenario.users), "-r", str(max(1, scenario.users)),
        "-t", f"{int(duration)}s", "--stop-timeout", "35",
        "--csv", str(workdir / f"locust-{tag}"), "--only-summary", "--loglevel", "WARNING",
        "--host", gateways[0].url,
    ]  # fmt: skip
    log = (workdir / f"locust-{tag}.log").open("wb")
    return subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT), timeline


def run_once(scenario: Scenario, protected: bool, duration: float, workdir: Path) -> Result:
    mode = "gateway" if protected else "pass-through"
    tag = f"{scenario.name}-{'gw' if protected else 'pt'}"
    with ExitStack() as stack:
        fake = stack.enter_context(fake_server(scenario.idp, workdir))
        redis: RedisServer | None = None
        if scenario.redis and protected:
            redis = RedisServer(workdir).start()
            stack.callback(redis.stop)
        gateways = []
        for i in range(scenario.replicas):
            cfg = gateway_config(scenario, fake, protected, redis)
            name = f"{tag}-{i}"
            gw = (
                start_gateway(cfg, workdir, name=name)
                if protected
                else start_passthrough(cfg, workdir, name)
            )
            stack.callback(gw.stop)
            gateways.append(gw)
        if scenario.warm and protected:
            warm_up(gateways, scenario)
        if scenario.capacity is not None:
            fake.faults({"capacity": scenario.capacity, "service_time": scenario.service_time})
        sampler = Sampler(fake, gateways)
        sampler.start()
        stack.callback(sampler.stop)
        proc, timeline_path = run_locust(scenario, gateways, fake, duration, workdir, tag)
        sampler.watch("load generator", proc.pid)
        stack.callback(_stop, proc)
        started = time.time()
        marks = play(scenario.steps, started, duration, fake, redis, proc)
        proc.wait(timeout=duration + 60)
        sampler.stop()
        checks: dict[str, Any] = {"load_average": f"{os.getloadavg()[0]:.1f}"}
        if protected and scenario.capacity is not None:
            checks.update(limit_figures(gateways))
        if scenario.cold_probe:
            checks["cold_token_to_all_replicas_idp_calls"] = cold_probe(gateways, fake, scenario)
        timeline = json.loads(timeline_path.read_text()) if timeline_path.exists() else {}
        result = Result(
            mode, started, duration, timeline, sampler.samples, fake.stats(), marks, checks
        )
        for gw in gateways:
            if gw.proc.poll() is not None:
                result.checks[f"replica {gw.port} exited"] = gw.proc.returncode
        return result


def limit_figures(gateways: list[GatewayProcess]) -> dict[str, Any]:
    """The concurrency limit's counters at the end of the run, summed over replicas."""
    figures: dict[str, Any] = {}
    for gw in gateways:
        try:
            text = httpx.get(f"{gw.url}/metrics", timeout=5).text
        except httpx.HTTPError:
            continue
        for reason in ("failing", "queue_full", "deadline", "waited"):
            key = f"limit_refused_{reason}"
            figures[key] = figures.get(key, 0) + int(
                metric_value(text, "authn_gateway_concurrency_refusals_total", reason=reason)
            )
        figures["slow_calls"] = figures.get("slow_calls", 0) + int(
            metric_value(text, "authn_gateway_backend_slow_calls_total")
        )
        calls = metric_value(text, "authn_gateway_backend_call_duration_seconds_count")
        took = metric_value(text, "authn_gateway_backend_call_duration_seconds_sum")
        own = metric_value(text, "authn_gateway_backend_call_own_delay_seconds_total")
        # Per call: as timed by the gateway, and the part that waited for its own loop.
        figures["call_mean_ms"] = round(1000 * took / calls, 1) if calls else 0.0
        figures["call_own_delay_mean_ms"] = round(1000 * own / calls, 1) if calls else 0.0
        waits = metric_value(text, "authn_gateway_concurrency_slot_wait_seconds_count")
        waited = metric_value(text, "authn_gateway_concurrency_slot_wait_seconds_sum")
        figures["slot_wait_mean_ms"] = round(1000 * waited / waits, 1) if waits else 0.0
        figures["stale_served"] = figures.get("stale_served", 0) + int(
            metric_value(text, "authn_gateway_cache_lookups_total", result="stale_served")
        )
    return figures


def play(
    steps: tuple[Step, ...],
    started: float,
    duration: float,
    fake: Fake,
    redis: RedisServer | None,
    proc: subprocess.Popen[bytes],
) -> list[tuple[float, str]]:
    marks = []
    for step in steps:
        at = started + step.at * duration
        while time.time() < at and proc.poll() is None:
            time.sleep(0.05)
        if step.faults is not None:
            fake.faults(step.faults)
        if step.action == "stop_redis" and redis is not None:
            redis.stop()
        if step.action == "start_redis" and redis is not None:
            redis.start()
        marks.append((time.time() - started, step.label))
    return marks


def cold_probe(gateways: list[GatewayProcess], fake: Fake, scenario: Scenario) -> int:
    """One never-seen token sent to every replica at the same moment (10 each)."""
    token = TOKEN_KINDS[scenario.idp]({"hot": 1.0}, 1, 1).valid("fleet-probe-user", 424242)
    time.sleep(1.0)
    before = int(fake.stats()["calls"])
    barrier = threading.Barrier(10 * len(gateways))

    def one(gw: GatewayProcess) -> None:
        with httpx.Client(timeout=10) as client:
            barrier.wait()
            client.post(f"{gw.url}/authenticate?timeout=30s", json=review_body(token))

    threads = [threading.Thread(target=one, args=(gw,)) for gw in gateways for _ in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return int(fake.stats()["calls"]) - before


# ---- analysis ------------------------------------------------------------------------


def rates(samples: list[Sample], started: float) -> tuple[list[float], list[float]]:
    """IdP calls per second between consecutive samples."""
    ts, rs = [], []
    for a, b in itertools.pairwise(samples):
        dt = b.t - a.t
        if dt > 0:
            ts.append(b.t - started)
            rs.append((b.idp_calls - a.idp_calls) / dt)
    return ts, rs


def window_checks(scenario: Scenario, res: Result, backend: dict[str, Any]) -> dict[str, Any]:
    """Outage probes per reset_timeout, and the call rate after recovery, from the samples."""
    checks: dict[str, Any] = {}
    marks = res.marks
    s = res.samples
    if not marks or not s:
        return checks
    fault_start = marks[0][0] + res.started
    recovered = marks[-1][0] + res.started if len(marks) > 1 else None
    if scenario.name in ("idp-outage", "incident", "rate-limited") and recovered:
        opened = next((x.t for x in s if x.t >= fault_start and x.breaker == "open"), None)
        if opened is not None:
            calls = [x.idp_calls for x in s if opened <= x.t <= recovered]
            reset = backend.get("breaker", {}).get("reset_timeout_seconds", 10.0)
            periods = max(1.0, (recovered - opened) / reset)
            relogins = res.relogins_between(opened - res.started, recovered - res.started)
            # Clients logging in again reach Keystone directly, not through the gateway.
            checks["idp_calls_while_breaker_tripped"] = (
                calls[-1] - calls[0] if calls else 0
            ) - relogins
            checks["probe_periods"] = round(periods, 1)
            checks["calls_per_reset_timeout"] = round(
                checks["idp_calls_while_breaker_tripped"] / periods, 2
            )
    if recovered:
        after = [x for x in s if x.t >= recovered]
        peak = 0
        for i, a in enumerate(after):
            for b in after[i + 1 :]:
                if b.t - a.t >= 1.0:
                    peak = max(peak, b.idp_calls - a.idp_calls)
                    break
        checks["max_idp_calls_in_1s_after_recovery"] = peak
    return checks


def summary_rows(scenario: Scenario, results: list[Result]) -> list[tuple[str, ...]]:
    rows = [("", *(r.mode for r in results))]

    def add(label: str, values: list[Any]) -> None:
        rows.append((label, *(str(v) for v in values)))

    totals = [r.totals() for r in results]
    add("reviews answered", [t["reviews"] for t in totals])
    add("HTTP attempts", [t["attempts"] for t in totals])
    add("attempts / review", [f"{t['attempts'] / max(1, t['reviews']):.3f}" for t in totals])
    for answer in ("authenticated", "rejected", "unavailable"):
        add(f"  {answer}", [t["answers"].get(answer, 0) for t in totals])
    others = [
        sum(
            v
            for k, v in t["answers"].items()
            if k not in ("authenticated", "rejected", "unavailable")
        )
        for t in totals
    ]
    add("  other (5xx, conn errors)", others)
    add("5xx answers", [t["http_5xx"] for t in totals])
    if scenario.reauth:
        add("client re-logins", [t["reauths"] for t in totals])
    if scenario.known_served_target is not None:
        add("known users served", [_pct_or_dash(r.known_served()) for r in results])
        windows = [r.fault_window for r in results]
        add(
            "  during the faults",
            [
                _pct_or_dash(r.known_served(*w) if w else None)
                for r, w in zip(results, windows, strict=True)
            ],
        )
        add("  target", [f"{100 * scenario.known_served_target:.0f} %"] * len(results))
        add(
            "limiter refusals",
            [
                int(r.samples[-1].refusals - r.samples[0].refusals) if r.samples else 0
                for r in results
            ],
        )
    add("IdP calls", [r.idp_calls for r in results])
    if scenario.reauth:
        add(
            "  of which the webhook's",
            [r.idp_calls - t["reauths"] for r, t in zip(results, totals, strict=True)],
        )
    windows = [r.fault_window for r in results]
    if all(windows):
        add(
            "IdP calls during the faults",
            [r.calls_between(*w) for r, w in zip(results, windows, strict=True) if w],
        )
    add(
        "IdP calls per 1000 reviews",
        [
            f"{1000 * r.idp_calls / max(1, t['reviews']):.1f}"
            for r, t in zip(results, totals, strict=True)
        ],
    )
    add("IdP calls/s (mean)", [f"{r.idp_calls / r.duration:.1f}" for r in results])
    add(
        "IdP calls/s (peak 0.5 s)",
        [f"{max(rates(r.samples, r.started)[1] or [0]):.0f}" for r in results],
    )
    add("review p50 ms", [_fmt(r.timeline.get("p50_ms")) for r in results])
    add("review p99 ms", [_fmt(r.timeline.get("p99_ms")) for r in results])
    add("review max ms", [_fmt(r.timeline.get("max_ms")) for r in results])
    add("reviews over 30 s", [r.timeline.get("late", "?") for r in results])
    if scenario.capacity is not None:
        figures = [brownout_figures(scenario, r) for r in results]
        add("IdP served (capacity mode)", [f["idp_served"] for f in figures])
        add(
            "  share of the IdP's capacity",
            [f"{100 * f['idp_utilisation']:.0f} %" for f in figures],
        )
        add(
            "  wasted (caller gone)",
            [f"{f['idp_wasted']} ({100 * f['idp_wasted_share']:.0f} %)" for f in figures],
        )
        add("IdP 503 (waited too long)", [f["idp_503"] for f in figures])
        add("IdP queue wait p50 ms", [_fmt(f["queue_wait_p50_ms"]) for f in figures])
        add("IdP queue wait p99 ms", [_fmt(f["queue_wait_p99_ms"]) for f in figures])
        add("breaker opened", [f"{f['breaker_opened']:.0f}" for f in figures])
        add(
            "cold authenticated/s (offered)",
            [
                f"{f['cold_authenticated_per_s']:.1f} ({f['cold_offered_per_s']:.0f})"
                for f in figures
            ],
        )
        add("hot reviews authenticated", [f"{100 * f['hot_served_share']:.1f} %" for f in figures])
        add(
            "reviews answered/s (during the brownout)",
            [f"{f['reviews_per_s']:.0f}" for f in figures],
        )
        if brownout_end(scenario) is not None:
            reset = scenario.backend.get("breaker", {}).get("reset_timeout_seconds", 10.0)
            add(
                f"errors stop after it ends (reset period {reset:g} s)",
                [
                    "-" if f["errors_stop_after_s"] is None else f"{f['errors_stop_after_s']:.0f} s"
                    for f in figures
                ],
            )
    cpus = [r.cpu_cores() for r in results]
    for role in sorted({k for c in cpus for k in c}):
        add(f"CPU cores used: {role}", [f"{c.get(role, 0.0):.2f}" for c in cpus])
    add(
        "machine load average (1 min, at the end)",
        [r.checks.get("load_average", "-") for r in results],
    )
    keys = sorted({k for r in results for k in r.checks} - {"load_average"})
    for k in keys:
        add(k.replace("_", " "), [r.checks.get(k, "-") for r in results])
    return rows


def _pct_or_dash(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.2f} %"


def brownout_end(scenario: Scenario) -> float | None:
    """The fraction of the run at which capacity mode ends (None: it lasts the run)."""
    for step in scenario.steps:
        if (
            step.faults is not None
            and "capacity" in step.faults
            and step.faults["capacity"] is None
        ):
            return step.at
    return None


def mean_capacity(scenario: Scenario) -> float:
    """The fake IdP's capacity (calls/s) averaged over the brownout, through its steps."""
    assert scenario.capacity is not None
    stop = brownout_end(scenario) or 1.0
    level, since, total = float(scenario.capacity), 0.0, 0.0
    for step in scenario.steps:
        new = (step.faults or {}).get("capacity")
        if new is not None and step.at < stop:
            total += level * (step.at - since)
            level, since = float(new), step.at
    total += level * (stop - since)
    return total / stop / scenario.service_time


def brownout_figures(scenario: Scenario, res: Result) -> dict[str, Any]:
    end = brownout_end(scenario)
    if end is None:
        return res.brownout(mean_capacity(scenario))
    # The end as it happened (the step's mark), else as scheduled.
    label = next(s.label for s in scenario.steps if s.at == end)
    at = next((t for t, lbl in res.marks if lbl == label), end * res.duration)
    return res.brownout(mean_capacity(scenario), until=at)


def _fmt(v: Any) -> str:
    return "-" if v is None else f"{v:.1f}"


def protection_factor(results: list[Result], per_review: bool = False) -> float | None:
    """IdP calls without the gateway / with it. ``per_review`` divides each by the reviews
    answered, for runs where the pass-through could not keep up with the offered load."""
    by = {r.mode: r for r in results}
    if "gateway" not in by or "pass-through" not in by:
        return None
    pt, gw = by["pass-through"], by["gateway"]
    if not per_review:
        return pt.idp_calls / max(1, gw.idp_calls)
    pt_rate = pt.idp_calls / max(1, pt.totals()["reviews"])
    gw_rate = gw.idp_calls / max(1, gw.totals()["reviews"])
    return pt_rate / gw_rate if gw_rate else None


def fault_protection_factor(results: list[Result]) -> float | None:
    """The protection factor over the fault window only (first fault to recovery)."""
    by = {r.mode: r for r in results}
    if "gateway" not in by or "pass-through" not in by:
        return None
    gw, pt = by["gateway"], by["pass-through"]
    if gw.fault_window is None or pt.fault_window is None:
        return None
    return pt.calls_between(*pt.fault_window) / max(1, gw.calls_between(*gw.fault_window))


def print_table(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for n, r in enumerate(rows):
        lines.append("| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |")
        if n == 0:
            lines.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


# ---- plot ----------------------------------------------------------------------------


#: Line style by mode: the gateway solid, the pass-through webhook (the naive reference,
#: one IdP call per review) dotted; colour says what is drawn.
MODE_STYLES = {"gateway": "-", "pass-through": ":"}
ANSWER_COLORS = {"authenticated": "tab:green", "rejected": "tab:orange", "unavailable": "tab:red"}


def plot(scenario: Scenario, results: list[Result], path: Path) -> None:
    fig = figure(scenario, results)
    # "tight" takes in the legends and the fault labels, which sit outside the axes.
    fig.savefig(path, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    _shrink(path)


def _legend(ax: Any, handles: list[Any] | None = None, ncol: int = 1) -> Any:
    """A legend beside the panel, never over its data."""
    kwargs: dict[str, Any] = {"handles": handles} if handles is not None else {}
    return ax.legend(
        fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0, ncol=ncol,
        **kwargs,
    )  # fmt: skip


def _mode_handles(results: list[Result]) -> list[Any]:
    from matplotlib.lines import Line2D

    names = {"gateway": "gateway", "pass-through": "pass-through (naive webhook)"}
    return [
        Line2D([], [], color="grey", ls=MODE_STYLES[r.mode], label=names[r.mode]) for r in results
    ]


def figure(scenario: Scenario, results: list[Result]) -> Any:
    """The run's panels: answers by outcome for each mode, IdP calls, the breaker,
    latency (and known users, or the IdP's queue); faults marked on every panel and
    named above the first; each legend beside its panel."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    known = scenario.known_served_target is not None
    panels = 5 if scenario.capacity is not None or known else 4
    fig, axes = plt.subplots(panels, 1, figsize=(9, 9 + 2 * (panels - 4)), sharex=True, dpi=80)
    for res in results:
        rows = res.timeline.get("rows", [])
        t = [r["t"] - res.started + 0.5 for r in rows]
        ls = MODE_STYLES[res.mode]
        axes[0].plot(t, [r["attempts"] for r in rows], ls, color="black")
        # Both sides' answers: what kube-apiserver got with the gateway, and without.
        for answer, color in ANSWER_COLORS.items():
            axes[0].plot(t, [r["answers"].get(answer, 0) for r in rows], ls, color=color)
        ts, rs = rates(res.samples, res.started)
        axes[1].plot(
            ts, rs, ls, color="tab:blue" if res.mode == "gateway" else "tab:purple", label=res.mode
        )
        if res.mode == "gateway":
            axes[2].step(
                [x.t - res.started for x in res.samples],
                [BREAKER_LEVEL.get(x.breaker, 0) for x in res.samples],
                where="post",
                color="tab:red",
            )
        if known:
            hot = [r.get("populations", {}).get("hot", {}) for r in rows]
            axes[4].plot(
                t,
                [100 * h.get("authenticated", 0) / max(1, sum(h.values())) for h in hot],
                ls,
                color="tab:green",
                label=f"known users authenticated, {res.mode}",
            )
        axes[3].plot(t, [r["p50_ms"] for r in rows], ls, color="tab:blue", label=f"p50 {res.mode}")
        axes[3].plot(t, [r["p99_ms"] for r in rows], ls, color="tab:red", label=f"p99 {res.mode}")
        if panels == 5 and res.mode == "gateway" and scenario.capacity is not None:
            st = [x.t - res.started for x in res.samples]
            axes[4].plot(
                st, [x.idp_queued for x in res.samples], color="tab:red", label="IdP queue"
            )
            axes[4].plot(
                st,
                [x.idp_in_service for x in res.samples],
                color="tab:green",
                label="IdP in service",
            )
            if any(x.limit for x in res.samples):
                axes[4].step(
                    st, [x.limit for x in res.samples], where="post", color="black", label="limit"
                )
                axes[4].plot(
                    st, [x.in_flight for x in res.samples], color="tab:blue", label="in flight"
                )
    axes[0].set_ylabel("reviews/s")
    outcome_handles = [Line2D([], [], color="black", label="offered (HTTP attempts/s)")] + [
        Line2D([], [], color=color, label=answer) for answer, color in ANSWER_COLORS.items()
    ]
    _legend(axes[0], outcome_handles + _mode_handles(results))
    axes[1].set_ylabel("IdP calls/s")
    axes[1].set_yscale("symlog", linthresh=1)
    _legend(axes[1])
    axes[2].set_ylabel("breaker")
    axes[2].set_yticks([0, 1, 2], ["closed", "half-open", "open"])
    axes[2].set_ylim(-0.3, 2.3)
    axes[3].set_ylabel("latency ms")
    axes[3].set_yscale("log")
    _legend(axes[3])
    if known:
        assert scenario.known_served_target is not None
        axes[4].axhline(
            100 * scenario.known_served_target, color="grey", ls="--", lw=0.8, label="target"
        )
        axes[4].set_ylabel("known users %")
        axes[4].set_ylim(-5, 105)
        _legend(axes[4])
    if scenario.capacity is not None:
        axes[4].set_ylabel("calls")
        axes[4].set_yscale("symlog", linthresh=10)
        _legend(axes[4])
    axes[-1].set_xlabel("seconds")
    gw = next((r for r in results if r.mode == "gateway"), results[0])
    for ax in axes:
        ax.grid(alpha=0.3)
        for at, _label in gw.marks:
            ax.axvline(at, color="grey", ls="--", lw=0.8)
    # Fault names above the first panel, clear of its data; a second row when two marks
    # are close enough for their names to touch.
    span = max((r.duration for r in results), default=1.0) or 1.0
    previous = -float("inf")
    row = 0
    for at, label in gw.marks:
        row = 1 - row if at - previous < 0.2 * span else 0
        previous = at
        axes[0].annotate(
            label,
            (at, 1.0),
            xytext=(2, 2 + 10 * row),
            textcoords="offset points",
            xycoords=("data", "axes fraction"),
            fontsize=7,
            va="bottom",
            ha="left",
            annotation_clip=False,
        )
    factor = protection_factor(results)
    per_review = protection_factor(results, per_review=True)
    during = fault_protection_factor(results)
    title = f"{scenario.name}: {scenario.summary}"
    if factor is not None and per_review is not None:
        title += (
            f"\nprotection factor {factor:.0f}x (IdP calls pass-through / gateway), "
            f"{per_review:.0f}x per review answered"
        )
        if during is not None:
            title += f", {during:.0f}x during the faults"
    fig.suptitle(title, fontsize=9)
    # Room between the title and the fault names above the first panel.
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    return fig


def _shrink(path: Path) -> None:
    """A palette PNG: a third of the size, so the plots can live in the repo."""
    from PIL import Image

    with Image.open(path) as img:
        small = img.convert("RGB").quantize(colors=256)
    small.save(path, optimize=True)


# ---- main ----------------------------------------------------------------------------


def run_direct(scenario: Scenario, seconds: float, workdir: Path) -> dict[str, dict[str, Any]]:
    """The brownout's direct-client reference on a fresh fake IdP (see loadtests/direct.py)."""
    from loadtests.direct import compare

    assert scenario.capacity is not None
    print(f"== {scenario.name}: direct-client reference, {seconds:.0f} s per variant", flush=True)
    with fake_server(scenario.idp, workdir) as fake:
        return compare(
            f"http://127.0.0.1:{fake.port}/userinfo",
            fake.control_call,
            scenario.capacity,
            scenario.service_time,
            seconds,
        )


def direct_rows(figures: dict[str, dict[str, Any]], capacity: float) -> list[tuple[str, ...]]:
    from loadtests.direct import rows

    return rows(figures, capacity)


def run_scenario(
    scenario: Scenario,
    duration: float,
    modes: list[str],
    out: Path,
    workdir: Path,
    direct_seconds: float = 15.0,
) -> dict[str, Any]:
    results = []
    backend = {**scenario.backend}
    for mode in modes:
        print(f"== {scenario.name}: {mode}, {duration:.0f} s", flush=True)
        res = run_once(scenario, mode == "gateway", duration, workdir)
        if mode == "gateway":
            res.checks.update(window_checks(scenario, res, backend))
        results.append(res)
    rows = summary_rows(scenario, results)
    table = print_table(rows)
    factor = protection_factor(results)
    print(f"\n{scenario.name}: {scenario.summary}\n{table}")
    direct = None
    if scenario.direct_reference and direct_seconds > 0:
        direct = run_direct(scenario, direct_seconds, workdir)
        print(
            "\nreference: a client calling the same brownout IdP directly "
            f"({direct_seconds:.0f} s each; loadtests/direct.py)\n"
            + print_table(direct_rows(direct, scenario.capacity / scenario.service_time))
        )
    per_review = protection_factor(results, per_review=True)
    if factor is not None:
        print(f"protection factor (IdP calls pass-through / gateway): {factor:.1f}")
    if per_review is not None:
        print(f"protection factor per review answered: {per_review:.1f}")
    during = fault_protection_factor(results)
    if during is not None:
        print(f"protection factor during the faults: {during:.1f}")
    out.mkdir(parents=True, exist_ok=True)
    png = out / f"{scenario.name}.png"
    plot(scenario, results, png)
    print(f"plot: {png}\n", flush=True)
    doc = {
        "scenario": scenario.name,
        "summary": scenario.summary,
        "duration": duration,
        "protection_factor": factor,
        "protection_factor_per_review": per_review,
        "protection_factor_during_faults": during,
        "table": table,
        "direct_reference": direct,
        "results": [
            {
                "mode": r.mode,
                "idp_calls": r.idp_calls,
                "totals": r.totals(),
                "checks": r.checks,
                "marks": r.marks,
                "brownout": (
                    brownout_figures(scenario, r) if scenario.capacity is not None else None
                ),
                # Per second, from the start, for reading a run after the fact.
                "seconds": [
                    {
                        "t": round(row["t"] - r.started, 1),
                        "answers": row["answers"],
                        "statuses": row["statuses"],
                    }
                    for row in r.timeline.get("rows", [])
                ],
                "idp_queue_wait_max_ms": [
                    (round(second - r.started), round(ms, 1))
                    for second, ms in r.idp_stats.get("queue_wait_max_ms_by_second", [])
                ],
                "samples": [
                    {
                        "t": round(x.t - r.started, 1),
                        "idp_calls": x.idp_calls,
                        "breaker": x.breaker,
                        "idp_queued": x.idp_queued,
                        "idp_in_service": x.idp_in_service,
                        "limit": x.limit,
                        "in_flight": x.in_flight,
                    }
                    for x in r.samples
                ],
            }
            for r in results
        ],
    }
    (out / f"{scenario.name}.json").write_text(json.dumps(doc, indent=1))
    return doc


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Rehearse a load scenario against the gateway.")
    parser.add_argument("scenario", choices=[*SCENARIOS, "all"])
    parser.add_argument("--duration", type=float, default=45.0, help="seconds per mode (45)")
    parser.add_argument("--users", type=int, help="locust users (kube-apiserver connections)")
    parser.add_argument("--rate", type=float, help="reviews/s per user")
    parser.add_argument(
        "--mode",
        choices=["both", "gateway", "pass-through"],
        default="both",
        help="which runs (both)",
    )
    parser.add_argument(
        "--out", type=Path, default=Path("loadtest-results"), help="PNG/JSON directory"
    )
    parser.add_argument(
        "--direct-seconds",
        type=float,
        default=15.0,
        help="per variant of the brownout's direct-client reference (15; 0: skip it)",
    )
    parser.add_argument(
        "--keep", type=Path, help="keep the processes' logs in this directory (default: removed)"
    )
    args = parser.parse_args(argv)
    names = list(SCENARIOS) if args.scenario == "all" else [args.scenario]
    modes = ["gateway", "pass-through"] if args.mode == "both" else [args.mode]
    if args.keep is not None:
        args.keep.mkdir(parents=True, exist_ok=True)
    with (
        nullcontext(str(args.keep))
        if args.keep is not None
        else tempfile.TemporaryDirectory(prefix="authn-loadtest-")
    ) as tmp:
        for name in names:
            scenario = SCENARIOS[name]
            changes = {
                k: v for k, v in (("users", args.users), ("rate", args.rate)) if v is not None
            }
            if changes:
                from dataclasses import replace

                scenario = replace(scenario, **changes)
            try:
                run_scenario(
                    scenario, args.duration, modes, args.out, Path(tmp), args.direct_seconds
                )
            except Exception as exc:
                traceback.print_exc()
                print(f"{name}: FAILED: {exc}", file=sys.stderr, flush=True)
                logs = sorted(Path(tmp).glob("*.log"))
                for log in logs[-4:]:
                    print(
                        f"--- {log.name}\n{log.read_text(errors='replace')[-2000:]}",
                        file=sys.stderr,
                    )
                if args.scenario != "all":
                    return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
