"""What a forced-closed breaker costs known users while the IdP hangs.

    python -m loadtests.forced_closed --users 20

Starts the fake IdP and one gateway (in memory, backend call timeout 4 s), warms
``--users`` users, lets their entries go stale, forces the breaker closed and makes
the IdP hang; then reviews every known user once, concurrently, and prints their
answer times (median, max). Twice, side by side: with
``breaker.forced_closed_stale_wait_seconds`` at ``--bound`` (default 0.5 s), and at the
call timeout, which is how a forced-closed breaker behaved before the bound existed.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

from tests.support import loadclient
from tests.support.fakes.idp import FakeIdP
from tests.support.procs import start_gateway

# A generated secret: at least 256 bits (authn_gateway/secret_strength.py).
ADMIN = "forced-closed-bench-admin-Kq4Zp9Xw2Lm7Vt1Nc8Bh3Dy6Fs5Gj0"
CALL_TIMEOUT = 4.0


def run(users: int, bound: float) -> tuple[list[float], int, int]:
    """(answer seconds of the known users, how many were answered, IdP calls)."""
    idp = FakeIdP(control_port=0).start_in_thread()
    config = {
        "logging": {"reviews": False},
        "admin": {"enabled": True, "token": ADMIN},
        "review_deadline_seconds": CALL_TIMEOUT + 2,
        "backends": [
            {
                "name": "idp",
                "type": "userinfo",
                "url": idp.url,
                "timeouts": {"read_seconds": CALL_TIMEOUT, "total_seconds": CALL_TIMEOUT},
                "cache": {"positive_ttl_seconds": 1, "max_stale_seconds": 600},
                "breaker": {"forced_closed_stale_wait_seconds": bound},
                "bucket": {"rate": 1000, "burst": 1000},
            }
        ],
    }
    known = [f"good-known{i}" for i in range(users)]
    try:
        with tempfile.TemporaryDirectory(prefix="authn-forced-closed-") as tmp:
            gw = start_gateway(config, Path(tmp))
            try:
                asyncio.run(loadclient.storm(gw.url, known, 20))
                time.sleep(1.2)  # past the positive TTL
                httpx.post(
                    f"{gw.url}/admin/breakers/idp/force-closed",
                    headers={"Authorization": f"Bearer {ADMIN}"},
                    timeout=10,
                ).raise_for_status()
                idp.configure(hang=True)
                before = idp.calls
                answers = asyncio.run(loadclient.storm(gw.url, known, len(known)))
                calls = idp.calls - before
            finally:
                gw.stop()
    finally:
        idp.stop()
    stale = sum(1 for a in answers if a.review.get("authenticated"))
    return [a.seconds for a in answers], stale, calls


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--users", type=int, default=20)
    parser.add_argument("--bound", type=float, default=0.5, help="seconds (the default)")
    args = parser.parse_args(argv)
    # The fake IdP's hung handlers are cancelled when it stops: not news.
    logging.getLogger("asyncio").setLevel(logging.CRITICAL)
    print(f"IdP hanging, backend call timeout {CALL_TIMEOUT:g} s, {args.users} known users")
    medians, maxima = [], []
    for bound in (args.bound, CALL_TIMEOUT):
        seconds, stale, calls = run(args.users, bound)
        medians.append(statistics.median(seconds))
        maxima.append(max(seconds))
        print(
            f"forced_closed_stale_wait_seconds {bound:g}: {stale}/{args.users} answered "
            f"(stale), median {medians[-1]:.3f} s, max {maxima[-1]:.3f} s, "
            f"IdP calls {calls}"
        )
    # Some known users are answered stale before asking (the concurrency limit has no
    # slot for their refresh): the longest wait is the figure the bound sets.
    print(f"ratio without/with the bound: longest wait {maxima[1] / maxima[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
