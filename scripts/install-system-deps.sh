#!/usr/bin/env bash
# The system programs the tests start themselves, installed from Debian when missing:
#  - redis-server: the shared state store (crates/selfheal-state/tests, tests/e2e/test_replicas.py);
#  - haproxy: the round-robin load balancer in front of gateway replicas (tests/e2e/test_replicas.py).
# Nothing is started here and nothing is configured: the tests start their own on loopback ports.
set -euo pipefail
have() { command -v "$1" >/dev/null 2>&1 || [[ -x "/usr/sbin/$1" ]]; }
missing=()
have redis-server || missing+=(redis-server)
have haproxy || missing+=(haproxy)
if ((${#missing[@]} == 0)); then
  exit 0
fi
echo "installing ${missing[*]} (apt-get)" >&2
SUDO=
if [[ $(id -u) -ne 0 ]]; then SUDO=sudo; fi
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
