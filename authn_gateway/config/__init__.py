"""The gateway's configuration: one YAML file, one typed schema.

:func:`load_config` validates everything at start-up and raises :class:`ConfigError`
whose lines name the file and the field, e.g.
``gateway.yaml: backends[1].timeouts.total_seconds: Input should be greater than 0``.

By job: :mod:`.schema` (the whole file), :mod:`.server`, :mod:`.sections` and
:mod:`.redis_settings`, :mod:`.clusters` (its sections; each backend's own are in ``backends/``),
:mod:`.safe_yaml` (text to data) and :mod:`.loading` (data to a config, or error lines).
The names the rest of the gateway uses are here; the other sections are in their module.
"""

from authn_gateway.config.clusters import ClusterSettings, cluster_weights
from authn_gateway.config.loading import EMBEDDED_DEFAULT, ConfigError, load_config, parse_config
from authn_gateway.config.redis_settings import RedisSettings
from authn_gateway.config.schema import SECRET_ENV, GatewayConfig
from authn_gateway.config.sections import DenyListSettings
from authn_gateway.config.server import CallerToken, ServerSettings, TLSSettings

__all__ = [
    "EMBEDDED_DEFAULT",
    "SECRET_ENV",
    "CallerToken",
    "ClusterSettings",
    "ConfigError",
    "DenyListSettings",
    "GatewayConfig",
    "RedisSettings",
    "ServerSettings",
    "TLSSettings",
    "cluster_weights",
    "load_config",
    "parse_config",
]
