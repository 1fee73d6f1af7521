"""Memory per parked connection: what a client holding connections open costs the gateway.

    python -m loadtests.parked --connections 1000

Starts ``authn-gateway serve`` (plain HTTP, default limits except max_connections and a
long header timeout so nothing is cut off while measuring), then reads the process's
RSS (VmRSS) after opening N connections that send nothing, after N more that each send
an unfinished head of ``max_header_bytes`` (one endless header line: what httptools
must buffer), and after all of them are closed. Prints KiB per connection.
"""

from __future__ import annotations

import argparse
import resource
import socket
import sys
import tempfile
import time
from pathlib import Path

from tests.support.procs import start_gateway

STATIC = {"name": "demo", "type": "static", "tokens": [{"token": "t" * 16, "username": "u"}]}


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def settle(pid: int) -> int:
    # Let the event loop accept and read everything, then take the RSS.
    time.sleep(1.5)
    return rss_kib(pid)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--connections", type=int, default=1000)
    parser.add_argument("--max-header-bytes", type=int, default=16 * 1024)
    args = parser.parse_args(argv)
    n = args.connections
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, 2 * n + 100)), hard))
    config = {
        "logging": {"reviews": False},
        "server": {
            "max_connections": 2 * n + 10,
            "header_timeout_seconds": 300,  # the most a Timeout takes: past the run
            "max_header_bytes": args.max_header_bytes,
        },
        "backends": [STATIC],
    }
    with tempfile.TemporaryDirectory(prefix="authn-parked-") as tmp:
        gw = start_gateway(config, Path(tmp))
        try:
            pid = gw.proc.pid
            time.sleep(2)
            base = settle(pid)
            silent = [socket.create_connection(("127.0.0.1", gw.port)) for _ in range(n)]
            after_silent = settle(pid)
            # Just under the limit: the longest unfinished head a client may park.
            partial = b"POST /authenticate HTTP/1.1\r\nhost: x\r\nx-endless: "
            partial += b"a" * (args.max_header_bytes - len(partial) - 64)
            heads = []
            for _ in range(n):
                s = socket.create_connection(("127.0.0.1", gw.port))
                s.sendall(partial)
                heads.append(s)
            after_heads = settle(pid)
            for s in silent + heads:
                s.close()
            after_close = settle(pid)
        finally:
            gw.stop()
    print(f"RSS at start: {base / 1024:.1f} MiB")
    print(
        f"{n} silent connections: +{(after_silent - base) / 1024:.1f} MiB, "
        f"{(after_silent - base) / n:.1f} KiB each"
    )
    print(
        f"{n} unfinished {args.max_header_bytes // 1024} KiB heads: "
        f"+{(after_heads - after_silent) / 1024:.1f} MiB, "
        f"{(after_heads - after_silent) / n:.1f} KiB each"
    )
    print(f"after closing all: {after_close / 1024:.1f} MiB ({(after_close - base) / 1024:+.1f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
