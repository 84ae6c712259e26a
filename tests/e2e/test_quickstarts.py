"""The quickstarts in examples/ (Python and Node) run as written, through the real gateway, in front of the
fault-injecting upstream: the first model call gets a 500, the gateway retries it, and each
agent's tool loop (a call of `lookup`, its result, the answer) completes."""

import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

from conftest import start_gateway

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"
# Where scripts/test-e2e.sh installed the Node packages (openai, ai, @ai-sdk/openai, zod).
NPM_DIR = os.environ.get("SELFHEAL_E2E_NPM", "")


def run_example(name, gateway, tmp_path):
    env = {**os.environ, "OPENAI_BASE_URL": gateway.url + "/v1", "OPENAI_API_KEY": "unused",
           "ANTHROPIC_BASE_URL": gateway.url, "ANTHROPIC_API_KEY": "unused", "MODEL": "stub"}
    if name.endswith(".mjs"):
        assert os.path.isdir(os.path.join(NPM_DIR, "node_modules", "ai")), (
            "no Node packages: run these tests through scripts/test-e2e.sh, which installs "
            "them from npm into .cache/e2e/ on first use")
        # An ES module resolves its imports from its own directory: run the file as written
        # from a copy beside the installed packages.
        script = pathlib.Path(NPM_DIR) / f"{tmp_path.name}-{name}"
        shutil.copyfile(EXAMPLES / name, script)
        command = ["node", str(script)]
    else:
        script = None
        command = [sys.executable, str(EXAMPLES / name)]
    try:
        out = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
    finally:
        if script is not None:
            script.unlink()
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name", [
    "openai_tool_loop.py",
    "openai_agents_tool_loop.py",
    "anthropic_tool_loop.py",
    "langchain_tool_loop.py",
    "pydantic_ai_tool_loop.py",
    "litellm_tool_loop.py",
    "openai_tool_loop.mjs",
    "vercel_ai_tool_loop.mjs",
])
def test_quickstart_completes_its_tool_loop_through_an_injected_fault(name, upstream, tmp_path):
    gateway = start_gateway(upstream, tmp_path)
    try:
        upstream.script([{"kind": "status", "status": 500}])  # also clears its log
        result = run_example(name, gateway, tmp_path)
    finally:
        gateway.stop()
    assert result["answer"] == "The answer is 42."
    log = upstream.log()
    # The 500'd call, the gateway's retry of it, then the call carrying the tool's result.
    assert len(log) == 3, [req.get("messages") for req in log]
    assert log[0]["messages"] == log[1]["messages"], "the retry resends the same conversation"
    assert [m["role"] for m in log[2]["messages"]][-1] == "tool"
    assert "ok: 42" in json.dumps(log[2]["messages"])
    if "selfheal" in result:
        first, last = result["selfheal"][0], result["selfheal"][-1]
        assert "retry" in first["actions"], first
        assert first["status"] == "complete" and last["status"] == "complete", result
