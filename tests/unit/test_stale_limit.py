"""Issue 18, item 4, on real processes: the stale limit is computed when an entry is
read, from its last successful check and the *running* config, so an operator who
raises ``max_stale_seconds`` and reloads during an IdP outage keeps known users in,
and one who lowers it cuts them off at once. With and without Redis; and entries
written by the previous version are still served (a rolling upgrade logs nobody out).
"""

from __future__ import annotations

from authn_gateway.config import GatewayConfig
from authn_gateway.serve.gateway import Gateway
from tests.support.stale_limit_helpers import SECRET


async def test_a_reload_that_changes_only_the_gateway_wide_max_stale_keeps_the_stores() -> None:
    """deploy/base sets cache: at the top, for every backend; without Redis the
    in-process store is all there is, so such a reload must keep it."""

    def gateway_config(max_stale: float) -> GatewayConfig:
        return GatewayConfig.model_validate(
            {
                "secret": SECRET,
                "cache": {"max_stale_seconds": max_stale, "keep_stale_seconds": 7200},
                "backends": [{"name": "idp", "type": "userinfo", "url": "http://127.0.0.1:9/"}],
            }
        )

    first = Gateway(gateway_config(60))
    second = Gateway(gateway_config(3600), metrics=first.metrics, previous=first)
    try:
        assert second.stores is first.stores
        assert second.hasher is first.hasher
        cache = second.config.cache_for(second.config.backends[0])
        assert (cache.max_stale_seconds, cache.keep_stale_seconds) == (3600, 7200)
    finally:
        await second.close()
        await first.close()
