"""Benchmarks, side by side in one run, same machine, same load generator:

1. cache-hit review throughput and p50/p99 of one gateway worker, against a bare
   starlette webhook and a raw ASGI + orjson one (:mod:`loadtests.refapps`), as ratios;
2. the same with the Redis tier (``redis:`` configured);
3. ``server.workers: 2`` on both cores against one worker;
4. the cost of a cache miss over the IdP's own latency;
5. memory per cached entry at 100,000 entries;

and then each figure against issue 19's targets. With ``--tls``, instead, only the cost
of TLS (issue 16: the edge runs handshakes and records through asyncio's SSLProtocol):
the same gateway with ``server.tls`` (a self-signed certificate, no client CA: wrk
presents no client certificate) against it over plain HTTP, wrk over https.

wrk drives the load (64 connections, one thread, a Lua script posting a TokenReview),
pinned to core 1 while the server is pinned to core 0 (the two-worker gateway and its
wrk run on both cores). Every server is started once; each round measures all of them
in turn, so slow phases of a shared machine fall on every server alike, and the
figures are the medians over the rounds (ratios are taken per round, then the median).
Figures are printed, never asserted: they depend on the machine and on what else runs
on it.

    python -m loadtests.bench [--seconds 10] [--rounds 3] [--connections 64] [--json out.json]
    python -m loadtests.bench --tls [--seconds 10] [--rounds 3] [--connections 64]
    python -m loadtests.bench --against DIR [--seconds 10] [--rounds 5]

With ``--against DIR`` (another checkout, such as ``git worktree add DIR <commit>``),
only cache hits are measured: the references, this checkout's gateway and DIR's, side
by side in every round, with the same interpreter and packages; it prints this
checkout's throughput over DIR's. That is how a change to the hot path is judged
before and after on one machine, whatever else that machine is doing.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from loadtests.cpu import tree_cpu_seconds
from tests.support.pki import issue, make_ca
from tests.support.procs import free_port, review_body, wait_for_port

LUA = """
wrk.method = "POST"
wrk.path = "/authenticate?timeout=30s"
wrk.headers["Content-Type"] = "application/json"
wrk.body = [[%s]]
"""
SECRET = "bench-fleet-only-Qm3Zr7Wk1Vn5Tb9Xc2Yd6Ue0Af4Bg8Ch-LjPs"
HOT_TOKEN = "good-bench-user"


@dataclass
class WrkResult:
    name: str
    rps: float
    p50_ms: float
    p99_ms: float
    errors: int
    # Cores used during the timed run: the server (its workers included) and wrk.
    server_cores: float = float("nan")
    wrk_cores: float = float("nan")

    @property
    def per_server_core(self) -> float:
        """Reviews per second per core the server used: scaling apart from the rig."""
        return self.rps / self.server_cores if self.server_cores > 0 else float("nan")


def _ms(value: str) -> float:
    m = re.fullmatch(r"([\d.]+)(us|ms|s)", value.strip())
    if not m:
        raise ValueError(f"cannot read wrk latency {value!r}")
    scale = {"us": 0.001, "ms": 1.0, "s": 1000.0}[m.group(2)]
    return float(m.group(1)) * scale


def parse_wrk(name: str, text: str) -> WrkResult:
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", text).group(1))  # type: ignore[union-attr]
    p50 = _ms(re.search(r"\s50%\s+(\S+)", text).group(1))  # type: ignore[union-attr]
    p99 = _ms(re.search(r"\s99%\s+(\S+)", text).group(1))  # type: ignore[union-attr]
    errors = 0
    m = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", text)
    if m:
        errors += int(m.group(1))
    m = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", text)
    if m:
        errors += sum(int(x) for x in m.groups())
    return WrkResult(name, rps, p50, p99, errors)


def pinned(core: int | str, cmd: list[str]) -> list[str]:
    """Pin to one core when the machine has more than one."""
    if (os.cpu_count() or 1) > 1 and shutil.which("taskset"):
        return ["taskset", "-c", str(core), *cmd]
    return cmd


def run_wrk(
    name: str,
    port: int,
    seconds: float,
    connections: int,
    workdir: Path,
    core: str = "1",
    threads: int = 1,
    scheme: str = "http",
    server_pid: int | None = None,
    lua: str | None = None,
) -> WrkResult:
    """``lua``: wrk's script (default: one cached TokenReview, :data:`LUA`)."""
    script = workdir / "review.lua"
    script.write_text(lua if lua is not None else LUA % json.dumps(review_body(HOT_TOKEN)))
    base = ["wrk", f"-t{threads}", f"-c{connections}", "-s", str(script), "--latency"]
    url = f"{scheme}://127.0.0.1:{port}"
    # A short warm-up first: connection set-up, the cache entry, the JIT-less warm caches.
    subprocess.run(pinned(core, [*base, "-d2s", url]), capture_output=True, check=True)
    server_before = tree_cpu_seconds(server_pid) if server_pid else 0.0
    children_before = _children_cpu()
    started = time.perf_counter()
    out = subprocess.run(
        pinned(core, [*base, f"-d{int(seconds)}s", url]), capture_output=True, text=True, check=True
    )
    wall = time.perf_counter() - started
    result = parse_wrk(name, out.stdout)
    result.wrk_cores = (_children_cpu() - children_before) / wall
    if server_pid:
        result.server_cores = (tree_cpu_seconds(server_pid) - server_before) / wall
    return result


