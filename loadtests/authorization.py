"""SubjectAccessReview decisions per second from the policy alone, side by side with a
reference in the same rounds, and what one decision costs in process (issue 38).

Over HTTP, wrk (one thread, a Lua script posting a SubjectAccessReview as
kube-apiserver's webhook authorizer sends it) pinned to core 1, each server to core 0,
every server measured once per round in turn (every other round in reverse order), as
:mod:`loadtests.bench` runs its references:

* ``raw ASGI + orjson, one SAR``: :mod:`loadtests.refapps`' ``raw-sar`` under uvicorn,
  which reads the review and answers a fixed ``allowed: true``: no policy at all;
* ``raw ASGI + orjson, distinct SARs``: the same app, fed wrk's other script, which
  makes every body one never sent before (a counter in ``resourceAttributes.name``);
* ``gateway /authorize, cache hit``: one gateway worker answering the one body again
  and again from its decision cache;
* ``gateway /authorize, cache miss``: another worker fed distinct bodies: every review
  parsed and decided by the policy, kept, and (the cache full) the oldest put out.

The policy is a k8s-keystone-auth policy file of ``--rules`` rules, the one that allows
the user last: each decision passes over all the others first. Each gateway's own
/metrics then says how many of its decisions were cache hits, so a hit run that missed
(or a miss run that hit) shows. Ratios are taken within a round, then the median.

In process, µs of CPU per review (best of 5 rounds, timed as :mod:`loadtests.hotpath`
times): the raw reference's work, the parse, the policy's decision, the webhook's whole
answer on a hit and on a miss; the decision cache's memory per entry when full; and a
crafted name against a backtracking regex, with Python's ``re`` and with RE2 (the own
rules' engine).

    python -m loadtests.authorization [--seconds 10] [--rounds 3] [--connections 64]
        [--rules 20] [--calls 20000] [--json out.json]

Figures are printed, never asserted (docs/benchmarks.md has a run).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import httpx
import orjson

from authn_gateway.authorization.sar import parse_access_review
from authn_gateway.authorization.webhook import AuthorizationWebhook
from authn_gateway.config.authorization import AuthorizationSettings, compile_regex
from authn_gateway.observe.metrics import Metrics
from loadtests.bench import (
    Server,
    WrkResult,
    gateway_cmd,
    machine,
    median_ratio,
    median_results,
    pinned,
    table,
    throughput,
)
from loadtests.hotpath import ROUNDS, best_us
from tests.support.authorization_helpers import sar_body
from tests.support.procs import free_port, metric_value

RAW_ONE = "raw ASGI + orjson, one SAR"
RAW_DISTINCT = "raw ASGI + orjson, distinct SARs"
HIT = "gateway /authorize, cache hit"
MISS = "gateway /authorize, cache miss"
#: Each server's reference: the raw app fed the same script.
REFERENCE = {RAW_ONE: RAW_ONE, RAW_DISTINCT: RAW_DISTINCT, HIT: RAW_ONE, MISS: RAW_DISTINCT}

USER = {
    "username": "alice",
    "uid": "8e1c2a3f",
    "groups": ["developers"],
    "extra": {
        "alpha.kubernetes.io/identity/roles": ["member", "reader"],
        "alpha.kubernetes.io/identity/project/id": ["3f2a6c1d9b"],
        "alpha.kubernetes.io/identity/project/name": ["demo"],
        "authn-gateway.io/backend": ["keystone"],
    },
}
#: Where a distinct body's counter goes (a name no rule reads).
NAME = "NAME-PLACEHOLDER"

FIXED_LUA = """
wrk.method = "POST"
wrk.path = "/authorize"
wrk.headers["Content-Type"] = "application/json"
wrk.body = [==[%s]==]
"""
# No body is sent twice: each thread numbers its own (setup gives it an id), and each
# wrk run starts from its own second (a run's warm-up lasts 2 s, and the other servers'
# runs come between one server's rounds).
DISTINCT_LUA = """
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local head, tail = [==[%s]==], [==[%s]==]
local run = tostring(os.time())
local threads = 0
function setup(thread)
  thread:set("tid", threads)
  threads = threads + 1
end
local n = 0
function request()
  n = n + 1
  return wrk.format(nil, "/authorize", nil, head .. run .. "-" .. tid .. "-" .. n .. tail)
