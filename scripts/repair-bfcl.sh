#!/usr/bin/env bash
# Restoration of tool calls by `selfheal repair --schema`: valid calls must come back unchanged,
# repairable corruptions (single quotes, Python literals, trailing commas, a missing final brace,
# unquoted keys, fences, prose, comments, tags, double encoding) restored exactly, and cuts
# (inside a string or key, after a colon or comma) refused. The calls are the ground truth of
# the Berkeley Function Calling Leaderboard, from the PyPI wheel `bfcl-eval` (Apache-2.0),
# downloaded on the first run into .cache/repair-bfcl/ with `jsonschema` in a venv.
#
# usage: scripts/repair-bfcl.sh BINARY [--limit N] [--workers 2] [--show N] [--out FILE]
#   (all 1,874 valid calls take about 15 minutes on 2 cores; --limit 400 a seeded sample)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cache="${REPAIR_BFCL_CACHE:-$here/../.cache/repair-bfcl}"
export REPAIR_BFCL_CACHE="$cache"
bfcl_version="2026.3.23"
mkdir -p "$cache"
if [ ! -x "$cache/venv/bin/python" ]; then
  echo "setting up $cache/venv (jsonschema)" >&2
  python3 -m venv "$cache/venv"
  "$cache/venv/bin/python" -m pip install -q "jsonschema==4.26.0"
fi
if [ ! -d "$cache/whl/bfcl_eval/data" ]; then
  echo "downloading bfcl-eval $bfcl_version" >&2
  "$cache/venv/bin/python" -m pip download -q --no-deps "bfcl-eval==$bfcl_version" -d "$cache/pkg"
  "$cache/venv/bin/python" -m zipfile -e "$cache"/pkg/bfcl_eval-*.whl "$cache/whl"
fi
if [ ! -s "$cache/calls.jsonl" ]; then
  "$cache/venv/bin/python" "$here/repair-bfcl/build_calls.py" >&2
fi
exec "$cache/venv/bin/python" "$here/repair-bfcl/eval_calls.py" "$@"
