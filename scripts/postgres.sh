#!/usr/bin/env bash
# A throwaway PostgreSQL server on 127.0.0.1 for the store and API tests (and for trying
# `COHABIT_DATABASE_URL` by hand). Uses Debian's package (apt-get install postgresql).
#
#   scripts/postgres.sh start [DIR]   init a cluster in DIR (default: a new temp dir), start it,
#                                     print its SQLAlchemy URL as the last line of stdout
#   scripts/postgres.sh stop DIR      stop it and delete DIR
#
# Run as root it runs the server as the `postgres` user (PostgreSQL refuses root).
# Port: $COHABIT_PG_PORT or 55432.
set -euo pipefail

PORT="${COHABIT_PG_PORT:-55432}"
PGBIN="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)"
if [[ -z "$PGBIN" ]]; then
    echo "error: PostgreSQL is not installed (apt-get install -y postgresql)" >&2
    exit 2
fi

as_server_user() {
    if [[ "$(id -u)" == 0 ]]; then
        # From /, which the postgres user can enter (the caller's folder may be private).
        (cd / && runuser -u postgres -- "$@")
    else
        "$@"
    fi
}

case "${1:-}" in
start)
    DIR="${2:-$(mktemp -d /tmp/cohabit-pg.XXXXXX)}"
    mkdir -p "$DIR"
    DIR="$(realpath "$DIR")"
    if [[ "$(id -u)" == 0 ]]; then chown postgres "$DIR"; fi
    as_server_user "$PGBIN/initdb" -D "$DIR/data" -U cohabit --auth=trust >"$DIR/initdb.log"
    as_server_user "$PGBIN/pg_ctl" -D "$DIR/data" -l "$DIR/server.log" -w -t 60 \
        -o "-c listen_addresses=127.0.0.1 -p $PORT -k $DIR -c max_connections=300 -c fsync=off" \
        start >/dev/null
    as_server_user "$PGBIN/createdb" -h 127.0.0.1 -p "$PORT" -U cohabit cohabit
    echo "postgresql+psycopg://cohabit@127.0.0.1:$PORT/cohabit"
    ;;
stop)
    DIR="$(realpath -m "${2:?usage: scripts/postgres.sh stop DIR}")"
    if [[ -d "$DIR/data" ]]; then
        as_server_user "$PGBIN/pg_ctl" -D "$DIR/data" -m fast -w stop >/dev/null || true
    fi
    rm -rf "$DIR"
    ;;
*)
    echo "usage: scripts/postgres.sh start [DIR] | stop DIR" >&2
    exit 2
    ;;
esac