def _children_cpu() -> float:
    """CPU seconds of this process's finished children (each wrk run, once it ended)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


@contextmanager
def process(
    cmd: list[str], port: int, log: Path, cwd: Path | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """``cmd`` running until the block ends; in ``cwd``'s code when given (its tree first
    on the path: ``-m authn_gateway`` imports that checkout's package)."""
    env = None if cwd is None else {**os.environ, "PYTHONPATH": str(cwd)}
    proc = subprocess.Popen(cmd, stdout=log.open("wb"), stderr=subprocess.STDOUT, cwd=cwd, env=env)
    try:
        wait_for_port(port, proc=proc, timeout=20)
        yield proc
    except Exception:
        raise RuntimeError(f"{cmd[-3:]} did not start:\n{log.read_text()[-2000:]}") from None
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def gateway_cmd(
    config: dict[str, Any], port: int, workdir: Path, name: str, core: str = "0"
) -> list[str]:
    config = {**config, "server": {"host": "127.0.0.1", "port": port, **config.get("server", {})}}
    path = workdir / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    return pinned(core, [sys.executable, "-m", "authn_gateway", "serve", "--config", str(path)])


def base_config(idp_url: str, **backend: Any) -> dict[str, Any]:
    # Defaults everywhere (review log and metrics on) except two limits: the outbound
    # bucket, which the cache-miss benchmark would otherwise hit, and the per-caller
    # inbound limit (2000/s), which would answer most of wrk's reviews "unavailable"
    # since wrk is one caller. Both limiters stay in the path, only never refuse.
    return {
        "inbound_limit": {"rate": 1e9, "burst": 1_000_000_000},
        "backends": [
            {
                "name": "idp",
                "type": "userinfo",
                "url": idp_url,
                "bucket": {"rate": 100000.0, "burst": 100000},
                **backend,
            }
        ],
    }


def warm(port: int, scheme: str = "http") -> None:
    url = f"{scheme}://127.0.0.1:{port}/authenticate?timeout=30s"
    # The benchmark's own self-signed certificate: nothing to verify it against.
    r = httpx.post(url, json=review_body(HOT_TOKEN), timeout=10, verify=False)
    if '"authenticated":true' not in r.text.replace(" ", ""):
        raise RuntimeError(f"warm-up review was not authenticated: {r.status_code} {r.text[:200]}")


@dataclass
class Server:
    name: str
    cmd: list[str]
    port: int
    gateway: bool
    # Where its wrk runs, and with how many threads.
    wrk_core: str = "1"
    wrk_threads: int = 1
    scheme: str = "http"
    #: Another checkout whose code this server runs (``--against``); None: this one.
    cwd: Path | None = None
    #: wrk's script for it (None: :data:`LUA`), and its own warm-up check (None: a
    #: gateway's is :func:`warm`, a reference has none), given the port.
    lua: str | None = None
    warm_up: Callable[[int], None] | None = None


