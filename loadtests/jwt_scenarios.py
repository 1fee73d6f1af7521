"""Load scenarios for the jwt backend: an issuer outage, and a flood of random kids.

Each scenario runs a real ``authn-gateway serve`` against the fake issuer
(:mod:`tests.support.fakes.issuer`, real keys over HTTPS). It runs twice: once with the
gateway's key protections, and once with a reference that a naive verifier
approximates (no stale key set, no floor between fetches). The figures are printed,
never asserted:

* ``outage``: 80 % known tokens and 20 % never-seen valid tokens, in ticks of 0.5 s.
  The issuer refuses connections from 30 % to 70 % of the run, and the key set's
  lifetime (``max-age``) is shorter than the outage.
* ``kid-flood``: a flood of tokens with random ``kid``s at full speed, with valid
  users' reviews mixed in.

``python -m loadtests.jwt_scenarios [outage|kid-flood|all] [--duration S]``
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

from tests.support import loadclient
from tests.support.fakes.issuer import DISCOVERY_PATH, JWKS_PATH, FakeIssuer
from tests.support.procs import GatewayProcess, metric_value, start_gateway


def gateway_config(issuer: FakeIssuer, protected: bool) -> dict[str, Any]:
    keys = (
        {"min_refresh_seconds": 5, "max_stale_seconds": 3600}
        # The reference: every unknown kid may refetch; nothing stale is trusted.
        if protected
        else {"min_refresh_seconds": 0.001, "max_stale_seconds": 0, "max_backoff_seconds": 0.001}
    )
    return {
        "inbound_limit": {"enabled": False},
        "logging": {"reviews": False},
        "cache": {"negative_ttl_seconds": 0},
        "backends": [
            {
                "name": "oidc",
                "type": "jwt",
                "issuer": {
                    "url": issuer.issuer,
                    "certificateAuthority": issuer.ca_pem,
                    "audiences": ["gateway"],
                },
                "claimMappings": {"username": {"claim": "sub", "prefix": "oidc:"}},
                "keys": keys,
                "timeouts": {"connect_seconds": 0.5, "read_seconds": 1.0, "total_seconds": 1.0},
            }
        ],
    }


def issuer_fetches(issuer: FakeIssuer) -> int:
    return issuer.path_calls(JWKS_PATH) + issuer.path_calls(DISCOVERY_PATH)


def ok_share(answers: list[loadclient.Answer]) -> float:
    good = sum(1 for a in answers if a.review.get("authenticated") is True)
    return good / len(answers) if answers else 0.0


def p99_ms(answers: list[loadclient.Answer]) -> float:
    seconds = sorted(a.seconds for a in answers)
    return seconds[int(0.99 * (len(seconds) - 1))] * 1000 if seconds else 0.0


async def outage(issuer: FakeIssuer, gw: GatewayProcess, duration: float) -> dict[str, Any]:
    known = [issuer.mint(issuer.claims(f"known-{i}")) for i in range(200)]
    await loadclient.storm(gw.url, known, 20)
    ticks = int(duration / 0.5)
    down_at, up_at = int(0.3 * ticks), int(0.7 * ticks)
    during: list[loadclient.Answer] = []
    outside: list[loadclient.Answer] = []
    fetch_mark = fetches_during = 0
    for tick in range(ticks):
        if tick == down_at:
            issuer.configure(refuse=True)
            fetch_mark = issuer_fetches(issuer)
        if tick == up_at:
            issuer.configure(refuse=False)
            fetches_during = issuer_fetches(issuer) - fetch_mark  # 0: refused
        started = time.monotonic()
        fresh = [issuer.mint(issuer.claims(uuid.uuid4().hex)) for _ in range(10)]
        answers = await loadclient.storm(gw.url, known[tick % 5 :: 5][:40] + fresh, 20)
        (during if down_at <= tick < up_at else outside).extend(answers)
        await asyncio.sleep(max(0.0, 0.5 - (time.monotonic() - started)))
    return {
        "reviews": len(during) + len(outside),
        "ok outside the outage": f"{ok_share(outside):.1%}",
        "ok during the outage": f"{ok_share(during):.1%}",
        # Refused connections never reach the issuer's counter: the gateway's own count.
        "failed fetch attempts": int(
            metric(gw, "authn_gateway_jwks_fetches_total", backend="oidc", result="failed")
        ),
        "issuer fetches after recovery": issuer_fetches(issuer) - fetch_mark - fetches_during,
        "stale verifications": int(
            metric(gw, "authn_gateway_jwks_stale_verifications_total", backend="oidc")
        ),
        "p99 ms": f"{p99_ms(during + outside):.1f}",
    }


async def kid_flood(issuer: FakeIssuer, gw: GatewayProcess, duration: float) -> dict[str, Any]:
    before = issuer_fetches(issuer)
    started = time.monotonic()
    flood: list[loadclient.Answer] = []
    users: list[loadclient.Answer] = []
    while time.monotonic() - started < duration:
        batch = [
            issuer.mint(issuer.claims(uuid.uuid4().hex), headers={"kid": uuid.uuid4().hex})
            for _ in range(200)
        ]
        valid = [issuer.mint(issuer.claims(f"user-{i}")) for i in range(20)]
        answers = await loadclient.storm(gw.url, batch + valid, 50)
        flood.extend(answers[:200])
        users.extend(answers[200:])
    elapsed = time.monotonic() - started
    return {
        "flood tokens": len(flood),
        "flood refused": f"{1 - ok_share(flood):.1%}",
        "valid users ok": f"{ok_share(users):.1%}",
        "issuer fetches": issuer_fetches(issuer) - before,
        "issuer fetches per minute": f"{(issuer_fetches(issuer) - before) / elapsed * 60:.0f}",
        "p99 ms": f"{p99_ms(flood + users):.1f}",
        "median ms": f"{statistics.median(a.seconds for a in users) * 1000:.1f}",
    }


def metric(gw: GatewayProcess, name: str, **labels: str) -> float:
    return metric_value(httpx.get(f"{gw.url}/metrics").text, name, **labels)


SCENARIOS = {"outage": outage, "kid-flood": kid_flood}


def run(name: str, duration: float, workdir: Path) -> None:
    rows: dict[str, dict[str, Any]] = {}
    for protected in (True, False):
        issuer = FakeIssuer(max_age=3).start_in_thread()
        gw = start_gateway(gateway_config(issuer, protected), workdir, name=f"gw-{name}")
        try:
            rows["gateway" if protected else "reference"] = asyncio.run(
                SCENARIOS[name](issuer, gw, duration)
            )
        finally:
            gw.stop()
            issuer.stop()
    print(f"\n== {name} ({duration:g} s) ==")
    keys = list(rows["gateway"])
    print(f"{'':42} {'gateway':>12} {'reference':>12}")
    for key in keys:
        print(f"{key:42} {rows['gateway'][key]!s:>12} {rows['reference'][key]!s:>12}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("scenario", choices=[*SCENARIOS, "all"])
    parser.add_argument("--duration", type=float, default=20.0)
    args = parser.parse_args()
    names = list(SCENARIOS) if args.scenario == "all" else [args.scenario]
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            run(name, args.duration, Path(tmp))


if __name__ == "__main__":
    main()