end
"""


def policy(rules: int) -> list[dict[str, Any]]:
    """A k8s-keystone-auth policy of ``rules`` rules, both of its formats, the one that
    allows :data:`USER` last (the others name projects the user is not in)."""
    out: list[dict[str, Any]] = []
    for i in range(rules - 1):
        if i % 2:
            out.append({
                "resource": {"verbs": ["get", "list"], "resources": ["pods", "services"],
                             "version": "*", "namespace": f"team-{i}"},
                "match": [{"type": "project", "values": [f"team-{i}"]},
                          {"type": "role", "values": ["member"]}],
            })  # fmt: skip
        else:
            out.append({
                "users": {"roles": ["member"], "projects": [f"team-{i}"]},
                "resource_permissions": {f"team-{i}/*": ["get", "list", "watch"]},
            })  # fmt: skip
    out.append({
        "users": {"roles": ["member"], "projects": ["demo"]},
        "resource_permissions": {"default/['pods', 'services']": ["get", "list", "watch"]},
    })  # fmt: skip
    return out


def review(name: str = "web-0") -> bytes:
    """A review kube-apiserver would send for USER's ``get pods/<name>`` in default."""
    body = sar_body(USER, verb="get", resource="pods", namespace="default")
    body["spec"]["resourceAttributes"]["name"] = name
    return orjson.dumps(body)


def distinct_parts() -> tuple[str, str]:
    """A review's body split where the counter goes."""
    head, tail = review(NAME).decode().split(NAME)
    return head, tail


def check_allowed(port: int) -> None:
    """The warm-up: the server answers the review ``allowed: true``, or nothing is
    measured (a benchmark of refusals would be a benchmark of nothing)."""
    r = httpx.post(f"http://127.0.0.1:{port}/authorize", content=review(),
                   headers={"content-type": "application/json"}, timeout=10)  # fmt: skip
    if r.status_code != 200 or r.json().get("status", {}).get("allowed") is not True:
        raise RuntimeError(f"the warm-up review was not allowed: {r.status_code} {r.text[:300]}")


def gateway_config(policy_file: Path) -> dict[str, Any]:
    return {
        # Defaults everywhere but the inbound limit (wrk is one caller).
        "inbound_limit": {"rate": 1e9, "burst": 1_000_000_000},
        "backends": [
            {"name": "static", "type": "static",
             "tokens": [{"token": "bench-static-token-1", "username": "bench"}]}
        ],
        "authorization": {"keystone_policy_file": str(policy_file)},
    }  # fmt: skip


def servers(workdir: Path, policy_file: Path) -> list[Server]:
    fixed = FIXED_LUA % review().decode()
    distinct = DISTINCT_LUA % distinct_parts()
    out = []
    for name, lua in ((RAW_ONE, fixed), (RAW_DISTINCT, distinct)):
        port = free_port()
        cmd = [sys.executable, "-m", "loadtests.refapps", "raw-sar", "--port", str(port)]
        out.append(Server(name, pinned(0, cmd), port, False, lua=lua, warm_up=check_allowed))
    for i, (name, lua) in enumerate(((HIT, fixed), (MISS, distinct))):
        port = free_port()
        cmd = gateway_cmd(gateway_config(policy_file), port, workdir, f"gw-authorize-{i}")
        out.append(Server(name, cmd, port, True, lua=lua, warm_up=check_allowed))
    return out


def scrape_hits(into: dict[str, dict[str, float]]) -> Callable[[list[Server]], None]:
    """Each gateway's decisions and cache hits, by its own /metrics, before it stops."""

    def scrape(running: list[Server]) -> None:
        for server in running:
            if not server.gateway:
                continue
            text = httpx.get(f"http://127.0.0.1:{server.port}/metrics", timeout=10).text
            into[server.name] = {
                "decisions": metric_value(text, "authn_gateway_authorization_decisions_total"),
                "cache_hits": metric_value(text, "authn_gateway_authorization_cache_hits_total"),
                "allowed": metric_value(
                    text, "authn_gateway_authorization_decisions_total", answer="allowed"
                ),
            }

    return scrape


# --- in process -----------------------------------------------------------------------


