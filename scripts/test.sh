#!/usr/bin/env bash
# Runs a test command with what the suite needs beside Python: Debian's PostgreSQL (the store
# and API tests run on SQLite and on PostgreSQL) and Chromium (the web page's browser tests).
# Installs them when missing (as root, or through sudo), starts a throwaway PostgreSQL on
# 127.0.0.1 (scripts/postgres.sh), exports its URL as COHABIT_TEST_DATABASE_URL, runs the
# command, and stops the server. `make test` and so `.ci/run` call it:
#
#   scripts/test.sh .venv/bin/pytest [ARGS]
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1 || missing+=(postgresql)
[[ -x /usr/bin/chromium ]] || missing+=(chromium)
if ((${#missing[@]})); then
    sudo=""
    if [[ "$(id -u)" != 0 ]]; then sudo="sudo"; fi
    echo "installing Debian packages the tests need: ${missing[*]}" >&2
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if [[ -z "${COHABIT_TEST_DATABASE_URL:-}" ]]; then
    pg_dir="$(mktemp -d /tmp/cohabit-test-pg.XXXXXX)"
    trap 'scripts/postgres.sh stop "$pg_dir"' EXIT
    COHABIT_TEST_DATABASE_URL="$(
        COHABIT_PG_PORT="${COHABIT_PG_PORT:-55433}" scripts/postgres.sh start "$pg_dir" | tail -n 1
    )"
    export COHABIT_TEST_DATABASE_URL
fi

"$@"
