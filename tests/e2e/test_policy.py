"""End-to-end: one policy file changes what every front-end does.

The gateway and the MCP proxy decide through the core's call plan, so the ladder file that
`selfheal bench --policy` takes changes `selfheal serve` and `selfheal mcp` too. Each test runs
the real binary twice on the same faults, once with the default policy and once with a file,
and checks that the behaviour the file asks for is the one that happened."""

import asyncio
import json
import os
import subprocess
import uuid

import openai
import pytest

from conftest import BIN, start_gateway

FALL_BACK_FIRST = """
[ladders]
tool_timeout = ["escalate", "retry", "degrade"]
"""

NEVER_RETRY = """
[ladders]
tool_timeout = ["degrade"]
tool_unavailable = ["degrade"]
"""


def chain_top(upstream):
    # Two upstream names for the same scripted server: the model name tells them apart.
    return f"""
[upstreams.backup]
base_url = "{upstream.url}/v1"
auth = "none"
[models.pair]
chain = [{{upstream = "default", model = "primary"}}, {{upstream = "backup", model = "secondary"}}]
"""


def ask_pair(gw):
    c = openai.OpenAI(base_url=gw.url + "/v1", api_key="unused", max_retries=0)
    raw = c.chat.completions.with_raw_response.create(
        model="pair", messages=[{"role": "user", "content": f"policy {uuid.uuid4()}"}])
    return raw.parse(), raw.headers["x-selfheal-run"]


def replay(args):
    """`selfheal trace replay ... --json`: (exit status, parsed output)."""
    out = subprocess.run([BIN, "trace", "replay", *args, "--json"], capture_output=True, text=True)
    return out.returncode, (json.loads(out.stdout) if out.stdout.strip() else None)


@pytest.mark.parametrize("policy", [None, FALL_BACK_FIRST], ids=["default", "fall-back-first"])
def test_a_policy_file_changes_what_the_gateway_does_at_the_first_5xx(upstream, tmp_path, policy):
    extra = []
    if policy:
        path = tmp_path / "policy.toml"
        path.write_text(policy)
        extra = ["--policy", str(path)]
    gw = start_gateway(upstream, tmp_path, extra=extra, top=chain_top(upstream))
    try:
        upstream.script([{"kind": "status", "status": 503, "message": "overloaded"},
                         {"kind": "ok", "content": "served"}])
        before = len(upstream.log())
        r, run = ask_pair(gw)
        models = [entry["model"] for entry in upstream.log()[before:]]
    finally:
        gw.stop()
    # The run's decision is in the trace with what it was made from: replayed under the policy
    # it ran with nothing differs, under the other one the first decision does.
    other = tmp_path / "other.toml"
    other.write_text(FALL_BACK_FIRST if policy is None else "")
    own = ["--policy", str(tmp_path / "policy.toml")] if policy else []
    code, same = replay([run, "--trace-db", str(gw.trace_db), *own])
    assert code == 0 and same["decisions"] == 1 and same["differing"] == 0, (code, same)
    code, diff = replay([run, "--trace-db", str(gw.trace_db), "--policy", str(other)])
    assert code == 3 and diff["differing"] == 1, (code, diff)
    assert r.choices[0].message.content == "served"
    actions = r.model_extra["selfheal"]["actions"]
    if policy is None:
        # The default ladder for a transient failure retries the same model first.
        assert models == ["primary", "primary"], models
        assert "retry" in actions and "fallback" not in actions, actions
    else:
        # The file's ladder falls back at once: no retry of the failing upstream.
        assert models == ["primary", "secondary"], models
        assert "fallback" in actions and "retry" not in actions, actions


SERVER = os.environ.get("SELFHEAL_MCP_FILESYSTEM", "")


def mcp_retries(tmp_path, extra):
    """Reads a file through the proxy with a call timeout of 0 s, so every attempt times out;
    returns the retry decisions in the trace."""
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    assert os.path.exists(SERVER), "run through scripts/test-e2e.sh, which installs the server"
    data = tmp_path / "data"
    data.mkdir(exist_ok=True)
    (data / "a.txt").write_text("hello\n")
    trace_db = tmp_path / f"trace-{uuid.uuid4().hex}.db"
    params = StdioServerParameters(
        command=BIN,
        args=["mcp", "--trace-db", str(trace_db), "--call-timeout", "0", *extra,
              "--", SERVER, str(data)])

    async def go():
        async with stdio_client(params) as (r, w):
            async with ClientSession(r, w) as s:
                await s.initialize()
                await s.list_tools()
                return await s.call_tool("read_text_file", {"path": str(data / "a.txt")})

    result = asyncio.run(asyncio.wait_for(go(), 60))
    assert result.is_error, "a call that never answers in time fails"
    mcp_retries.last_trace = trace_db
    runs = json.loads(subprocess.run([BIN, "trace", "list", "--trace-db", str(trace_db), "--json"],
                                     check=True, capture_output=True, text=True).stdout)
    [run] = [r for r in runs if r["run"].startswith("mcp-")]
    events = json.loads(subprocess.run(
        [BIN, "trace", "show", run["run"], "--trace-db", str(trace_db), "--json"],
        check=True, capture_output=True, text=True).stdout)
    return [e for e in events if e["kind"] == "retry"]


def test_a_policy_file_changes_what_the_mcp_proxy_retries(tmp_path):
    # read_text_file is read-only, so the default ladder retries its timeouts.
    default = mcp_retries(tmp_path, [])
    assert len(default) == 2, default
    path = tmp_path / "never.toml"
    path.write_text(NEVER_RETRY)
    # The session's decisions replay: the same under the default policy, the retries differ
    # under the file's.
    db = mcp_retries.last_trace
    runs = json.loads(subprocess.run([BIN, "trace", "list", "--trace-db", str(db), "--json"],
                                     check=True, capture_output=True, text=True).stdout)
    [run] = [r["run"] for r in runs if r["run"].startswith("mcp-")]
    code, same = replay([run, "--trace-db", str(db)])
    assert code == 0 and same["decisions"] == 3, (code, same)
    code, diff = replay([run, "--trace-db", str(db), "--policy", str(path)])
    assert code == 3 and diff["differing"] >= 1, (code, diff)
    assert mcp_retries(tmp_path, ["--policy", str(path)]) == []