def raw_reference(body: bytes) -> bytes:
    """What the raw app does with a body, in process."""
    doc = orjson.loads(body)
    assert isinstance(doc, dict) and doc.get("kind") == "SubjectAccessReview"
    assert isinstance(doc.get("spec"), dict)
    return orjson.dumps(
        {"apiVersion": doc["apiVersion"], "kind": "SubjectAccessReview",
         "status": {"allowed": True}}
    )  # fmt: skip


def in_process(policy_file: Path, calls: int) -> dict[str, float]:
    settings = AuthorizationSettings.model_validate({"keystone_policy_file": str(policy_file)})
    hook = AuthorizationWebhook(settings, Metrics())
    decided = hook.source.policy
    assert decided is not None, "the benchmark's policy did not load"
    body = review()
    parsed = parse_access_review(body)
    assert decided.decide(parsed).kind == "allowed"
    # Every miss gets a body never seen, more than the cache holds: puts evict.
    fresh = iter([review(f"web-{i}") for i in range(calls * ROUNDS)])
    figures = {
        "raw_reference_us": best_us(lambda: raw_reference(body), calls),
        "parse_us": best_us(lambda: parse_access_review(body), calls),
        "decide_us": best_us(lambda: decided.decide(parsed), calls),
        "answer_hit_us": best_us(lambda: hook.answer(body), calls),
        "answer_miss_us": best_us(lambda: hook.answer(next(fresh)), calls),
        "max_entries": float(settings.cache.max_entries),
    }
    figures["cache_bytes_per_entry"] = cache_bytes_per_entry(settings)
    return figures


def cache_bytes_per_entry(settings: AuthorizationSettings) -> float:
    """The decision cache full (max_entries distinct bodies decided): bytes per entry,
    by tracemalloc, the bodies themselves apart (the cache keeps their hashes)."""
    hook = AuthorizationWebhook(settings, Metrics())
    n = settings.cache.max_entries
    bodies = [review(f"mem-{i}") for i in range(n)]
    tracemalloc.start()
    for b in bodies:
        hook.answer(b)
    traced, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert len(hook.cache) == n
    return traced / n


def crafted_name(re_lengths: tuple[int, ...] = (18, 20, 22)) -> dict[str, float]:
    """``(a+)+$`` against ``a...a!`` (the match fails, so a backtracking engine tries
    every way of splitting the a's): Python's re at a few lengths (each a more doubles
    it), RE2 at 5,000 a's."""
    pattern = r"(a+)+$"
    backtracking = re.compile(pattern)
    out: dict[str, float] = {}
    for n in re_lengths:
        text = "a" * n + "!"
        started = time.process_time()
        assert backtracking.fullmatch(text) is None
        out[f"re_{n}_ms"] = (time.process_time() - started) * 1000
    linear = compile_regex(pattern)
    text = "a" * 5000 + "!"
    out["re2_5000_us"] = best_us(lambda: linear.fullmatch(text), 100)
    first, last = re_lengths[0], re_lengths[-1]
    out["re_growth_per_char"] = (out[f"re_{last}_ms"] / out[f"re_{first}_ms"]) ** (
        1 / (last - first)
    )
    return out


# --- the report -----------------------------------------------------------------------


def report_http(rounds: list[list[WrkResult]], hits: dict[str, dict[str, float]]) -> None:
    rows = [["server (1 worker, core 0)", "reviews/s", "p50 ms", "p99 ms", "errors",
             "x raw (same script)", "server cores", "per server core",
             "cache hits / decisions"]]  # fmt: skip
    for r in median_results(rounds):
        seen = hits.get(r.name)
        share = f"{seen['cache_hits']:,.0f} / {seen['decisions']:,.0f}" if seen else "-"
        rows.append(
            [r.name, f"{r.rps:,.0f}", f"{r.p50_ms:.2f}", f"{r.p99_ms:.2f}", str(r.errors),
             f"{median_ratio(rounds, r.name, REFERENCE[r.name]):.2f}",
             f"{r.server_cores:.2f}", f"{r.per_server_core:,.0f}", share]
        )  # fmt: skip
    print(table(rows))
    per_core = {n: median_ratio(rounds, n, REFERENCE[n], "per_server_core") for n in (HIT, MISS)}
    print(
        f"cache miss / cache hit: {median_ratio(rounds, MISS, HIT):.2f} x the throughput; "
        f"distinct bodies cost the raw app {median_ratio(rounds, RAW_DISTINCT, RAW_ONE):.2f} x "
        "(wrk's script and the longer bodies)"
    )
    # A shared machine gives a server less than its core; per core it used, steadier.
    print(
        f"per core the server used, x raw (same script): cache hit {per_core[HIT]:.2f}, "
        f"cache miss {per_core[MISS]:.2f}"
    )


