"""Instructions a cache hit costs, counted by valgrind: the same figure on a quiet or a
busy machine, for this checkout and, with ``--against DIR``, for another one.

``loadtests.bench`` measures throughput under wrk, which moves by tens of percent with
whatever else the machine runs, and ``loadtests.hotpath`` times CPU in process. This
counts instructions instead (callgrind counts what the process executes, not how long
it took): a small program feeds ``--calls`` cached reviews through the edge protocol
(``loadtests.hotpath``'s harness: parse, the review, the answer written, the review log
line queued), and again none; the difference over the calls is one hit. With
``--against DIR`` (``git worktree add DIR <commit>``) the same program runs on DIR's
code too, and the ratio of the two is printed. Needs valgrind (Debian package
valgrind); about a minute a checkout on two cores, most of it start-up under valgrind:

    python -m loadtests.hitcount [--calls 4000] [--against DIR]
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
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

_COLLECTED = re.compile(rb"Collected : (\d+)")
# Requests per turn of the loop, as hotpath feeds them (one on each connection).
PER_TURN = 16


async def _hits(calls: int) -> None:
    """The child, run on the checkout it was started in: ``calls`` cached reviews."""
    from authn_gateway.config import parse_config
    from authn_gateway.edge import GatewayHttpProtocol
    from authn_gateway.observe.logsink import LogSink
    from authn_gateway.serve.app import GatewayApp
    from authn_gateway.serve.gateway import Gateway
    from backends.base import Authenticated, UserInfo
    from loadtests.hotpath import CONFIG, REQUEST, TOKEN, connection

    app = GatewayApp(Gateway(parse_config(CONFIG, "hitcount")))
    assert app.review_log is not None
    app.review_log.sink = LogSink(os.devnull)
    gateway = app.gateway
    await gateway.start()
    stack = gateway.pipeline.backends["idp"].top
    key = gateway.hasher.cache_key(stack.namespace, TOKEN, ())  # type: ignore[attr-defined]
    user = Authenticated(UserInfo("bench-user", "1000", ("developers", "viewers")))
    await stack.cache.put(key, user, time.time(), gateway.hasher.token_id(TOKEN))  # type: ignore[attr-defined]
    conns = [connection(app, GatewayHttpProtocol) for _ in range(PER_TURN)]

    async def turn() -> None:
        wants = [transport.answers + 1 for _, transport in conns]
        for conn, _ in conns:
            conn.data_received(REQUEST)
        for (_, transport), want in zip(conns, wants, strict=True):
            while transport.answers < want:
                await asyncio.sleep(0)

    await turn()  # warm: every connection has answered once
    for _ in range(calls // PER_TURN):
        await turn()
    for conn, _ in conns:
        conn.connection_lost(None)
    await gateway.close()


def instructions(calls: int, checkout: Path, out: Path) -> int:
    """Instructions callgrind counted in a child running ``calls`` hits on ``checkout``
    (its profile written to ``out``)."""
    cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", sys.executable]
    cmd += [str(Path(__file__).resolve()), "--child", "--calls", str(calls)]
    # The child imports the checkout's code: it runs there, its tree first on the path.
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    done = subprocess.run(cmd, capture_output=True, timeout=900, cwd=checkout, env=env)
    if done.returncode != 0:
        raise SystemExit(f"{checkout} under callgrind failed:\n{done.stderr.decode()[-3000:]}")
    found = _COLLECTED.search(done.stderr)
    if found is None:
        raise SystemExit(f"callgrind printed no count:\n{done.stderr.decode()[-2000:]}")
    return int(found.group(1))


def per_hit(calls: int, checkouts: list[Path], workdir: Path) -> dict[Path, float]:
    """Instructions per hit on each checkout: its children (``calls`` hits, and none)
    run side by side, one per core; each is counted alone, so they do not disturb it."""
    calls -= calls % PER_TURN
    runs = [(n, checkout) for checkout in checkouts for n in (calls, 0)]
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        counted = pool.map(
            lambda i: instructions(*runs[i], workdir / f"callgrind.{i}"), range(len(runs))
        )
        counts = dict(zip(runs, counted, strict=True))
    return {c: (counts[(calls, c)] - counts[(0, c)]) / calls for c in checkouts}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=4000, help="cached reviews counted (4000)")
    parser.add_argument("--against", type=Path, metavar="DIR", help="another checkout to count")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        asyncio.run(_hits(args.calls))
        return 0
    if args.calls < PER_TURN:
        parser.error(f"--calls: at least {PER_TURN} (one turn of the loop)")
    if shutil.which("valgrind") is None:
        print("valgrind is not installed (Debian package valgrind)", file=sys.stderr)
        return 2
    here = Path(__file__).resolve().parent.parent
    checkouts = [here]
    if args.against is not None:
        if not (args.against / "authn_gateway").is_dir():
            parser.error(f"--against {args.against}: not a checkout of authn-gateway")
        checkouts.append(args.against.resolve())
    print(f"instructions per cache hit through the edge protocol (callgrind; {args.calls} less 0):")
    with tempfile.TemporaryDirectory() as tmp:
        counted = per_hit(args.calls, checkouts, Path(tmp))
    for checkout in checkouts:
        print(f"  {checkout!s:<50} {counted[checkout]:>10,.0f}")
    if args.against is not None:
        print(f"this checkout / {args.against}: {counted[here] / counted[checkouts[1]]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
