#!/usr/bin/env bash
# End-to-end tests: the real `selfheal` binary
#  - gateway: on port 0, between the real `openai` SDK / openai-agents and a scripted
#    fault-injecting upstream (tests/e2e/test_gateway.py);
#  - MCP proxy: between the real Python `mcp` SDK and a real MCP server from npm,
#    @modelcontextprotocol/server-filesystem (tests/e2e/test_mcp.py).
#
#   scripts/test-e2e.sh --setup   # once: venv + pinned packages from PyPI and npm (the only downloads)
#   scripts/test-e2e.sh           # build the binary and run the tests (no network but loopback)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${SELFHEAL_E2E_VENV:-target/venv-e2e}
NPM_DIR=${SELFHEAL_E2E_NPM:-target/npm-e2e}

if [[ "${1:-}" == "--setup" ]]; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check -r tests/e2e/requirements.txt
  mkdir -p "$NPM_DIR"
  npm install --prefix "$NPM_DIR" --no-audit --no-fund --silent \
    @modelcontextprotocol/server-filesystem@2026.8.31
  exit 0
fi
if [[ ! -x "$VENV/bin/python" ]]; then
  echo "no test venv at $VENV: run 'scripts/test-e2e.sh --setup' once (installs tests/e2e/requirements.txt)" >&2
  exit 1
fi

cargo build -q -p selfheal-cli
export SELFHEAL_BIN="${CARGO_TARGET_DIR:-target}/debug/selfheal"
export SELFHEAL_MCP_FILESYSTEM="$PWD/$NPM_DIR/node_modules/.bin/mcp-server-filesystem"
exec "$VENV/bin/python" -m pytest -q -p no:cacheprovider tests/e2e
