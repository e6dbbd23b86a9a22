#!/usr/bin/env bash
# Runs a test command with what the suite needs beside Python: Debian's PostgreSQL (the store
# and API tests run on SQLite and on PostgreSQL) and Chromium (the web page's browser tests).
# Installs them when missing (as root, or through sudo), starts a throwaway PostgreSQL on
# 127.0.0.1 (scripts/postgres.sh) on the first free port from 55433 up, exports its URL as
# COHABIT_TEST_DATABASE_URL, runs the command, and stops the server. `make test` and so
# `.ci/run` call it:
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

# The throwaway PostgreSQL of a run lives in /tmp/cohabit-test-pg.*, with the run's pid and
# start time in `owner`. A run that was killed before it could stop its server (SIGKILL, a
# lost terminal) left one behind: stop those whose run is gone, and take the first port from
# 55433 up that nobody listens on, so neither a leftover nor another run in progress makes
# this one fail. An explicit $COHABIT_PG_PORT is used as it is.
started_at() { # a process's start time (clock ticks since boot), empty when it is gone
    sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f20
}
listening() { # whether anything accepts connections on 127.0.0.1:$1
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}
claim() { # a fresh folder for this run's server, owned by this run
    mkdir -p "$pg_dir"
    echo "$$ $(started_at $$)" >"$pg_dir/owner"
}

if [[ -z "${COHABIT_TEST_DATABASE_URL:-}" ]]; then
    for leftover in /tmp/cohabit-test-pg.*; do
        [[ -f "$leftover/owner" ]] || continue
        read -r pid started <"$leftover/owner" || continue
        if [[ "$(started_at "$pid")" != "$started" ]]; then
            echo "stopping the PostgreSQL an interrupted run left in $leftover" >&2
            scripts/postgres.sh stop "$leftover"
        fi
    done
    pg_dir="$(mktemp -d /tmp/cohabit-test-pg.XXXXXX)"
    claim
    trap 'scripts/postgres.sh stop "$pg_dir"' EXIT
    port="${COHABIT_PG_PORT:-55433}"
    COHABIT_TEST_DATABASE_URL=""
    for _ in $(seq 20); do
        if ! listening "$port"; then
            if COHABIT_TEST_DATABASE_URL="$(
                COHABIT_PG_PORT="$port" scripts/postgres.sh start "$pg_dir" | tail -n 1
            )"; then
                break
            fi
            # Taken between the check and the start (another run): clear up, try the next.
            COHABIT_TEST_DATABASE_URL=""
            scripts/postgres.sh stop "$pg_dir"
            claim
        fi
        if [[ -n "${COHABIT_PG_PORT:-}" ]]; then break; fi
        port=$((port + 1))
    done
    if [[ -z "$COHABIT_TEST_DATABASE_URL" ]]; then
        if [[ -n "${COHABIT_PG_PORT:-}" ]]; then
            echo "error: could not start PostgreSQL for the tests on COHABIT_PG_PORT=$port" >&2
        else
            echo "error: could not start PostgreSQL for the tests on ports 55433-$port" >&2
        fi
        exit 1
    fi
    export COHABIT_TEST_DATABASE_URL
fi

# A real Kubernetes control plane for tests/cluster/ (scripts/cluster.sh: built from Go
# modules the first time, about half an hour on two cores, then cached), one for the run, on
# the first free ports from 26443 up, in a state folder of its own. Without Go the cluster
# tests skip saying so (they fail under CI=true); COHABIT_TEST_KUBECONFIG set by the caller
# is used as it is.
if [[ -z "${COHABIT_TEST_KUBECONFIG:-}" ]] && command -v go >/dev/null 2>&1; then
    cluster_dir="$(mktemp -d /tmp/cohabit-test-cluster.XXXXXX)"
    stop_cluster() { COHABIT_CLUSTER_DIR="$cluster_dir" scripts/cluster.sh down >/dev/null 2>&1 || true; }
    trap 'stop_cluster; if [[ -n "${pg_dir:-}" ]]; then scripts/postgres.sh stop "$pg_dir"; fi' EXIT
    cluster_port="${COHABIT_CLUSTER_PORT:-26443}"
    for _ in $(seq 20); do
        if cluster_up="$(COHABIT_CLUSTER_DIR="$cluster_dir" COHABIT_CLUSTER_PORT="$cluster_port" \
            scripts/cluster.sh up)"; then
            export COHABIT_TEST_KUBECONFIG="${cluster_up##*KUBECONFIG=}"
            COHABIT_TEST_CLUSTER_BIN="$(scripts/cluster.sh bin)"
            export COHABIT_TEST_CLUSTER_BIN
            break
        else
            code=$?
        fi
        if ((code != 75)) || [[ -n "${COHABIT_CLUSTER_PORT:-}" ]]; then break; fi
        cluster_port=$((cluster_port + 10)) # taken (another run): the next block of ports
    done
    if [[ -z "${COHABIT_TEST_KUBECONFIG:-}" ]]; then
        echo "error: could not start the Kubernetes control plane for the tests" >&2
        exit 1
    fi
fi

"$@"