LOCAL = "gateway, local cache"
NOLOG = "gateway, review log off"
REDIS = "gateway, Redis tier"
TWO = "gateway, 2 workers (cores 0-1)"
STARLETTE = "bare starlette"
RAW = "raw ASGI + orjson"
PLAIN = "gateway, plain HTTP"
TLS = "gateway, TLS (asyncio SSL)"
AGAINST = "gateway, local cache, --against"


def servers(workdir: Path, idp_url: str, redis_url: str | None) -> list[Server]:
    out = []
    for app, name in (("starlette", STARLETTE), ("raw", RAW)):
        port = free_port()
        cmd = pinned(0, [sys.executable, "-m", "loadtests.refapps", app, "--port", str(port)])
        out.append(Server(name, cmd, port, gateway=False))
    gateways: list[tuple[str, dict[str, Any], str]] = [
        (LOCAL, base_config(idp_url), "0"),
        # Where the budget goes: the same gateway without its per-review log line.
        (NOLOG, {**base_config(idp_url), "logging": {"reviews": False}}, "0"),
    ]
    if redis_url is not None:
        config = {**base_config(idp_url), "redis": {"url": redis_url}, "secret": SECRET}
        gateways.append((REDIS, config, "0"))
    # Workers need an ops listener (each has its own metrics, on ops.port + i).
    two = {**base_config(idp_url), "server": {"workers": 2, "ops": {"port": 0}}}
    gateways.append((TWO, two, "0,1"))
    for i, (name, config, core) in enumerate(gateways):
        port = free_port()
        cmd = gateway_cmd(config, port, workdir, f"gw-{i}", core=core)
        if name == TWO:
            out.append(Server(name, cmd, port, True, wrk_core="0,1", wrk_threads=2))
        else:
            out.append(Server(name, cmd, port, True))
    return out


def against_servers(workdir: Path, idp_url: str, other: Path) -> list[Server]:
    """The references, this checkout's gateway, and ``other``'s on the same config."""
    out = [s for s in servers(workdir, idp_url, None) if s.name in (STARLETTE, RAW, LOCAL)]
    port = free_port()
    cmd = gateway_cmd(base_config(idp_url), port, workdir, "gw-against")
    out.append(Server(AGAINST, cmd, port, True, cwd=other.resolve()))
    return out


def tls_servers(workdir: Path, idp_url: str) -> list[Server]:
    """The same gateway twice: over plain HTTP, and with ``server.tls``."""
    # A server certificate for 127.0.0.1 (wrk checks no chain).
    cert_file, key_file = issue(make_ca("bench CA"), "127.0.0.1", server=True).write(workdir, "tls")
    tls = {"tls": {"cert_file": str(cert_file), "key_file": str(key_file)}}
    out = []
    for i, (name, server, scheme) in enumerate(((PLAIN, {}, "http"), (TLS, tls, "https"))):
        port = free_port()
        config = {**base_config(idp_url), "server": server}
        cmd = gateway_cmd(config, port, workdir, f"gw-tls-{i}")
        out.append(Server(name, cmd, port, True, scheme=scheme))
    return out


def throughput(
    seconds: float,
    connections: int,
    workdir: Path,
    chosen: list[Server],
    rounds: int,
    before_stop: Callable[[list[Server]], None] | None = None,
) -> tuple[list[list[WrkResult]], str | None]:
    """``rounds`` lists of results, every server measured once per round;
    ``before_stop`` is given the servers measured while they still run."""
    results: list[list[WrkResult]] = [[] for _ in range(rounds)]
    notes = []
    with ExitStack() as stack:
        running = []
        pids: dict[str, int] = {}
        for server in chosen:
            slug = re.sub(r"\W+", "-", server.name)
            try:
                proc = stack.enter_context(
                    process(server.cmd, server.port, workdir / f"{slug}.log", server.cwd)
                )
                if server.warm_up is not None:
                    server.warm_up(server.port)
                elif server.gateway:
                    warm(server.port, server.scheme)
            except RuntimeError as exc:
                notes.append(f"{server.name} not measured: {str(exc).splitlines()[-1][:300]}")
                continue
            running.append(server)
            pids[server.name] = proc.pid
        for r in range(rounds):
            # Every other round in reverse order: a drift in the machine's load then
            # favours no server.
            for server in running if r % 2 == 0 else running[::-1]:
                results[r].append(
                    run_wrk(
                        server.name,
                        server.port,
                        seconds,
                        connections,
                        workdir,
                        core=server.wrk_core,
                        threads=server.wrk_threads,
                        scheme=server.scheme,
                        server_pid=pids[server.name],
                        lua=server.lua,
                    )
                )
        if before_stop is not None:
            before_stop(running)
    for result in results:
        result.sort(key=lambda x: [s.name for s in running].index(x.name))
    return results, "; ".join(notes) or None


