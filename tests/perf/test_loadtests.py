"""The load harness: kube-apiserver's retry policy, the fake Keystone, and a bounded run.

Figures are printed by the harness, never asserted here (2 shared cores). Each test runs
a documented command and checks what it printed; those whose checks hold however busy
the machine is run two at a time (scripts/test.sh); the ones marked ``exclusive`` (wrk
must get no errors, one cost must exceed another) run alone.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def test_runner_prints_a_table_and_writes_a_plot(tmp_path: Path) -> None:
    if shutil.which("locust", path=str(Path(sys.executable).parent)) is None:
        pytest.fail("locust is not installed; pip install -e '.[loadtest]'")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "loadtests.run",
            "steady",
            "--duration",
            "8",
            "--users",
            "5",
            "--rate",
            "5",
            "--out",
            str(tmp_path),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "| reviews answered" in proc.stdout
    assert "| IdP calls " in proc.stdout
    assert "protection factor" in proc.stdout
    png = tmp_path / "steady.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (tmp_path / "steady.json").exists()


def test_the_parked_connection_measurement_runs_as_documented() -> None:
    # docs/operations.md and docs/decisions.md quote `python -m loadtests.parked`.
    result = subprocess.run(
        [sys.executable, "-m", "loadtests.parked", "--connections", "50"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert result.returncode == 0, result.stderr
    assert "50 silent connections: +" in result.stdout
    assert "50 unfinished 16 KiB heads: +" in result.stdout


@pytest.mark.exclusive
def test_the_tls_benchmark_runs_as_documented(tmp_path: Path) -> None:
    # docs/benchmarks.md and docs/decisions.md quote `python -m loadtests.bench --tls`.
    if shutil.which("wrk") is None:
        pytest.fail("wrk is not installed (Debian package wrk)")
    out = tmp_path / "tls.json"
    cmd = [sys.executable, "-m", "loadtests.bench", "--tls", "--seconds", "1", "--rounds", "1"]
    result = subprocess.run(
        [*cmd, "--connections", "4", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "| gateway, TLS (asyncio SSL) |" in result.stdout
    assert "TLS / plain: throughput " in result.stdout
    doc = json.loads(out.read_text())
    # Every review over https was answered 2xx: wrk counts anything else as an error.
    assert [(r["name"], r["errors"]) for r in doc["throughput"]] == [
        ("gateway, plain HTTP", 0),
        ("gateway, TLS (asyncio SSL)", 0),
    ]
    assert all(r["rps"] > 0 for r in doc["throughput"])
    assert doc["tls"]["tls_over_plain_rps"] > 0


@pytest.mark.exclusive
def test_the_benchmark_runs_as_documented(tmp_path: Path) -> None:
    # docs/benchmarks.md quotes `python -m loadtests.bench --seconds 6 --rounds 5 ...`.
    if shutil.which("wrk") is None:
        pytest.fail("wrk is not installed (Debian package wrk)")
    out = tmp_path / "bench.json"
    cmd = [sys.executable, "-m", "loadtests.bench", "--seconds", "1", "--rounds", "1"]
    cmd += ["--misses", "20", "--entries", "2000", "--connections", "4", "--json", str(out)]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "against issue 19's targets" in result.stdout
    assert "2 workers used " in result.stdout
    assert "at perfect scaling on the " in result.stdout
    doc = json.loads(out.read_text())
    names = [r["name"] for r in doc["throughput"]]
    assert names == [
        "bare starlette",
        "raw ASGI + orjson",
        "gateway, local cache",
        "gateway, review log off",
        "gateway, Redis tier",
        "gateway, 2 workers (cores 0-1)",
    ]
    for r in doc["throughput"]:
        assert r["errors"] == 0 and r["rps"] > 0, r
        # CPU is read from /proc for the server's whole process tree and for wrk.
        assert 0 < r["server_cores"] <= (os.cpu_count() or 1) + 0.5, r
        assert 0 < r["wrk_cores"] <= (os.cpu_count() or 1) + 0.5, r
    assert doc["miss"]["samples"] == 20 and doc["miss"]["review_miss_p50_ms"] > 0


def test_the_fleet_fault_measurement_runs_as_documented() -> None:
    # docs/benchmarks.md and docs/operations.md quote `python -m loadtests.fleet_faults`
    # with --backend and --expected-replicas; a short run, one fault, two replicas.
    backend = json.dumps({"concurrency": {"max_limit": 20}})
    cmd = [sys.executable, "-m", "loadtests.fleet_faults", "--replicas", "2", "--faults", "500"]
    result = subprocess.run(
        [*cmd, "--outage", "1", "--rate", "30", "--expected-replicas", "3", "--backend", backend],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert [(r["replicas"], r["fault"]) for r in rows] == [(2, "500")]
    row = rows[0]
    assert row["bound"] == "5 + 20 + 1 = 26"  # fail_max + max_limit + probes in 1 s
    assert 1 <= row["idp_calls_in_outage"] <= 26  # the IdP's own count, within the bound
    assert row["errors_in_outage"].get("idp: circuit breaker open", 0) > 0


def run_documented(*args: str) -> str:
    """Run ``python -m loadtests.<args>`` from the checkout; its output, or the test fails."""
    cmd = [sys.executable, "-m", *args]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def test_the_authorization_benchmark_runs_as_documented(tmp_path: Path) -> None:
    # docs/benchmarks.md, docs/authorization.md and docs/decisions.md quote
    # `python -m loadtests.authorization`. Not exclusive: nothing here is a timing.
    if shutil.which("wrk") is None:
        pytest.fail("wrk is not installed (Debian package wrk)")
    out = tmp_path / "authorize.json"
    printed = run_documented(
        "loadtests.authorization", "--seconds", "1", "--rounds", "1", "--connections", "4",
        "--rules", "5", "--calls", "200", "--json", str(out),
    )  # fmt: skip
    for line in (
        "| gateway /authorize, cache hit ",
        "| gateway /authorize, cache miss ",
        "cache miss / cache hit: ",
        "per core the server used, x raw (same script): cache hit ",
        "policy.decide (5 rules, the allowing one last)",
        "decision cache full (authorization.cache.max_entries, 10,000): ",
        "crafted name against (a+)+$ (no match): Python re 18 a's ",
    ):
        assert line in printed, (line, printed)
    doc = json.loads(out.read_text())
    assert [r["name"] for r in doc["throughput"]] == [
        "raw ASGI + orjson, one SAR",
        "raw ASGI + orjson, distinct SARs",
        "gateway /authorize, cache hit",
        "gateway /authorize, cache miss",
    ]
    # Every review was answered 200 (wrk counts anything else, and socket errors).
    assert all(r["errors"] == 0 and r["rps"] > 0 for r in doc["throughput"]), doc["throughput"]
    # By the gateways' own counts: every decision allowed; the hit run missed once (the
    # warm-up's first review), the miss run never hit (no body was sent twice).
    hit, miss = (
        doc["cache"]["gateway /authorize, cache hit"],
        doc["cache"]["gateway /authorize, cache miss"],
    )
    assert hit["allowed"] == hit["decisions"] and miss["allowed"] == miss["decisions"], doc
    assert hit["cache_hits"] == hit["decisions"] - 1 > 0, hit
    assert miss["cache_hits"] == 0 and miss["decisions"] > 1, miss
    assert all(v > 0 for v in doc["in_process"].values()), doc["in_process"]


def test_the_miss_path_measurement_runs_as_documented() -> None:
    # docs/benchmarks.md and docs/decisions.md quote `python -m loadtests.misspath`.
    out = run_documented("loadtests.misspath", "--calls", "30")
    rows = dict(
        (line[:58].strip(), float(line[58:].split("us")[0]))
        for line in out.splitlines()
        if line.startswith("  ") and " us " in line
    )
    for label in (
        "IdP call, bare asyncio HTTP/1.1 (the floor)",
        "IdP call, plain httpx.AsyncClient",
        "IdP call, aiohttp alone (the backends' wire)",
        "IdP call, the backend (its client and wrappers)",
        "backend stack (cache, coalesce, breaker, bucket, ...)",
        "pipeline.review (routing, admission)",
        "whole request through the edge protocol",
    ):
        assert rows.get(label, 0) > 0, (label, out)


def test_the_bench_against_another_checkout_runs_as_documented(tmp_path: Path) -> None:
    # docs/benchmarks.md quotes `python -m loadtests.bench --against DIR`; here DIR is
    # this same checkout, so both gateways run the same code.
    if shutil.which("wrk") is None:
        pytest.fail("wrk is not installed (Debian package wrk)")
    cmd = [sys.executable, "-m", "loadtests.bench", "--against", str(REPO)]
    cmd += ["--seconds", "1", "--rounds", "1", "--connections", "4"]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=180, cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"gateway, local cache, --against {REPO}" in result.stdout, result.stdout
    assert f"this checkout / {REPO}: " in result.stdout, result.stdout
    assert "not measured" not in result.stdout, result.stdout
    # Not a checkout: a clear error, nothing started.
    bad = subprocess.run(
        [sys.executable, "-m", "loadtests.bench", "--against", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert bad.returncode == 2, bad
    assert f"--against {tmp_path}: not a checkout of authn-gateway" in bad.stderr


def test_the_hit_instruction_count_runs_as_documented() -> None:
    # docs/benchmarks.md quotes `python -m loadtests.hitcount`: two programs under
    # valgrind side by side (~50 s each, most of it start-up), one turn of 16 hits.
    out = run_documented("loadtests.hitcount", "--calls", "16")
    row = next(line for line in out.splitlines() if line.startswith(f"  {REPO}"))
    assert int(row.split()[-1].replace(",", "")) > 10_000, out  # instructions per hit


def test_the_miss_instruction_count_runs_as_documented() -> None:
    # docs/benchmarks.md and docs/decisions.md quote `python -m loadtests.misscount`;
    # the client row alone: two programs under valgrind side by side (~30 s each).
    out = run_documented("loadtests.misscount", "--rows", "client", "--calls", "5")
    row = next(line for line in out.splitlines() if "the backend's client" in line)
    assert float(row.split()[-2]) > 0.1, out  # millions of instructions per call


def test_the_redis_cost_measurement_runs_as_documented() -> None:
    # docs/decisions.md ("Fleet mode") quotes `python -m loadtests.redis_costs`.
    out = run_documented("loadtests.redis_costs")
    rows = [line for line in out.splitlines() if " us CPU " in line]
    for label in ("cache GET", "GCRA bucket script", "breaker admission", "breaker settle"):
        assert any(row.startswith(label) for row in rows), (label, out)


def test_the_hot_path_measurement_runs_as_documented() -> None:
    # docs/benchmarks.md and docs/decisions.md quote `python -m loadtests.hotpath`.
    out = run_documented("loadtests.hotpath", "--calls", "200")
    assert "gateway through the edge protocol" in out
    assert float(out.split("gateway / raw through the protocol:")[1]) > 0


@pytest.mark.exclusive
def test_the_jwt_cost_measurement_runs_as_documented() -> None:
    # docs/backends/jwt.md and docs/decisions.md quote `python -m loadtests.jwt_cost`.
    out = run_documented("loadtests.jwt_cost", "--calls", "20")
    rows = [line.split() for line in out.splitlines() if line.startswith(("RS256", "ES256"))]
    assert [row[:2] for row in rows] == [
        ["RS256", "claim"], ["RS256", "CEL"], ["ES256", "claim"], ["ES256", "CEL"]
    ]  # fmt: skip
    # A cached review costs less than verifying the signature again.
    assert all(float(row[2]) > float(row[3]) for row in rows), out


def test_the_cel_comparison_runs_as_documented() -> None:
    # docs/decisions.md quotes `python -m loadtests.cel_compare`.
    out = run_documented("loadtests.cel_compare")
    assert "evaluate ratio cel-python / bindings:" in out


def test_the_jwt_scenarios_run_as_documented() -> None:
    # docs/backends/jwt.md quotes `python -m loadtests.jwt_scenarios all --duration 20`.
    out = run_documented("loadtests.jwt_scenarios", "all", "--duration", "3")
    assert "issuer fetches per minute" in out


def test_the_config_parse_measurement_runs_as_documented() -> None:
    # docs/decisions.md and loadtests/README.md quote `python -m loadtests.config_parse`.
    out = run_documented("loadtests.config_parse", "--kib", "64", "--rounds", "1")
    assert "| python | " in out and "validation of the data" in out, out
    assert "| libyaml | " in out and "python / libyaml: " in out, out
