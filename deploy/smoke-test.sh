#!/usr/bin/env bash
# Smoke test of the compose stack (docs/operations.md): builds the image, starts the stack under
# its own project name with throwaway secrets, and checks that web answers, the workers report
# healthy, the ledger and the audit chain verify, and a simulated node's samples arrive. The
# project and its volumes are removed on exit. Needs docker with the compose plugin and the
# base images (python:3.11-slim, postgres:16, redis:7) pulled or pullable.
set -euo pipefail
cd "$(dirname "$0")/.."

export COMPOSE_PROJECT_NAME=${SMOKE_PROJECT:-gpumarket-smoke}
export WEB_PORT=${SMOKE_WEB_PORT:-18000} PARTS_WORKERS=1
secret() { python3 -c 'import secrets; print(secrets.token_hex(32))'; }
SECRET_KEY=$(secret)
GPUMARKET_AUDIT_KEYS="k1:$(secret)"
GPUMARKET_METRICS_TOKEN=$(secret)
APP_DB_PASSWORD=$(secret)
OWNER_DB_PASSWORD=$(secret)
export SECRET_KEY GPUMARKET_AUDIT_KEYS GPUMARKET_METRICS_TOKEN APP_DB_PASSWORD OWNER_DB_PASSWORD
export SIM_NODE_TOKEN=""

compose() { docker compose --profile sim "$@"; }
step() { printf '== %s\n' "$*"; }
trap 'status=$?; [ $status -eq 0 ] || compose logs --tail 50 >&2 || true; compose down --volumes --remove-orphans >/dev/null 2>&1 || true; exit $status' EXIT

step "build"
compose build
# Each container of SERVICE healthy within 300 s. (Not `up --wait`: some compose versions
# count the migrate container's exit as a failure.)
healthy() {
  local deadline=$((SECONDS + 300)) ids id status
  while :; do
    ids=$(compose ps -q "$1")
    status=healthy
    for id in $ids; do
      [ "$(docker inspect -f '{{.State.Health.Status}}' "$id")" = healthy ] || status=waiting
    done
    [ -n "$ids" ] && [ $status = healthy ] && return 0
    [ $SECONDS -lt $deadline ] || { echo "ERROR: $1 not healthy within 300 s" >&2; return 1; }
    sleep 3
  done
}

step "start web, workers and beat"
compose up -d web worker parts-worker beat
[ "$(docker inspect -f '{{.State.ExitCode}}' "$(compose ps -a -q migrate)")" = 0 ]
for service in web worker parts-worker; do
  healthy "$service"
done

step "web answers on the published port"
python3 - "$WEB_PORT" <<'PY'
import sys, urllib.request
with urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/login/", timeout=10) as response:
    assert response.status == 200, response.status
PY

step "ledger and audit chain verify"
compose exec -T web gpumarket verify-ledger
# verify-audit needs a checkpoint of the head; beat's first may not have been written yet.
compose exec -T web gpumarket audit-checkpoint
compose exec -T web gpumarket verify-audit

step "a simulated node registers and posts samples"
compose exec -T web gpumarket shell -c \
  "from market.services.tiers import tier_create; tier_create(actor='smoke-test', slug='smoke', capacity=4)"
SIM_NODE_TOKEN=$(compose exec -T web gpumarket node-register sim-1 --tier smoke 2>/dev/null | tr -d '\r')
export SIM_NODE_TOKEN
compose up -d agent
count_samples='from telemetry.models import Sample; print(Sample.objects.filter(gpu__node__name="sim-1").count())'
for _ in $(seq 60); do
  samples=$(compose exec -T web gpumarket shell -c "$count_samples" | tr -d '\r')
  if [ "${samples:-0}" -gt 0 ]; then
    step "ok: $samples samples from sim-1"
    exit 0
  fi
  sleep 2
done
echo "ERROR: no samples from the simulated node within 120 s" >&2
exit 1
