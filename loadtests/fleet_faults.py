"""What an IdP outage and a cold burst cost the IdP, with N replicas sharing one Redis.

For each replica count and fault: a fake IdP, one real redis-server, N gateway
processes (fail_max 5, reset_timeout 5 s, 1 half-open probe, bucket 100/s burst 100).
Cold tokens are offered at a fixed rate (open loop); the fault starts after a healthy
warm-up, and the IdP's own counter says how many calls reached it during the fault,
against the bound fail_max + in-flight limit + probes per reset_timeout. Then a cold
burst (300 tokens at 450/s) after recovery: the most calls the IdP saw in any one
second, against burst + rate * 1 s. The gateways' own Redis latency histograms
(``authn_gateway_redis_duration_seconds``) give Redis latency under that load, and
``authn_gateway_redis_mode_changes_total`` (when it exists) how often a replica
left shared mode.

    python -m loadtests.fleet_faults --replicas 1,3,6 --faults reset,500,hang,slow
    python -m loadtests.fleet_faults --replicas 6 --faults hang,reset --expected-replicas 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from backends.settings import ConcurrencySettings
from tests.support.fakes.idp import FakeIdP
from tests.support.fakes.keystone import FakeKeystone, mint_token
from tests.support.fleet import Fleet, fleet_config, open_loop, running
from tests.support.procs import metric_value

FAULTS: dict[str, dict[str, Any]] = {
    "reset": {"reset": True},
    "500": {"status": 500},
    "hang": {"hang": True},
    "slow": {"latency": 1.5},
}
HEALTHY = {"reset": False, "status": None, "hang": False, "latency": 0.0}


def backend(idp: FakeIdP, extra: dict[str, Any]) -> dict[str, Any]:
    if isinstance(idp, FakeKeystone):
        kind: dict[str, Any] = {
            "name": "idp",
            "type": "keystone",
            "auth_url": f"http://127.0.0.1:{idp.port}/v3",
            "service": {
                "username": "authn-gateway",
                "password": "GatewayPass123",
                "system_scope": "all",
            },
        }
    else:
        kind = {"name": "idp", "type": "userinfo", "url": idp.url}
    return {
        **kind,
        "timeouts": {"connect_seconds": 0.5, "read_seconds": 1.0, "total_seconds": 1.0},
        "breaker": {"fail_max": 5, "reset_timeout_seconds": 5.0, "half_open_probes": 1},
        "bucket": {"rate": 100, "burst": 100},
        **extra,
    }


def histogram_quantile(text: str, name: str, q: float) -> float | None:
    """The q-quantile's bucket bound over all label sets of histogram ``name``."""
    buckets: dict[float, float] = {}
    for line in text.splitlines():
        if not line.startswith(f"{name}_bucket{{"):
            continue
        head, _, value = line.rpartition(" ")
        le = head.split('le="', 1)[1].split('"', 1)[0]
        bound = math.inf if le == "+Inf" else float(le)
        buckets[bound] = buckets.get(bound, 0.0) + float(value)
    if not buckets:
        return None
    total = buckets[math.inf]
    if total == 0:
        return None
    for bound in sorted(buckets):
        if buckets[bound] >= q * total:
            return bound
    return math.inf


def max_in_window(arrivals: list[float], window: float) -> int:
    best, lo = 0, 0
    for hi, t in enumerate(arrivals):
        while t - arrivals[lo] > window:
            lo += 1
        best = max(best, hi - lo + 1)
    return best


