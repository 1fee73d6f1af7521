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
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

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

    def run(self) -> None:
        client = httpx.Client(timeout=2)
        while not self._halt.is_set():
            t = time.time()
            try:
                calls = int(self.fake.stats()["calls"])
            except (httpx.HTTPError, KeyError, ValueError):
                calls = self.samples[-1].idp_calls if self.samples else 0
            states, backend_calls, stale, refusals = [], 0.0, 0.0, 0.0
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
            # The worst replica's view: open beats half-open beats closed.
            worst = max(states, key=lambda s: BREAKER_LEVEL.get(s, 0)) if states else "closed"
            self.samples.append(Sample(t, calls, worst, backend_calls, stale, refusals))
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
        return {
            "reviews": reviews,
            "attempts": attempts,
            "answers": answers,
            "http_5xx": sum(v for k, v in statuses.items() if k.isdigit() and int(k) >= 500),
            "reauths": sum(r.get("reauths", 0) for r in rows),
        }


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
        sampler = Sampler(fake, gateways)
        sampler.start()
        stack.callback(sampler.stop)
        proc, timeline_path = run_locust(scenario, gateways, fake, duration, workdir, tag)
        stack.callback(_stop, proc)
        started = time.time()
        marks = play(scenario.steps, started, duration, fake, redis, proc)
        proc.wait(timeout=duration + 60)
        sampler.stop()
        checks: dict[str, Any] = {}
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
    keys = sorted({k for r in results for k in r.checks})
    for k in keys:
        add(k.replace("_", " "), [r.checks.get(k, "-") for r in results])
    return rows


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


def plot(scenario: Scenario, results: list[Result], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(4, 1, figsize=(8, 9), sharex=True, dpi=80)
    colors = {"authenticated": "tab:green", "rejected": "tab:orange", "unavailable": "tab:red"}
    styles = {"gateway": "-", "pass-through": ":"}
    for res in results:
        rows = res.timeline.get("rows", [])
        t = [r["t"] - res.started + 0.5 for r in rows]
        ls = styles[res.mode]
        axes[0].plot(
            t,
            [r["attempts"] for r in rows],
            ls,
            color="black",
            label=f"offered (HTTP attempts/s), {res.mode}",
        )
        if res.mode == "gateway":
            for answer, color in colors.items():
                axes[0].plot(
                    t, [r["answers"].get(answer, 0) for r in rows], ls, color=color, label=answer
                )
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
        axes[3].plot(t, [r["p50_ms"] for r in rows], ls, color="tab:blue", label=f"p50 {res.mode}")
        axes[3].plot(t, [r["p99_ms"] for r in rows], ls, color="tab:red", label=f"p99 {res.mode}")
    axes[0].set_ylabel("reviews/s")
    axes[0].legend(fontsize=7, loc="upper right", ncol=2)
    axes[1].set_ylabel("IdP calls/s")
    axes[1].set_yscale("symlog", linthresh=1)
    axes[1].legend(fontsize=7, loc="upper right")
    axes[2].set_ylabel("breaker")
    axes[2].set_yticks([0, 1, 2], ["closed", "half-open", "open"])
    axes[2].set_ylim(-0.3, 2.3)
    axes[3].set_ylabel("latency ms")
    axes[3].set_yscale("log")
    axes[3].legend(fontsize=7, loc="upper right", ncol=2)
    axes[3].set_xlabel("seconds")
    gw = next((r for r in results if r.mode == "gateway"), results[0])
    for ax in axes:
        ax.grid(alpha=0.3)
        for at, _label in gw.marks:
            ax.axvline(at, color="grey", ls="--", lw=0.8)
    for at, label in gw.marks:
        axes[0].annotate(
            label,
            (at, 1),
            xycoords=("data", "axes fraction"),
            fontsize=7,
            rotation=0,
            va="top",
            ha="left",
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
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    _shrink(path)


def _shrink(path: Path) -> None:
    """A palette PNG: a third of the size, so the plots can live in the repo."""
    from PIL import Image

    with Image.open(path) as img:
        small = img.convert("RGB").quantize(colors=256)
    small.save(path, optimize=True)


# ---- main ----------------------------------------------------------------------------


def run_scenario(
    scenario: Scenario, duration: float, modes: list[str], out: Path, workdir: Path
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
        "results": [
            {
                "mode": r.mode,
                "idp_calls": r.idp_calls,
                "totals": r.totals(),
                "checks": r.checks,
                "marks": r.marks,
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
    args = parser.parse_args(argv)
    names = list(SCENARIOS) if args.scenario == "all" else [args.scenario]
    modes = ["gateway", "pass-through"] if args.mode == "both" else [args.mode]
    with tempfile.TemporaryDirectory(prefix="authn-loadtest-") as tmp:
        for name in names:
            scenario = SCENARIOS[name]
            changes = {
                k: v for k, v in (("users", args.users), ("rate", args.rate)) if v is not None
            }
            if changes:
                from dataclasses import replace

                scenario = replace(scenario, **changes)
            try:
                run_scenario(scenario, args.duration, modes, args.out, Path(tmp))
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
