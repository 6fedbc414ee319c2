#!/usr/bin/env bash
# Installs the Debian packages the demo and the tests run for real (Prometheus, Alertmanager, promtool, amtool;
# iproute2 and util-linux's unshare for the emulated compose/k8s networks), when root and when missing.
set -euo pipefail
need=()
command -v promtool >/dev/null 2>&1 || need+=(prometheus)
command -v amtool >/dev/null 2>&1 || need+=(prometheus-alertmanager)
command -v ip >/dev/null 2>&1 || need+=(iproute2)
command -v unshare >/dev/null 2>&1 || need+=(util-linux)
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
  echo "note: not root; install ${need[*]} (apt-get install ${need[*]}) or the tests that need them skip" >&2
  exit 0
fi
# The packages ship init scripts that would start daemons on :9090/:9093; forbid that.
if [ ! -e /usr/sbin/policy-rc.d ]; then
  printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
  chmod +x /usr/sbin/policy-rc.d
fi
echo "installing Debian packages: ${need[*]} (about a minute)"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