def median_results(rounds: list[list[WrkResult]]) -> list[WrkResult]:
    """Per server, the median of each figure over the rounds."""
    out = []
    for i, first in enumerate(rounds[0]):
        runs = [r[i] for r in rounds]
        out.append(
            WrkResult(
                first.name,
                statistics.median(x.rps for x in runs),
                statistics.median(x.p50_ms for x in runs),
                statistics.median(x.p99_ms for x in runs),
                sum(x.errors for x in runs),
                statistics.median(x.server_cores for x in runs),
                statistics.median(x.wrk_cores for x in runs),
            )
        )
    return out


def best_ratio(rounds: list[list[WrkResult]], num: str, den: str, field: str = "rps") -> float:
    """``num``'s best round over ``den``'s best (the highest throughput, the lowest p99).

    On a shared machine other work only ever slows a server down, so each server's best
    round is the nearest to what it does alone."""
    pick = max if field == "rps" else min
    values: dict[str, list[float]] = {}
    for results in rounds:
        for r in results:
            values.setdefault(r.name, []).append(getattr(r, field))
    if num not in values or den not in values:
        return float("nan")
    return pick(values[num]) / pick(values[den])


def median_ratio(rounds: list[list[WrkResult]], num: str, den: str, field: str = "rps") -> float:
    """The median over rounds of ``num``'s figure over ``den``'s in the same round."""
    ratios = []
    for results in rounds:
        by = {r.name: r for r in results}
        if num in by and den in by:
            ratios.append(getattr(by[num], field) / getattr(by[den], field))
    return statistics.median(ratios) if ratios else float("nan")


def miss_cost(workdir: Path, idp_url: str, idp_port: int, n: int) -> dict[str, float]:
    """Median latency of a review of a never-seen token, and of the same call made directly."""
    port = free_port()
    cmd = gateway_cmd(base_config(idp_url), port, workdir, "gw-miss")
    direct, through = [], []
    with process(cmd, port, workdir / "gw-miss.log"), httpx.Client(timeout=10) as client:
        warm(port)
        url = f"http://127.0.0.1:{port}/authenticate?timeout=30s"
        for i in range(n):
            t0 = time.perf_counter()
            client.get(idp_url, headers={"Authorization": f"Bearer good-direct{i}"})
            t1 = time.perf_counter()
            client.post(url, json=review_body(f"good-miss{i}"))
            t2 = time.perf_counter()
            direct.append((t1 - t0) * 1000)
            through.append((t2 - t1) * 1000)
    return {
        "idp_direct_p50_ms": statistics.median(direct),
        "review_miss_p50_ms": statistics.median(through),
        "miss_overhead_p50_ms": statistics.median(through) - statistics.median(direct),
        "samples": n,
    }


