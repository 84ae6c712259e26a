#!/usr/bin/env bash
# End-to-end tests: the real `selfheal` binary
#  - gateway: on port 0, between the real `openai` SDK / openai-agents and a scripted
#    fault-injecting upstream (tests/e2e/test_gateway.py; deployment, test_deploy.py; streaming
#    Responses API, test_responses_stream.py; a runaway model's stream cut, test_bounded.py);
#    the Anthropic Messages dialect between the real
#    `anthropic` SDK and the same upstream (test_messages.py);
#  - replicas: three gateways sharing one real redis-server (`--state`) behind a real HAProxy,
#    a provider outage shared and Redis stopped and restarted mid-run (tests/e2e/test_replicas.py;
#    redis-server and haproxy from Debian, installed by scripts/install-system-deps.sh);
#  - OTLP export read back from a real Arize Phoenix (tests/e2e/test_otlp.py; Phoenix in a venv
#    of its own, .cache/e2e/phoenix, from tests/e2e/requirements-phoenix.txt);
#  - chaos at CI size: scripts/chaos.py's faults, kill -9 and slowloris scenarios, about 15 s
#    (tests/e2e/test_chaos.py);
#  - MCP proxy: between the real Python `mcp` SDK and a real MCP server from npm,
#    @modelcontextprotocol/server-filesystem (tests/e2e/test_mcp.py);
#  - the quickstarts in examples/ (Python: openai, openai-agents, anthropic, LangChain,
#    pydantic-ai, LiteLLM; Node: openai, the Vercel AI SDK), each through the gateway in front of the
#    fault-injecting upstream (tests/e2e/test_quickstarts.py).
#
#   scripts/test-e2e.sh           # run the tests (sets up the test environment on first use)
#   scripts/test-e2e.sh --setup   # only (re)create the test environment
#   scripts/test-e2e.sh -k messages   # further arguments go to pytest
#
# The test environment — a Python venv with tests/e2e/requirements.txt from PyPI, and the MCP
# server and the Node quickstarts' packages from npm, the only downloads — lives in .cache/e2e/
# (gitignored; `cargo clean` leaves it alone) and is rebuilt when tests/e2e/requirements.txt or
# the npm packages change. The tests run
# the binary that `cargo test --workspace` builds (same profile, same features), so after
# `cargo test --workspace` nothing is compiled again. No network at test time but loopback.
set -euo pipefail
cd "$(dirname "$0")/.."
E2E=${SELFHEAL_E2E_DIR:-.cache/e2e}
VENV=$E2E/venv
PHOENIX=$E2E/phoenix
NPM_DIR=$E2E/npm
NPM_PACKAGE=@modelcontextprotocol/server-filesystem@2026.8.31
# The Node quickstarts' packages (examples/*.mjs, tests/e2e/test_quickstarts.py).
NPM_QUICKSTARTS="openai@7.55.0 ai@7.0.173 @ai-sdk/openai@4.0.118 zod@4.6.7"
# What the environment was built from: rebuilt when this changes.
WANT="$(cat tests/e2e/requirements.txt) $(cat tests/e2e/requirements-phoenix.txt) $NPM_PACKAGE $NPM_QUICKSTARTS $(python3 --version 2>&1)"
STAMP=$E2E/ready

setup() {
  echo "e2e: setting up the test environment in $E2E (once; PyPI and npm)" >&2
  rm -rf "$VENV" "$PHOENIX" "$NPM_DIR" "$STAMP"
  mkdir -p "$E2E"
  echo "e2e: [1/4] python venv at $VENV" >&2
  python3 -m venv "$VENV"
  echo "e2e: [2/4] pip install -r tests/e2e/requirements.txt" >&2
  "$VENV/bin/pip" install --disable-pip-version-check --progress-bar off \
    -r tests/e2e/requirements.txt | grep -E '^(Collecting|Successfully)' >&2 || true
  "$VENV/bin/python" -c 'import openai, agents, anthropic, mcp, pytest, langchain_openai, pydantic_ai' \
    || { echo "e2e: the Python packages did not install" >&2; exit 1; }
  echo "e2e: [3/4] Arize Phoenix in its own venv at $PHOENIX" >&2
  python3 -m venv "$PHOENIX"
  "$PHOENIX/bin/pip" install --disable-pip-version-check --progress-bar off \
    -r tests/e2e/requirements-phoenix.txt | grep -E '^Successfully' >&2 || true
  [[ -x "$PHOENIX/bin/phoenix" ]] || { echo "e2e: Arize Phoenix did not install" >&2; exit 1; }
  echo "e2e: [4/4] npm install $NPM_PACKAGE $NPM_QUICKSTARTS" >&2
  mkdir -p "$NPM_DIR"
  # shellcheck disable=SC2086 # one word per package
  npm install --prefix "$NPM_DIR" --no-audit --no-fund --loglevel=error "$NPM_PACKAGE" \
    $NPM_QUICKSTARTS >&2
  printf '%s' "$WANT" > "$STAMP"
  echo "e2e: test environment ready" >&2
}

if [[ "${1:-}" == "--setup" ]]; then
  setup
  exit 0
fi
if [[ ! -f "$STAMP" || "$(cat "$STAMP")" != "$WANT" || ! -x "$VENV/bin/python" ]]; then
  setup
fi

# The binary of `cargo test --workspace`: the same command, so when the tests were just built
# this compiles nothing, and otherwise builds exactly what they would.
cargo test -q --workspace --no-run
export SELFHEAL_BIN="${CARGO_TARGET_DIR:-target}/debug/selfheal"
if [[ ! -x "$SELFHEAL_BIN" ]]; then
  echo "e2e: no binary at $SELFHEAL_BIN after 'cargo test --workspace --no-run'" >&2
  exit 1
fi
export SELFHEAL_MCP_FILESYSTEM="$PWD/$NPM_DIR/node_modules/.bin/mcp-server-filesystem"
export SELFHEAL_E2E_NPM="$PWD/$NPM_DIR"
export SELFHEAL_PHOENIX="$PWD/$PHOENIX/bin/phoenix"
exec "$VENV/bin/python" -m pytest -q -p no:cacheprovider tests/e2e "$@"
