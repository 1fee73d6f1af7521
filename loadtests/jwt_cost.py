"""What one jwt review costs, cached against uncached, in process (no sockets).

The fake issuer publishes real keys over HTTPS; a gateway is built from a config with
a jwt backend and its keys fetched once. Then, per review, best of 5 rounds of CPU time:

* ``uncached``: a new token every review (signature check, claim checks, CEL mapping);
* ``cached``: the same token again (the review cache answers; no signature check);
* ``static``: the static backend on a cached token, the cheapest review there is;

for RS256 and ES256, with and without the CEL mappings. Run pinned for steadier
figures: ``taskset -c 1 python -m loadtests.jwt_cost``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from typing import Any

import yaml

from authn_gateway.config import parse_config
from authn_gateway.serve.gateway import Gateway
from tests.support.fakes.issuer import FakeIssuer

ROUNDS, N = 5, 2000

PLAIN_MAPPINGS = {"username": {"claim": "sub", "prefix": "oidc:"}}
CEL_MAPPINGS = {
    "username": {"expression": "'oidc:' + claims.sub"},
    "groups": {"expression": "claims.groups.map(g, 'oidc:' + g)"},
    "extra": [{"key": "example.com/scopes", "valueExpression": "claims.scope.split(' ')"}],
}


def config(issuer: FakeIssuer, mappings: dict[str, Any], cache: bool) -> str:
    return yaml.safe_dump(
        {
            "inbound_limit": {"enabled": False},
            "cache": {"positive_ttl_seconds": 300 if cache else 0},
            "backends": [
                {
                    "name": "oidc",
                    "type": "jwt",
                    "issuer": {
                        "url": issuer.issuer,
                        "certificateAuthority": issuer.ca_pem,
                        "audiences": ["gateway"],
                    },
                    "claimMappings": mappings,
                },
                {
                    "name": "demo",
                    "type": "static",
                    "prefix": "demo-",
                    "tokens": [{"token": "demo-token", "username": "demo"}],
                },
            ],
        }
    )


async def best_us(gateway: Gateway, tokens: list[str]) -> float:
    best = float("inf")
    review = gateway.pipeline.review
    for _ in range(ROUNDS):
        started = time.process_time()
        for token in tokens:
            verdict = await review(token, (), "bench")
            assert verdict.outcome.__class__.__name__ == "Authenticated", verdict
        best = min(best, (time.process_time() - started) / len(tokens) * 1e6)
    return best


async def measure(
    issuer: FakeIssuer, alg_kid: str, mappings: dict[str, Any], n: int = N
) -> dict[str, float]:
    claims = issuer.claims(groups=["dev", "ops"], scope="read write")
    fresh = [issuer.mint({**claims, "jti": str(i)}, kid=alg_kid) for i in range(n * ROUNDS)]
    figures = {}
    for cache in (False, True):
        gateway = Gateway(parse_config(config(issuer, mappings, cache), "bench"))
        await gateway.start()
        try:
            if cache:
                one = issuer.mint(claims, kid=alg_kid)
                await gateway.pipeline.review(one, (), "bench")
                figures["cached"] = await best_us(gateway, [one] * n)
                await gateway.pipeline.review("demo-token", (), "bench")
                figures["static"] = await best_us(gateway, ["demo-token"] * n)
            else:
                # Each round gets tokens never seen (no cache anyway: positive TTL 0).
                best = float("inf")
                for r in range(ROUNDS):
                    batch = fresh[r * n : (r + 1) * n]
                    best = min(best, await best_once(gateway, batch))
                figures["uncached"] = best
        finally:
            await gateway.close()
    return figures


async def best_once(gateway: Gateway, tokens: list[str]) -> float:
    started = time.process_time()
    for token in tokens:
        await gateway.pipeline.review(token, (), "bench")
    return (time.process_time() - started) / len(tokens) * 1e6


async def main(n: int) -> None:
    issuer = FakeIssuer().start_in_thread()
    issuer.add_key("ec-1", "ES256")
    try:
        print(f"jwt review cost, us of CPU per review (best of {ROUNDS} x {n}), pid {os.getpid()}")
        print(f"{'key':6} {'mappings':9} {'uncached':>9} {'cached':>8} {'static':>8} {'ratio':>7}")
        for kid, alg in (("key-1", "RS256"), ("ec-1", "ES256")):
            for label, mappings in (("claim", PLAIN_MAPPINGS), ("CEL", CEL_MAPPINGS)):
                f = await measure(issuer, kid, mappings, n)
                print(
                    f"{alg:6} {label:9} {f['uncached']:9.1f} {f['cached']:8.1f} "
                    f"{f['static']:8.1f} {f['uncached'] / f['cached']:6.1f}x"
                )
    finally:
        issuer.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=N, help=f"reviews per round ({N})")
    asyncio.run(main(parser.parse_args().calls))
