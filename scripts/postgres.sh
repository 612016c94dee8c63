#!/usr/bin/env bash
# A private PostgreSQL cluster for the ledger tests and benchmark (Debian's packaged server).
#
#   scripts/postgres.sh start|stop|status|url
#
# The cluster lives under $STREAMLEDGER_HOME/pg (default /var/tmp/streamledger/pg), listens on
# 127.0.0.1 only (port $STREAMLEDGER_PG_PORT, default 55432) with trust authentication on loopback,
# and runs as the `postgres` system user when invoked as root (initdb refuses to run as root).
# Every action is idempotent: `start` on a running cluster only prints its URL. When the server
# binaries are missing (a fresh CI box) the Debian `postgresql` package is installed with apt-get.
set -euo pipefail

SL_HOME=${STREAMLEDGER_HOME:-/var/tmp/streamledger}
BASE=$SL_HOME/pg
DATA=$BASE/data
RUN=$BASE/run
LOG=$BASE/postgres.log
PORT=${STREAMLEDGER_PG_PORT:-55432}
URL="postgresql+psycopg://postgres@127.0.0.1:$PORT/postgres"

find_bin() {
  local d
  d=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
  [ -n "$d" ] && [ -x "$d/initdb" ] && echo "$d"
}

ensure_binaries() {
  BIN=$(find_bin || true)
  if [ -z "${BIN:-}" ]; then
    echo "postgres: server binaries missing, installing the Debian postgresql package" >&2
    apt-get update -q >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends postgresql postgresql-contrib >&2
    BIN=$(find_bin)
  fi
}

# Run a server binary as the cluster owner.
as_owner() {
  if [ "$(id -u)" = 0 ]; then
    runuser -u postgres -- "$@"
  else
    "$@"
  fi
}

# postmaster.pid names the server by pid alone, and pids are recycled. A server killed without a
# shutdown leaves it behind; once its pid names another process of the cluster's user (another
# cluster's backend: the suite runs several), pg_ctl calls the cluster running and the server refuses
# to start over the lock. The server is the process running postgres on this data directory.
stale_lock() {
  local pid
  [ -f "$DATA/postmaster.pid" ] || return 1
  pid=$(head -n 1 "$DATA/postmaster.pid")
  [[ $pid =~ ^[0-9]+$ ]] || return 0
  ! tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "-D $DATA"
}

running() {
  [ -f "$DATA/PG_VERSION" ] && ! stale_lock && as_owner "$BIN/pg_ctl" -D "$DATA" status >/dev/null 2>&1
}

init_cluster() {
  [ -f "$DATA/PG_VERSION" ] && return 0
  mkdir -p "$SL_HOME"
  chmod 0755 "$SL_HOME" 2>/dev/null || true
  rm -rf "$DATA"
  mkdir -p "$DATA" "$RUN"
  if [ "$(id -u)" = 0 ]; then
    chown -R postgres: "$BASE"
  fi
  chmod 0700 "$DATA"
  as_owner "$BIN/initdb" -D "$DATA" -U postgres --auth=trust -E UTF8 --locale=C >"$BASE/initdb.log" 2>&1 || {
    cat "$BASE/initdb.log" >&2
    rm -rf "$DATA"
    exit 1
  }
  cat >"$DATA/pg_hba.conf" <<EOF
# streamledger test cluster: loopback only, trust
local all all trust
host  all all 127.0.0.1/32 trust
EOF
  cat >>"$DATA/postgresql.conf" <<EOF

# streamledger test cluster
listen_addresses = '127.0.0.1'
port = $PORT
unix_socket_directories = '$RUN'
max_connections = 200
logging_collector = off
EOF
  if [ "$(id -u)" = 0 ]; then
    chown postgres: "$DATA/pg_hba.conf" "$DATA/postgresql.conf"
  fi
}

start() {
  ensure_binaries
  mkdir -p "$SL_HOME"
  exec 9>"$SL_HOME/.pg.lock"
  flock 9
  init_cluster
  if ! running; then
    if stale_lock; then
      echo "postgres: removing a stale postmaster.pid (its pid $(head -n 1 "$DATA/postmaster.pid") is not this cluster's server)" >&2
      rm -f "$DATA/postmaster.pid"
    fi
    mkdir -p "$RUN"
    [ "$(id -u)" = 0 ] && chown postgres: "$RUN" "$BASE"
    touch "$LOG"
    [ "$(id -u)" = 0 ] && chown postgres: "$LOG"
    as_owner "$BIN/pg_ctl" -D "$DATA" -l "$LOG" -w -t 60 start >/dev/null 9>&- || {
      tail -n 30 "$LOG" >&2
      exit 1
    }
  fi
  for _ in $(seq 1 60); do
    if "$BIN/pg_isready" -q -h 127.0.0.1 -p "$PORT"; then
      echo "$URL"
      return 0
    fi
    sleep 0.5
  done
  echo "postgres: server did not accept connections on 127.0.0.1:$PORT; see $LOG" >&2
  exit 1
}

stop() {
  ensure_binaries
  if running; then
    as_owner "$BIN/pg_ctl" -D "$DATA" -m fast -w stop >/dev/null
    echo "postgres: stopped"
  else
    echo "postgres: not running"
  fi
}

status() {
  ensure_binaries
  if running && "$BIN/pg_isready" -q -h 127.0.0.1 -p "$PORT"; then
    echo "postgres: running at 127.0.0.1:$PORT (data $DATA)"
  else
    echo "postgres: not running"
    return 3
  fi
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) status ;;
  url) echo "$URL" ;;
  *)
    echo "usage: $0 start|stop|status|url" >&2
    exit 2
    ;;
esac
