#!/usr/bin/env bash
# Sets up everything the test suite needs on a fresh Debian machine, then runs the
# linters, the type checker and the test suite, tier by tier:
#
#   unit     tests/unit: in process (slapd for a few); under a minute; fails fast (-x)
#   process  tests/process: real Redis, slapd, Keystone, gateway processes, on loopback
#   deploy   tests/deploy: what deploy/ and the docs ship (kustomize, promtool, policies)
#   perf     tests/perf: benchmarks and load tests, after the others; the documented
#            commands two at a time (perf-cmds), what needs the machine alone (exclusive)
#
#   ./scripts/test.sh                  # everything
#   ./scripts/test.sh tests/unit -k x  # extra arguments go to one pytest run, as given
#
# The unit tier runs first and stops the run when it fails. After it, every phase runs
# even if an earlier one failed, and the script ends with one line per phase and a
# non-zero exit if any failed. The unit and deploy tiers run on TEST_WORKERS
# pytest-xdist workers (2: this machine's cores), a test file to a worker; the process
# tier on PROCESS_WORKERS (3: its tests mostly wait on their servers; docs/decisions.md,
# "Three workers for the process tier").
set -euo pipefail
cd "$(dirname "$0")/.."

# Real servers the tests start on loopback: Redis, OpenLDAP, Keystone (under uWSGI),
# Prometheus (promtool too), wrk for benchmarks and valgrind for instruction counts.
APT_PACKAGES=(redis-server slapd ldap-utils openssl keystone uwsgi uwsgi-plugin-python3 prometheus
              wrk valgrind)
missing=()
for pkg in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" \
        || missing+=("$pkg")
done
# kubectl renders deploy/ (kubectl kustomize, any kubectl >= 1.14); Debian's is 1.20.
command -v kubectl >/dev/null || missing+=(kubernetes-client)
if [ ${#missing[@]} -gt 0 ]; then
    echo "installing Debian packages: ${missing[*]}"
    SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get update -q
    # policy-rc.d style environments: the packages' own services are not needed,
    # the tests start private instances.
    $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
.venv/bin/pip install -q --upgrade pip >/dev/null
.venv/bin/pip install -q -e '.[test,loadtest]'

if [ $# -gt 0 ]; then
    exec .venv/bin/pytest -q "$@"
fi

# From here on a failing phase is recorded, not fatal (set +e), except the unit tier.
set +e
summary=()
failed=0
phase() {  # phase NAME COMMAND...
    local name=$1; shift
    local started=$SECONDS
    echo "==> $name: $*"
    "$@"
    local rc=$?
    local took=$((SECONDS - started))
    if [ $rc -eq 0 ]; then
        summary+=("$(printf '%-8s passed  (%ss)' "$name" "$took")")
    else
        summary+=("$(printf '%-8s FAILED  (%ss, exit %s)' "$name" "$took" "$rc")")
        failed=1
    fi
    return $rc
}
report() {
    echo
    echo "==> summary"
    printf '%s\n' "${summary[@]}"
}

phase lint sh -c '.venv/bin/ruff check . && .venv/bin/ruff format --check . && .venv/bin/mypy'
if ! phase unit .venv/bin/pytest -q -x -n "${TEST_WORKERS:-2}" --dist loadfile tests/unit; then
    summary+=("process, deploy, perf: not run (the unit tier failed)")
    report
    exit 1
fi
phase process .venv/bin/pytest -q -n "${PROCESS_WORKERS:-3}" --dist loadfile tests/process
phase deploy .venv/bin/pytest -q -n "${TEST_WORKERS:-2}" --dist loadfile tests/deploy
# The perf tier: documented commands whose checks hold on a busy machine two at a time,
# then what needs the machine to itself (marked exclusive) alone.
phase perf-cmds .venv/bin/pytest -q -n "${TEST_WORKERS:-2}" --dist load -m "not exclusive" tests/perf
phase perf .venv/bin/pytest -q -m exclusive tests/perf
report
exit $failed
