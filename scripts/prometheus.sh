#!/usr/bin/env bash
# Debian's Prometheus server and promtool for tests/telemetry/test_metrics_prometheus.py, which
# scrapes a live server with them and checks deploy/prometheus/ (rules, config, rule tests).
# Installs what is missing; never starts the packaged service: the test runs its own server
# with a temporary configuration on a free port. Idempotent.
set -euo pipefail

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else "$@"; fi; }

if ! command -v prometheus >/dev/null || ! command -v promtool >/dev/null; then
  echo "Prometheus is missing; installing Debian's prometheus (server and promtool)"
  as_root apt-get update -qq
  # policy-rc.d answering 101 is Debian's "do not start services from maintainer scripts".
  POLICY=/usr/sbin/policy-rc.d
  if [ ! -e "$POLICY" ]; then
    trap 'as_root rm -f "$POLICY"' EXIT
    printf '#!/bin/sh\nexit 101\n' | as_root tee "$POLICY" >/dev/null
    as_root chmod 0755 "$POLICY"
  fi
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq --no-install-recommends prometheus >/dev/null
fi
echo "prometheus ready: $(prometheus --version 2>&1 | head -1); $(promtool --version 2>&1 | head -1)"
