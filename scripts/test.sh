#!/usr/bin/env bash
# Sets up everything the test suite needs on a fresh Debian machine, then runs
# the linters, the type checker and the whole test suite.
#
#   ./scripts/test.sh            # everything
#   ./scripts/test.sh -k cache   # extra arguments go to pytest (one process, serial)
#
# The whole suite runs on TEST_WORKERS pytest-xdist workers (2: this machine's cores),
# a test file to a worker, so each file's servers start once. Tests marked
# "exclusive" saturate both cores on their own (wrk, locust, measurement scripts) and
# would starve the timing of whatever ran beside them: they run alone, afterwards.
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

.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
if [ $# -gt 0 ]; then
    exec .venv/bin/pytest -q "$@"
fi
.venv/bin/pytest -q -n "${TEST_WORKERS:-2}" --dist loadfile -m "not exclusive"
.venv/bin/pytest -q -m exclusive