MEMORY_PROBE = r"""
import gc, json, os, resource, sys, time, tracemalloc
from authn_gateway.layers.cache import MemoryStore, ReviewCache
from authn_gateway.keyed_hashes import TokenHasher
from backends.settings import CacheSettings
from backends.base import Authenticated, UserInfo

n = int(sys.argv[1])
def rss_kib():
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024
hasher = TokenHasher(b"bench-secret")
cache = ReviewCache(CacheSettings(), MemoryStore(n))
import asyncio
gc.collect()
rss0 = rss_kib()
tracemalloc.start()
async def fill():
    now = time.time()
    for i in range(n):
        # What a userinfo/Keystone identity looks like: name, uid, a few groups.
        groups = (f"team-{i % 50}", "developers", "viewers")
        user = UserInfo(f"user-{i:06d}@example.com", f"{i:032x}", groups)
        await cache.put(hasher.cache_key("idp", f"token-{i}", ()), Authenticated(user), now)
asyncio.run(fill())
gc.collect()
traced, _ = tracemalloc.get_traced_memory()
tracemalloc.stop()
print(json.dumps({"entries": len(cache.store), "tracemalloc_bytes": traced,
                  "rss_delta_kib": rss_kib() - rss0}))
"""


def memory_per_entry(n: int) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-c", MEMORY_PROBE, str(n)], capture_output=True, text=True, check=True
    )
    doc = json.loads(out.stdout)
    return {
        "entries": doc["entries"],
        "bytes_per_entry_tracemalloc": doc["tracemalloc_bytes"] / doc["entries"],
        "bytes_per_entry_rss": doc["rss_delta_kib"] * 1024 / doc["entries"],
    }


def machine() -> dict[str, str]:
    model = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "nproc": str(os.cpu_count()),
        "cpu": model,
        "python": sys.version.split()[0],
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
    }


def table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [
        "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |" for r in rows
    ]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def tls_cost(args: argparse.Namespace, workdir: Path, idp_url: str) -> int:
    """Print the gateway's cache-hit figures over https against plain HTTP, side by side."""
    rounds, notes = throughput(
        args.seconds, args.connections, workdir, tls_servers(workdir, idp_url), args.rounds
    )
    if notes or len(rounds[0]) < 2:
        print(notes or "a gateway was not measured", file=sys.stderr)
        return 1
    rows = [["server (1 worker, core 0)", "reviews/s", "p50 ms", "p99 ms", "errors"]]
    results = median_results(rounds)
    for r in results:
        rows.append([r.name, f"{r.rps:,.0f}", f"{r.p50_ms:.2f}", f"{r.p99_ms:.2f}", str(r.errors)])
    print(
        f"\ncache hits, wrk -t1 -c{args.connections} -d{args.seconds:g}s (core 1), "
        f"keep-alive (one handshake per connection), medians of {args.rounds} rounds"
    )
    print(table(rows))
    figures = {
        "tls_over_plain_rps": median_ratio(rounds, TLS, PLAIN),
        "tls_over_plain_p99": median_ratio(rounds, TLS, PLAIN, "p99_ms"),
        "best_tls_over_best_plain_rps": best_ratio(rounds, TLS, PLAIN),
        "best_tls_over_best_plain_p99": best_ratio(rounds, TLS, PLAIN, "p99_ms"),
    }
    plain_us, tls_us = (1e6 / r.rps for r in results)
    # The server's core is saturated, so the time per review is what it costs there.
    figures["tls_us_per_review"] = tls_us - plain_us
    print(
        f"\nTLS / plain: throughput {figures['tls_over_plain_rps']:.2f} x, "
        f"p99 {figures['tls_over_plain_p99']:.2f} x (median of the per-round ratios); "
        f"best round over best {figures['best_tls_over_best_plain_rps']:.2f} x and "
        f"{figures['best_tls_over_best_plain_p99']:.2f} x; "
        f"{figures['tls_us_per_review']:.1f} us more per review on the gateway's core"
    )
    if args.json:
        args.json.write_text(
            json.dumps(
                {"machine": machine(), "throughput": [asdict(r) for r in results],
                 "rounds": [[asdict(r) for r in rr] for rr in rounds], "tls": figures},
                indent=1,
            )
        )  # fmt: skip
    return 0