async def one_run(
    fleet: Fleet, idp: FakeIdP, fault: str, rate: float, outage: float, seq: list[int]
) -> dict[str, Any]:
    def cold(prefix: str) -> Any:
        def token(i: int) -> str:
            seq[0] += 1
            if isinstance(idp, FakeKeystone):
                return mint_token(f"{prefix}{seq[0]}", nonce=seq[0])
            return f"good-{prefix}-{seq[0]}"

        return token

    await open_loop(fleet.urls, rate, 2.0, cold("warm"))
    idp.reset_stats()
    idp.configure(**FAULTS[fault])
    fault_started = time.monotonic()
    during = await open_loop(fleet.urls, rate, outage, cold(fault))
    idp.configure(**HEALTHY)
    outage_stats = idp.stats()
    calls_in_outage = sum(1 for t in outage_stats.arrivals if t < fault_started + outage)
    # Recovery: wait out the breaker, then a cold burst.
    await asyncio.sleep(7.0)
    idp.reset_stats()
    burst = await open_loop(fleet.urls, 450, 300 / 450, cold(f"{fault}-burst"))
    await asyncio.sleep(0.5)
    arrivals = idp.stats().arrivals
    texts = [fleet.metrics(gw) for gw in fleet.replicas]
    merged = "\n".join(texts)
    return {
        "idp": type(idp).__name__,
        "fault": fault,
        "replicas": len(fleet.replicas),
        "offered_per_s": rate,
        "outage_s": outage,
        "idp_calls_in_outage": calls_in_outage,
        "idp_max_in_flight": outage_stats.max_in_flight,
        "answers_in_outage": during.answered,
        "errors_in_outage": during.errors,
        "burst_sent": burst.sent,
        "burst_idp_calls": len(arrivals),
        "burst_max_calls_in_1s": max_in_window(arrivals, 1.0),
        "redis_p50_s": histogram_quantile(merged, "authn_gateway_redis_duration_seconds", 0.5),
        "redis_p99_s": histogram_quantile(merged, "authn_gateway_redis_duration_seconds", 0.99),
        "propagation_p50_s": histogram_quantile(
            merged, "authn_gateway_breaker_propagation_seconds", 0.5
        ),
        "propagation_p99_s": histogram_quantile(
            merged, "authn_gateway_breaker_propagation_seconds", 0.99
        ),
        "redis_p999_s": histogram_quantile(merged, "authn_gateway_redis_duration_seconds", 0.999),
        "redis_errors": sum(metric_value(t, "authn_gateway_redis_errors_total") for t in texts),
        "left_shared": sum(
            metric_value(t, "authn_gateway_redis_mode_changes_total", to="local") for t in texts
        ),
    }


def bound(extra: dict[str, Any], outage: float) -> str:
    default = ConcurrencySettings().max_limit
    limit = extra.get("concurrency", {}).get("max_limit", default)
    probes = math.ceil(outage / 5.0)
    return f"5 + {limit} + {probes} = {5 + limit + probes}"


async def main_async(args: argparse.Namespace) -> list[dict[str, Any]]:
    extra = json.loads(args.backend) if args.backend else {}
    rows = []
    seq = [0]
    for n in [int(x) for x in args.replicas.split(",")]:
        for fault in args.faults.split(","):
            idp = (FakeKeystone() if args.idp == "keystone" else FakeIdP()).start_in_thread()
            try:
                with (
                    tempfile.TemporaryDirectory() as tmp,
                    running(
                        lambda url, idp=idp, n=n: fleet_config(
                            backend(idp, extra),
                            url,
                            expected_replicas=args.expected_replicas or n,
                            **args.redis,
                        ),
                        n,
                        Path(tmp),
                    ) as fleet,
                ):
                    row = await one_run(fleet, idp, fault, args.rate, args.outage, seq)
            finally:
                idp.stop()
            row["bound"] = bound(extra, args.outage)
            print(json.dumps(row), flush=True)
            rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--replicas", default="1,3")
    parser.add_argument("--idp", choices=("userinfo", "keystone"), default="userinfo")
    parser.add_argument("--faults", default="reset,500,hang,slow")
    parser.add_argument("--rate", type=float, default=150.0, help="offered reviews/s, fleet")
    parser.add_argument("--outage", type=float, default=10.0)
    parser.add_argument("--backend", default="", help="JSON merged into the backend config")
    parser.add_argument("--redis-timeout", type=float, default=None)
    parser.add_argument(
        "--expected-replicas",
        type=int,
        default=0,
        help="redis.expected_replicas (default: the replica count)",
    )
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    # The defaults (timeout 0.25 s, 3 late answers to local mode) unless --redis-timeout.
    args.redis = {"timeout_seconds": args.redis_timeout} if args.redis_timeout else {}
    rows = asyncio.run(main_async(args))
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
