"""Instructions a cache miss costs, counted by valgrind: the same figures on a quiet or
a busy machine.

``loadtests.misspath`` times a miss's CPU, which moves by tens of percent with whatever
else the machine runs. This counts instructions instead (callgrind counts what the
process executes, not how long it took). Each row is a small program run twice under
callgrind against the fake IdP, with none and with ``--calls`` IdP calls after a
first warm-up one; the difference over the calls is the instructions one call costs:

- the backend's HTTP client (httpx on the aiohttp wire, with the transport wrappers
  of ``backends.http``);
- aiohttp's client alone (the wire under it);
- a whole missed review through the edge protocol (the same as misspath's last row).

The whole miss less the backend's client is the gateway's own work around the call.
Needs valgrind (Debian package valgrind); takes about a minute:

    python -m loadtests.misscount [--calls 200]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tests.support.procs import free_port, wait_for_port

ROWS = {
    "client": "the backend's client (httpx and its wrappers), per call",
    "aiohttp": "aiohttp's client alone (the backends' wire)",
    "miss": "a whole missed review through the edge protocol",
}
_COLLECTED = re.compile(rb"Collected : (\d+)")
Call = Callable[[], Awaitable[None]]


async def _calls(row: str, url: str, calls: int) -> None:
    """The child: one warm-up call, then ``calls`` more, of ``row``."""
    one: Call
    close: Call
    serial = iter(range(10**9))
    if row == "client":
        from backends.http import TLSClientSettings, make_client
        from backends.settings import TimeoutSettings

        client = make_client(url, TimeoutSettings(), TLSClientSettings())

        async def one() -> None:
            answer = await client.get("", headers={"Authorization": f"Bearer good-{next(serial)}"})
            assert answer.status_code == 200

        close = client.aclose
    elif row == "aiohttp":
        import aiohttp

        session = aiohttp.ClientSession()

        async def one() -> None:
            headers = {"Authorization": f"Bearer good-{next(serial)}"}
            async with session.get(url, headers=headers) as answer:
                assert answer.status == 200
                await answer.read()

        close = session.close
    else:
        one, close = await _gateway_miss(url)
    await one()
    for _ in range(calls):
        await one()
    await close()


async def _gateway_miss(
    url: str,
) -> tuple[Callable[[], Awaitable[None]], Callable[[], Awaitable[None]]]:
    from authn_gateway.config import parse_config
    from authn_gateway.edge import GatewayHttpProtocol
    from authn_gateway.observe.logsink import LogSink
    from authn_gateway.serve.app import GatewayApp
    from authn_gateway.serve.gateway import Gateway

    from .hotpath import connection
    from .misspath import BODY, CONFIG, REQUEST, AwaitedTransport, fresh_token

    gateway = Gateway(parse_config(CONFIG.format(url=url), "misscount"))
    app = GatewayApp(gateway)
    assert app.review_log is not None
    app.review_log.sink = LogSink(os.devnull)
    await gateway.start()
    loop = asyncio.get_running_loop()

    class KeepsTheAnswer(AwaitedTransport):
        last = b""

        def write(self, data: bytes) -> None:
            self.last = data
            super().write(data)

    transport = KeepsTheAnswer()
    conn = connection(app, GatewayHttpProtocol, transport)[0]

    async def one() -> None:
        body = BODY % fresh_token().encode()
        transport.answered = loop.create_future()
        conn.data_received(REQUEST % len(body) + body)
        await transport.answered
        assert b'"authenticated":true' in transport.last, transport.last

    async def close() -> None:
        conn.connection_lost(None)
        await gateway.close()

    return one, close


def instructions(row: str, url: str, calls: int, workdir: Path) -> int:
    """Instructions callgrind counted in a child running ``row`` ``calls`` times."""
    out = workdir / f"callgrind.{row}.{calls}"
    cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", sys.executable]
    cmd += ["-m", "loadtests.misscount", "--child", row, "--url", url, "--calls", str(calls)]
    done = subprocess.run(cmd, capture_output=True, timeout=900)
    if done.returncode != 0:
        raise SystemExit(f"{row} under callgrind failed:\n{done.stderr.decode()[-3000:]}")
    found = _COLLECTED.search(done.stderr)
    if found is None:
        raise SystemExit(f"callgrind printed no count for {row}:\n{done.stderr.decode()[-2000:]}")
    return int(found.group(1))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=200, help="IdP calls counted (200)")
    parser.add_argument(
        "--rows", default=",".join(ROWS), help=f"which rows, comma-separated ({','.join(ROWS)})"
    )
    parser.add_argument("--child", choices=sorted(ROWS), help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        import uvloop

        uvloop.run(_calls(args.child, args.url, args.calls))
        return 0
    if shutil.which("valgrind") is None:
        print("valgrind is not installed (Debian package valgrind)", file=sys.stderr)
        return 2
    asked = args.rows.split(",")
    unknown = sorted(set(asked) - set(ROWS))
    if unknown:
        parser.error(f"--rows: no row {', '.join(unknown)} (rows: {', '.join(ROWS)})")
    rows = [row for row in ROWS if row in asked]
    port, control = free_port(), free_port()
    cmd = [sys.executable, "-m", "tests.support.fakes.idp", "--port", str(port)]
    cmd += ["--control-port", str(control)]
    with tempfile.TemporaryDirectory() as tmp, Path(tmp, "idp.log").open("wb") as log:
        idp = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_for_port(port, proc=idp, timeout=20)
            url = f"http://127.0.0.1:{port}/userinfo"
            print(f"instructions per call (callgrind; {args.calls} calls less none):")
            per_call: dict[str, float] = {}
            # Each row's two children side by side, one per core: each is counted alone.
            with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
                for row in rows:
                    many, none = pool.map(
                        instructions, (row, row), (url, url), (args.calls, 0), (Path(tmp),) * 2
                    )
                    per_call[row] = (many - none) / args.calls
                    print(f"  {ROWS[row]:<60} {per_call[row] / 1e6:6.2f} M", flush=True)
        finally:
            idp.terminate()
            idp.wait(timeout=10)
    if "miss" in per_call and "client" in per_call:
        own = per_call["miss"] - per_call["client"]
        label = "the gateway around the call (whole miss less the client)"
        print(f"  {label:<60} {own / 1e6:6.2f} M")
        print(f"the client's share of a miss: {per_call['client'] / per_call['miss']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