def against_cost(args: argparse.Namespace, workdir: Path, idp_url: str) -> int:
    """Cache hits of this checkout's gateway and of ``--against``'s, side by side."""
    chosen = against_servers(workdir, idp_url, args.against)
    rounds, notes = throughput(args.seconds, args.connections, workdir, chosen, args.rounds)
    rows = [["server (1 worker, core 0)", "reviews/s", "p50 ms", "p99 ms", "errors",
             "x raw", "p99 / raw p99", "server cores"]]  # fmt: skip
    for r in median_results(rounds):
        name = f"{r.name} {args.against}" if r.name == AGAINST else r.name
        rows.append(
            [name, f"{r.rps:,.0f}", f"{r.p50_ms:.2f}", f"{r.p99_ms:.2f}", str(r.errors),
             f"{median_ratio(rounds, r.name, RAW):.2f}",
             f"{median_ratio(rounds, r.name, RAW, 'p99_ms'):.2f}", f"{r.server_cores:.2f}"]
        )  # fmt: skip
    print(
        f"\ncache hits, wrk -t1 -c{args.connections} -d{args.seconds:g}s (core 1), "
        f"medians of {args.rounds} rounds"
    )
    print(table(rows))
    if notes:
        print(notes)
    print(
        f"this checkout / {args.against}: {median_ratio(rounds, LOCAL, AGAINST):.2f} "
        f"(median of the per-round ratios; best round over best "
        f"{best_ratio(rounds, LOCAL, AGAINST):.2f})"
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Cache-hit, cache-miss and memory benchmarks.")
    parser.add_argument("--seconds", type=float, default=10.0, help="wrk run length (10)")
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3, help="rounds of every server (3)")
    parser.add_argument("--misses", type=int, default=500, help="cold reviews timed (500)")
    parser.add_argument("--entries", type=int, default=100_000)
    parser.add_argument("--no-redis", action="store_true", help="skip the Redis tier")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument(
        "--tls", action="store_true", help="only the cost of TLS: the gateway over https vs http"
    )
    parser.add_argument(
        "--against",
        type=Path,
        metavar="DIR",
        help="only cache hits, this checkout's gateway against DIR's (another checkout)",
    )
    args = parser.parse_args(argv)
    if args.against is not None and not (args.against / "authn_gateway").is_dir():
        print(f"--against {args.against}: not a checkout of authn-gateway", file=sys.stderr)
        return 2
    without_redis = args.no_redis or args.tls or args.against is not None
    for tool in ("wrk", *(() if without_redis else ("redis-server",))):
        if shutil.which(tool) is None:
            print(f"{tool} is not installed (Debian package {tool.split('-')[0]})", file=sys.stderr)
            return 2
    info = machine()
    print(f"machine: {info['nproc']} CPUs, {info['cpu']}, Python {info['python']}, {info['date']}")
    with tempfile.TemporaryDirectory(prefix="authn-bench-") as tmp, ExitStack() as stack:
        workdir = Path(tmp)
        idp_port, control = free_port(), free_port()
        idp_cmd = [sys.executable, "-m", "tests.support.fakes.idp", "--port", str(idp_port)]
        idp_cmd += ["--control-port", str(control)]
        stack.enter_context(process(pinned(1, idp_cmd), idp_port, workdir / "idp.log"))
        idp_url = f"http://127.0.0.1:{idp_port}/userinfo"
        redis_url = None
        if not without_redis:
            rport = free_port()
            redis_cmd = ["redis-server", "--port", str(rport), "--bind", "127.0.0.1"]
            redis_cmd += ["--save", "", "--appendonly", "no"]
            stack.enter_context(process(pinned(1, redis_cmd), rport, workdir / "redis.log"))
            redis_url = f"redis://127.0.0.1:{rport}/0"

        if args.tls:
            return tls_cost(args, workdir, idp_url)
        if args.against is not None:
            return against_cost(args, workdir, idp_url)
        chosen = servers(workdir, idp_url, redis_url)
        rounds, notes = throughput(args.seconds, args.connections, workdir, chosen, args.rounds)
        results = median_results(rounds)
        rows = [["server (1 worker, core 0)", "reviews/s", "p50 ms", "p99 ms", "errors",
                 "x starlette", "x raw", "p99 / raw p99", "server cores", "wrk cores",
                 "reviews/s per server core"]]  # fmt: skip
        for r in results:
            ratios = [
                median_ratio(rounds, r.name, STARLETTE),
                median_ratio(rounds, r.name, RAW),
                median_ratio(rounds, r.name, RAW, "p99_ms"),
            ]
            rows.append(
                [r.name, f"{r.rps:,.0f}", f"{r.p50_ms:.2f}", f"{r.p99_ms:.2f}", str(r.errors)]
                + [f"{x:.2f}" for x in ratios]
                + [f"{r.server_cores:.2f}", f"{r.wrk_cores:.2f}", f"{r.per_server_core:,.0f}"]
            )
        print(
            f"\ncache hits, wrk -t1 -c{args.connections} -d{args.seconds:g}s (core 1), "
            f"medians of {args.rounds} rounds"
        )
        print(table(rows))
        if notes:
            print(notes)

        miss = miss_cost(workdir, idp_url, idp_port, args.misses)
        print(
            f"\ncache miss (sequential, {miss['samples']} never-seen tokens): review p50 "
            f"{miss['review_miss_p50_ms']:.2f} ms, the IdP call alone p50 "
            f"{miss['idp_direct_p50_ms']:.2f} ms, so a miss costs "
            f"{miss['miss_overhead_p50_ms']:.2f} ms over the IdP's own latency"
        )
    specs: list[tuple[str, tuple[str, str, str], float, bool]] = [
        ("cached review >= 0.7 x raw ASGI", (LOCAL, RAW, "rps"), 0.7, True),
        ("p99 <= 1.5 x raw's", (LOCAL, RAW, "p99_ms"), 1.5, False),
        ("Redis tier within 10 % of local", (REDIS, LOCAL, "rps"), 0.9, True),
        ("2 workers >= 1.8 x one worker", (TWO, LOCAL, "rps"), 1.8, True),
    ]
    targets = [
        (label, median_ratio(rounds, *figure), best_ratio(rounds, *figure), bound, at_least)
        for label, figure, bound, at_least in specs
    ]
    overhead = miss["miss_overhead_p50_ms"]
    targets.insert(2, ("miss adds <= 1 ms over the IdP", overhead, overhead, 1.0, False))
    print("\nagainst issue 19's targets (median of the per-round ratios; best round over best):")
    trows = [["target", "median", "best", "bound", "met (median / best)"]]
    for label, value, best, bound, at_least in targets:
        met = [v >= bound if at_least else v <= bound for v in (value, best)]
        sign = ">=" if at_least else "<="
        trows.append([label, f"{value:.2f}", f"{best:.2f}", f"{sign} {bound:g}",
                      " / ".join("yes" if m else "NO" for m in met)])  # fmt: skip
    print(table(trows))
    two, one = (next((r for r in results if r.name == n), None) for n in (TWO, LOCAL))
    if two is not None and one is not None:
        # On a machine whose cores wrk shares, the throughput ratio measures the rig too.
        print(
            f"2 workers used {two.server_cores:.2f} cores (wrk {two.wrk_cores:.2f}) against "
            f"one worker's {one.server_cores:.2f}: per core the servers used, 2 workers "
            f"answer {two.per_server_core / one.per_server_core:.2f} x one worker's"
        )
        # What perfect scaling could show here: the cores wrk leaves to the servers.
        cores = os.cpu_count() or 2
        print(
            f"at perfect scaling on the {cores - two.wrk_cores:.2f} cores wrk leaves them, "
            f"2 workers could answer {(cores - two.wrk_cores) / one.server_cores:.2f} x one "
            "worker's on this machine"
        )
    mem = memory_per_entry(args.entries)
    print(
        f"\nmemory at {mem['entries']:,} cached identities: "
        f"{mem['bytes_per_entry_tracemalloc']:.0f} B/entry (tracemalloc), "
        f"{mem['bytes_per_entry_rss']:.0f} B/entry (RSS delta)"
    )
    if args.json:
        args.json.write_text(
            json.dumps(
                {"machine": info, "throughput": [asdict(r) for r in results],
                 "rounds": [[asdict(r) for r in rr] for rr in rounds],
                 "targets": {label: [median, best] for label, median, best, _, _ in targets},
                 "notes": notes, "miss": miss, "memory": mem},
                indent=1,
            )
        )  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