def report_in_process(f: dict[str, float], rules: int, calls: int) -> None:
    print(f"\nin process, us of CPU per review (best of {ROUNDS} x {calls}):")
    for label, key in (
        ("raw reference (orjson in, fixed allowed out)", "raw_reference_us"),
        ("parse (sar.parse_access_review)", "parse_us"),
        (f"policy.decide ({rules} rules, the allowing one last)", "decide_us"),
        ("webhook.answer, cache hit", "answer_hit_us"),
        ("webhook.answer, cache miss (parse, decide, keep)", "answer_miss_us"),
    ):
        print(f"  {label:52} {f[key]:8.2f} us")
    print(
        f"  miss / hit {f['answer_miss_us'] / f['answer_hit_us']:.1f} x; decide per rule "
        f"{f['decide_us'] / rules:.2f} us"
    )
    print(
        f"decision cache full (authorization.cache.max_entries, {f['max_entries']:,.0f}): "
        f"{f['cache_bytes_per_entry']:,.0f} B/entry (tracemalloc)"
    )


def report_regex(f: dict[str, float]) -> None:
    lengths = sorted(int(k.split("_")[1]) for k in f if k.startswith("re_") and "ms" in k)
    times = ", ".join(f"{n} a's {f[f're_{n}_ms']:,.1f} ms" for n in lengths)
    print(
        f"\ncrafted name against (a+)+$ (no match): Python re {times} "
        f"(x{f['re_growth_per_char']:.2f} per a: 5,000 a's never end); "
        f"RE2 5,000 a's {f['re2_5000_us']:,.1f} us"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="wrk run length (10)")
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3, help="rounds of every server (3)")
    parser.add_argument("--rules", type=int, default=20, help="rules in the policy (20)")
    parser.add_argument("--calls", type=int, default=20_000, help="in-process calls a round")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    if args.rules < 1:
        print("--rules: at least 1 (the rule that allows)", file=sys.stderr)
        return 2
    if shutil.which("wrk") is None:
        print("wrk is not installed (Debian package wrk)", file=sys.stderr)
        return 2
    info = machine()
    print(f"machine: {info['nproc']} CPUs, {info['cpu']}, Python {info['python']}, {info['date']}")
    with tempfile.TemporaryDirectory(prefix="authn-authorize-") as tmp:
        workdir = Path(tmp)
        policy_file = workdir / "policy.json"
        policy_file.write_bytes(orjson.dumps(policy(args.rules)))
        hits: dict[str, dict[str, float]] = {}
        rounds, notes = throughput(
            args.seconds, args.connections, workdir, servers(workdir, policy_file),
            args.rounds, before_stop=scrape_hits(hits),
        )  # fmt: skip
        print(
            f"\nSubjectAccessReviews, {args.rules} rules (the allowing one last), "
            f"wrk -t1 -c{args.connections} -d{args.seconds:g}s (core 1), "
            f"medians of {args.rounds} rounds"
        )
        if not rounds[0]:
            print(notes or "nothing was measured", file=sys.stderr)
            return 1
        report_http(rounds, hits)
        if notes:
            print(notes)
        figures = in_process(policy_file, args.calls)
    report_in_process(figures, args.rules, args.calls)
    regex = crafted_name()
    report_regex(regex)
    if args.json:
        args.json.write_text(
            json.dumps(
                {"machine": info, "rules": args.rules,
                 "throughput": [asdict(r) for r in median_results(rounds)],
                 "rounds": [[asdict(r) for r in rr] for rr in rounds],
                 "ratios": {n: median_ratio(rounds, n, REFERENCE[n]) for n in REFERENCE},
                 "per_core_ratios": {
                     n: median_ratio(rounds, n, REFERENCE[n], "per_server_core")
                     for n in REFERENCE
                 },
                 "miss_over_hit": median_ratio(rounds, MISS, HIT), "cache": hits,
                 "in_process": figures, "regex": regex, "notes": notes},
                indent=1,
            )
        )  # fmt: skip
    return 0 if notes is None else 1


if __name__ == "__main__":
    sys.exit(main())
