"""The metric families a gateway exports, as a sorted list of lines ``name type help``,
read from a scrape's ``# HELP`` and ``# TYPE`` lines (so a family with no sample yet
counts too; label names show only on samples, so they are not in the list).

tests/support/metric_names.txt holds the list as it was when metrics moved beside their
layers (issue 31): a rename, a changed type or help text shows as a difference
against it. To write it again after a deliberate change:
``.venv/bin/python -m tests.support.metric_names > tests/support/metric_names.txt``.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx

from tests.support.procs import free_port, start_gateway
from tests.support.redis_server import RedisServer

FIXTURE = Path(__file__).resolve().parent / "metric_names.txt"
SECRET = "metric-names-test-secret-of-32-bytes-or-more"


def families(scrape: str) -> list[str]:
    """``name type help`` for each family of the scrape, sorted."""
    helps: dict[str, str] = {}
    types: dict[str, str] = {}
    for line in scrape.splitlines():
        if line.startswith("# HELP "):
            name, _, text = line[len("# HELP ") :].partition(" ")
            helps[name] = text
        elif line.startswith("# TYPE "):
            name, _, kind = line[len("# TYPE ") :].partition(" ")
            types[name] = kind
    assert helps.keys() == types.keys(), (sorted(helps), sorted(types))
    return sorted(
        f"{name} {types[name]} {helps[name]}"
        for name in helps
        # prometheus_client's creation times: there once a labelled family has a child
        # (a Redis call made before the scrape or not), and not a name anyone queries.
        if not (name.endswith("_created") and _created_of(name, helps))
    )


def _created_of(name: str, helps: dict[str, str]) -> bool:
    base = name.removesuffix("_created")
    return any(f"{base}{suffix}" in helps for suffix in ("", "_total"))


def every_kind_config(workdir: Path, redis_url: str) -> dict[str, Any]:
    """A gateway with one backend of every kind (none of their IdPs answers: the
    families are exported whatever they say), Redis, the admin API and an ops port."""
    nowhere = f"127.0.0.1:{free_port()}"
    static = workdir / "static.csv"
    static.write_text("static-token,alice,uid-1,\n")
    timeouts = {"connect_seconds": 0.2, "read_seconds": 1.0, "total_seconds": 1.0}
    return {
        "secret": SECRET,
        "server": {"ops": {"port": 0}},
        "logging": {"reviews": False},
        "admin": {"enabled": True, "token": SECRET + "-admin"},
        "redis": {"url": redis_url, "key_prefix": "metric-names"},
        "backends": [
            {"name": "static", "type": "static", "prefix": "s-", "file": str(static)},
            {"name": "sso", "type": "userinfo", "prefix": "u-", "url": f"http://{nowhere}/u"},
            {"name": "gitlab", "type": "gitlab", "prefix": "g-", "base_url": f"http://{nowhere}"},
            {
                "name": "ldap",
                "type": "ldap",
                "prefix": "l-",
                "url": f"ldap://{nowhere}",
                "allow_plaintext": True,
                "bind_dn": "cn=gw,dc=example,dc=org",
                "bind_password": "bind-password",
                "user_base": "ou=people,dc=example,dc=org",
                "timeouts": timeouts,
            },
            {
                "name": "keystone",
                "type": "keystone",
                "prefix": "k-",
                "auth_url": f"http://{nowhere}/v3",
                "service": {
                    "username": "gw",
                    "password": "service-password",
                    "system_scope": "all",
                },
                "timeouts": timeouts,
            },
            {
                "name": "oidc",
                "type": "jwt",
                "issuer": {"url": f"https://{nowhere}", "audiences": ["kubernetes"]},
                "claimMappings": {"username": {"claim": "sub", "prefix": ""}},
            },
            {
                "name": "opaque",
                "type": "introspection",
                "prefix": "o-",
                "url": f"http://{nowhere}/introspect",
                "client_id": "gw",
                "client_secret": "client-secret",
                "accept": {"audiences": ["kubernetes"]},
                "claimMappings": {"username": {"claim": "sub", "prefix": ""}},
            },
        ],
    }


def scrape_every_kind(workdir: Path) -> str:
    """One scrape of the ops port of a real gateway with every backend kind and Redis."""
    redis = RedisServer(workdir).start()
    try:
        return scrape(every_kind_config(workdir, redis.url), workdir)
    finally:
        redis.stop()


def scrape(config: dict[str, Any], workdir: Path) -> str:
    """One scrape of the ops port of a real gateway started with ``config``."""
    gw = start_gateway(config, workdir)
    try:
        port = ops_port(gw.wait_for_log("ops listener", timeout=15))
        return httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    finally:
        gw.stop()


def ops_port(logs: str) -> int:
    for line in logs.splitlines():
        if "ops listener" in line:
            return int(line.rsplit(":", 1)[1])
    raise AssertionError(f"no ops listener in the logs:\n{logs}")


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        sys.stdout.write("".join(f"{line}\n" for line in families(scrape_every_kind(Path(tmp)))))
