# shellcheck shell=bash
# A throwaway PostgreSQL cluster for tests: sourced by .ci/run (CI) and .ci/pg-dev (developers).
#
#   pg_ensure_installed   install Debian's postgresql package if no server binaries are found
#   pg_start              initdb + start on a free loopback port, create role/db "procledger";
#                         sets PG_BASE, PG_PORT, PG_BIN and PG_URL
#   pg_stop [BASE]        fast stop and remove the cluster (default: $PG_BASE); never fails
#
# Non-durable on purpose (fsync, synchronous_commit and full_page_writes off): it only ever
# holds test data. Trust authentication on 127.0.0.1 and a socket inside the cluster directory.

PG_DB=procledger
PG_ROLE=procledger
PG_PASSWORD=procledger

pg_log() { printf 'postgres: %s\n' "$*" >&2; }

# The newest /usr/lib/postgresql/<version>/bin that has a server, or nothing.
pg_find_bindir() {
  local dir
  dir=$(find /usr/lib/postgresql -mindepth 3 -maxdepth 3 -path '*/bin/initdb' 2>/dev/null \
    | sort -V | tail -n 1)
  [ -n "$dir" ] && dirname "$dir"
  return 0
}

pg_ensure_installed() {
  PG_BIN=$(pg_find_bindir)
  if [ -n "$PG_BIN" ]; then
    return 0
  fi
  if [ "$(id -u)" -ne 0 ]; then
    pg_log "no server under /usr/lib/postgresql; install Debian's postgresql package (as root)"
    return 1
  fi
  pg_log "installing Debian's postgresql package"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
  PG_BIN=$(pg_find_bindir)
  if [ -z "$PG_BIN" ]; then
    pg_log "postgresql installed but no /usr/lib/postgresql/<version>/bin/initdb found"
    return 1
  fi
}

# Run a server binary as the cluster's owner: "postgres" when we are root (initdb refuses
# root), ourselves otherwise. From / so that postgres need not be able to enter our cwd.
pg_as_owner() {
  if [ "$(id -u)" -eq 0 ]; then
    (cd / && runuser -u postgres -- "$@")
  else
    "$@"
  fi
}

# A loopback port nobody listens on right now (the kernel picks it).
pg_free_port() {
  python3 -c 'import socket
s = socket.socket()
s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])
s.close()'
}

pg_start() {
  : "${PG_BIN:=$(pg_find_bindir)}"
  if [ -z "$PG_BIN" ]; then
    pg_log "no PostgreSQL server binaries; call pg_ensure_installed first"
    return 1
  fi
  PG_BASE=$(mktemp -d "${TMPDIR:-/tmp}/procledger-pg.XXXXXX")
  if [ "$(id -u)" -eq 0 ]; then
    chown postgres: "$PG_BASE"
  fi
  pg_as_owner "$PG_BIN/initdb" -D "$PG_BASE/data" -U postgres --auth=trust -E UTF8 \
    --no-instructions >"$PG_BASE/initdb.log" 2>&1 || {
    cat "$PG_BASE/initdb.log" >&2
    return 1
  }
  local attempt
  for attempt in 1 2 3; do
    PG_PORT=$(pg_free_port)
    if pg_as_owner "$PG_BIN/pg_ctl" -D "$PG_BASE/data" -l "$PG_BASE/server.log" -w -t 30 \
      -o "-c listen_addresses=127.0.0.1 -p $PG_PORT -k $PG_BASE -c fsync=off \
-c synchronous_commit=off -c full_page_writes=off -c max_connections=300" \
      start >/dev/null; then
      break
    fi
    pg_log "start on port $PG_PORT failed (attempt $attempt):"
    tail -n 5 "$PG_BASE/server.log" >&2 || true
    PG_PORT=
  done
  if [ -z "$PG_PORT" ]; then
    return 1
  fi
  "$PG_BIN/psql" -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$PG_PORT" -U postgres -d postgres \
    -c "CREATE ROLE $PG_ROLE LOGIN PASSWORD '$PG_PASSWORD'" \
    -c "CREATE DATABASE $PG_DB OWNER $PG_ROLE" >/dev/null
  PG_URL="postgresql://$PG_ROLE:$PG_PASSWORD@127.0.0.1:$PG_PORT/$PG_DB"
  pg_log "running on 127.0.0.1:$PG_PORT (cluster in $PG_BASE)"
}

pg_stop() {
  local base=${1:-${PG_BASE:-}}
  if [ -z "$base" ] || [ ! -d "$base" ]; then
    return 0
  fi
  : "${PG_BIN:=$(pg_find_bindir)}"
  if [ -f "$base/data/postmaster.pid" ]; then
    pg_as_owner "$PG_BIN/pg_ctl" -D "$base/data" -m fast -w -t 30 stop >/dev/null 2>&1 \
      || pg_log "could not stop the server in $base"
  fi
  rm -rf "$base"
  return 0
}
