#!/usr/bin/env bash
# Makes sure what the test suite talks to is there: PostgreSQL and Redis on loopback, the
# suite's database, and Debian's Chromium for the browser tests. Starts what is installed but
# down; says exactly what is missing otherwise (and fails: tests never skip a missing service).
set -euo pipefail

PGHOST=${PGHOST:-127.0.0.1}
PGPORT=${PGPORT:-5432}
PGUSER=${PGUSER:-postgres}
DB_NAME=${GPUMARKET_TEST_DB:-gpumarket}
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else "$@"; fi; }

if ! pg_isready -q -h "$PGHOST" -p "$PGPORT" 2>/dev/null; then
  echo "PostgreSQL is not answering on $PGHOST:$PGPORT; starting it"
  if command -v pg_ctlcluster >/dev/null && [ -d /etc/postgresql ]; then
    as_root pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | sort -V | tail -1)" main start || true
  fi
  for _ in $(seq 1 30); do pg_isready -q -h "$PGHOST" -p "$PGPORT" && break; sleep 1; done
  pg_isready -q -h "$PGHOST" -p "$PGPORT" || {
    echo "ERROR: PostgreSQL is required at $PGHOST:$PGPORT (user $PGUSER, trust auth)." >&2; exit 1; }
fi

if ! psql -h "$PGHOST" -p "$PGPORT" -U "$PGUSER" -d postgres -tAc \
    "SELECT 1 FROM pg_database WHERE datname = '$DB_NAME'" | grep -q 1; then
  createdb -h "$PGHOST" -p "$PGPORT" -U "$PGUSER" "$DB_NAME"
  echo "created database $DB_NAME"
fi

if ! redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; then
  echo "Redis is not answering on 127.0.0.1:6379; starting it"
  if command -v redis-server >/dev/null; then
    mkdir -p /var/lib/redis /var/log/redis 2>/dev/null || true
    as_root redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" \
      --appendonly no --dir /var/lib/redis --logfile /var/log/redis/ci.log
  fi
  for _ in $(seq 1 20); do redis-cli ping >/dev/null 2>&1 && break; sleep 0.5; done
  redis-cli ping >/dev/null 2>&1 || { echo "ERROR: Redis is required at 127.0.0.1:6379." >&2; exit 1; }
fi

if ! command -v chromium >/dev/null; then
  echo "Chromium is missing; installing Debian's chromium and chromium-driver"
  if command -v apt-get >/dev/null; then
    as_root apt-get update -qq
    DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq chromium chromium-driver >/dev/null
  fi
  command -v chromium >/dev/null || {
    echo "ERROR: the browser tests need Debian's chromium package (apt-get install chromium)." >&2; exit 1; }
fi
echo "services ready: PostgreSQL $PGHOST:$PGPORT/$DB_NAME, Redis 127.0.0.1:6379, $(chromium --version 2>/dev/null | head -1)"
