"""End-to-end: `selfheal mcp` between the real Python `mcp` SDK (client) and the real
@modelcontextprotocol/server-filesystem from npm (server), over stdio."""

import asyncio
import json
import os
import subprocess

import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from conftest import BIN

SERVER = os.environ.get("SELFHEAL_MCP_FILESYSTEM", "")


@pytest.fixture(autouse=True)
def server_installed():
    assert os.path.exists(SERVER), (
        "no MCP server: run these tests through scripts/test-e2e.sh, which installs "
        "it from npm into .cache/e2e/ on first use")


def session(tmp_path, body, extra=()):
    """Runs `body(session, notifications)` against the filesystem server behind the proxy;
    returns its result and the trace path."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "a.txt").write_text("hello from a\n")
    trace = tmp_path / "trace.db"
    params = StdioServerParameters(
        command=BIN,
        args=["mcp", "--trace-db", str(trace), *extra, "--", SERVER, str(data)])
    notifications = []

    async def on_message(message):
        notifications.append(message)

    async def go():
        async with stdio_client(params) as (r, w):
            async with ClientSession(r, w, message_handler=on_message) as s:
                init = await s.initialize()
                assert init.capabilities.tools.list_changed, "the proxy announces list changes"
                return await body(s, data, notifications)

    return asyncio.run(asyncio.wait_for(go(), 60)), trace


def text(result):
    return "\n".join(c.text for c in result.content if getattr(c, "text", None) is not None)


def trace(trace_db, *args):
    out = subprocess.run([BIN, "trace", *args, "--trace-db", str(trace_db), "--json"],
                         check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


def test_a_tool_failing_five_times_is_paused_and_others_keep_working(tmp_path):
    async def body(s, data, notifications):
        names = [t.name for t in (await s.list_tools()).tools]
        assert "read_text_file" in names and "list_directory" in names
        errors = []
        # Paths outside the server's allowed directory: the server refuses every one, a tool
        # that does not work for this agent. (A missing file, ENOENT, is the model's own
        # mistake: the session's run has it rewrite the call, then re-plan, then — other tools
        # being on offer — the same rules as here: warned at 3, paused at 5; see
        # test_missing_files_are_the_models_to_fix_and_never_stop_the_session.)
        for i in range(5):
            r = await s.call_tool("read_text_file", {"path": str(data.parent / f"outside{i}.txt")})
            assert r.is_error
            errors.append(text(r))
        assert all("Access denied" in e for e in errors), errors
        # Warned from the third failure in a row, naming other tools.
        assert all("[selfheal]" in e and "`list_directory`" in e for e in errors[2:]), errors
        # The sixth call is answered by the proxy: the server would only fail again.
        r = await s.call_tool("read_text_file", {"path": str(data / "a.txt")})
        assert r.is_error and "paused" in text(r) and "Access denied" not in text(r)
        listed = [t.name for t in (await s.list_tools()).tools]
        assert "read_text_file" not in listed and "list_directory" in listed
        ok = await s.call_tool("list_directory", {"path": str(data)})
        assert not ok.is_error and "a.txt" in text(ok)
        return [str(n) for n in notifications]

    seen, trace_db = session(tmp_path, body)
    assert any("list_changed" in n for n in seen), seen
    [run] = [r for r in trace(trace_db, "list") if r["run"].startswith("mcp-")]
    kinds = [e["kind"] for e in trace(trace_db, "show", run["run"])]
    assert "paused" in kinds and "blocked" in kinds and kinds[-1] == "session"
    assert run["failures"] == 5


def test_missing_files_are_the_models_to_fix_and_never_stop_the_session(tmp_path):
    async def body(s, data, notifications):
        await s.list_tools()
        errors = []
        for i in range(5):
            r = await s.call_tool("read_text_file", {"path": str(data / f"missing{i}.txt")})
            assert r.is_error
            errors.append(text(r))
        assert all("ENOENT" in e for e in errors), errors
        # The first two: rewrite, then re-plan; from the third the monitor's warning, naming
        # other tools. Never a stop: the session goes on.
        assert "rewrite" in errors[0], errors[0]
        assert all("`list_directory`" in e for e in errors[1:]), errors
        assert not any("stop calling tools" in e for e in errors), errors
        r = await s.call_tool("read_text_file", {"path": str(data / "a.txt")})
        assert r.is_error and "paused" in text(r), text(r)
        ok = await s.call_tool("list_directory", {"path": str(data)})
        assert not ok.is_error and "a.txt" in text(ok)
        return errors

    _, trace_db = session(tmp_path, body)
    [run] = [r for r in trace(trace_db, "list") if r["run"].startswith("mcp-")]
    assert run["status"] != "failed", run


def test_arguments_are_checked_against_the_tool_schema(tmp_path):
    async def body(s, data, notifications):
        await s.list_tools()
        missing = await s.call_tool("list_directory", {})
        wrong = await s.call_tool("read_text_file", {"path": str(data / "a.txt"), "head": "1"})
        return text(missing), missing.is_error, text(wrong), wrong.is_error

    (missing, missing_err, wrong, wrong_err), trace_db = session(tmp_path, body)
    assert missing_err and 'missing required property "path"' in missing, missing
    # "1" for an integer `head` is coerced, so the server reads the first line.
    assert not wrong_err and wrong.strip() == "hello from a", wrong
    [run] = [r for r in trace(trace_db, "list") if r["run"].startswith("mcp-")]
    kinds = [e["kind"] for e in trace(trace_db, "show", run["run"])]
    assert "invalid_arguments" in kinds and "repair" in kinds


def test_a_clean_session_changes_nothing(tmp_path):
    async def body(s, data, notifications):
        tools = (await s.list_tools()).tools
        r = await s.call_tool("read_text_file", {"path": str(data / "a.txt")})
        return len(tools), text(r), r.is_error, [str(n) for n in notifications]

    (count, content, is_error, seen), _ = session(tmp_path, body, ["--no-trace"])
    assert count >= 10
    assert not is_error and content.strip() == "hello from a" and "[selfheal]" not in content
    assert not any("list_changed" in n for n in seen)


def test_a_declared_output_contract_the_real_server_breaks_is_flagged(tmp_path):
    # The filesystem server answers `{"content": ...}`. Declaring `entries` for list_directory
    # is a contract it breaks (no such field, nothing recognisably it); declaring `content` for
    # read_text_file is one it keeps.
    contract = tmp_path / "tools.toml"
    contract.write_text(
        '[tools.list_directory]\noutput = ["entries"]\n\n'
        '[tools.read_text_file]\noutput = ["content"]\n')

    async def body(s, data, notifications):
        await s.list_tools()
        listed = await s.call_tool("list_directory", {"path": str(data)})
        read = await s.call_tool("read_text_file", {"path": str(data / "a.txt")})
        return listed, read

    (listed, read), trace_db = session(tmp_path, body, ["--config", str(contract)])
    # Flagged, with the field named, the server's answer still there to read.
    assert listed.is_error, text(listed)
    assert "`entries`" in text(listed) and "schema drift" in text(listed)
    assert "a.txt" in text(listed)
    # The kept contract changes nothing.
    assert not read.is_error and text(read).strip() == "hello from a"
    assert "[selfheal]" not in text(read)
    [run] = [r for r in trace(trace_db, "list") if r["run"].startswith("mcp-")]
    events = trace(trace_db, "show", run["run"])
    kinds = [e["kind"] for e in events]
    # list_directory is read-only: the core's malformed_output ladder tried the repair (refused:
    # nothing to map), then one retry, before the answer was flagged.
    assert "repair" in kinds and "retry" in kinds, kinds
    assert kinds.count("tool_result") == 2


def test_a_config_asking_for_what_the_proxy_cannot_do_is_refused(tmp_path):
    contract = tmp_path / "tools.toml"
    contract.write_text('[tools.read_text_file]\nsubstitute = "read_file"\n')
    out = subprocess.run(
        [BIN, "mcp", "--no-trace", "--config", str(contract), "--", SERVER, str(tmp_path)],
        capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    assert out.returncode != 0
    assert "substitute" in out.stderr and "gateway" in out.stderr, out.stderr
