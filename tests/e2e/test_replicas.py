"""Three `selfheal serve` replicas sharing one real redis-server (`--state redis://...`) behind a
real round-robin load balancer (HAProxy), driven by the `openai` SDK through the fault-injecting
upstream (docs/guides/replicas.md):

- a conversation whose requests alternate replicas is one run: its failing tool is warned at
  the 3rd failure and hidden at the 5th counting every replica's observations, and its budget
  is charged once; a replica killed with `kill -9` mid-conversation loses nothing it answered;
- a provider outage learned on one replica is skipped by the others within the documented
  staleness (`[state] refresh_ms` plus two round trips);
- Redis stopped mid-run and restarted empty: no request fails, every replica reports the outage
  on /readyz and /metrics and logs it once, and sharing resumes — with what was learned during
  the outage.

redis-server and haproxy come from Debian (scripts/install-system-deps.sh, run by .ci/run); a
missing one fails these tests, it does not skip them.
"""

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest
from openai import OpenAI

from conftest import Upstream, read_address, start_gateway

REFRESH_MS = 200
# The documented staleness is refresh_ms plus two round trips; the margin covers a debug build
# on a loaded 2-core machine.
STALENESS_S = REFRESH_MS / 1000 + 0.3
EXPECTED = "The answer is 42."
UNREACHABLE = "the state store is unreachable"
HEALABLE = [{"kind": "status", "status": 500}, {"kind": "status", "status": 503},
            {"kind": "status", "status": 429, "retry_after": "0"}, {"kind": "empty"},
            {"kind": "empty_stream"}, {"kind": "role_then_cut"}, {"kind": "reset"},
            {"kind": "bad_json"}]


def program(name):
    path = shutil.which(name) or next(
        (p for p in (f"/usr/sbin/{name}", f"/usr/bin/{name}") if os.access(p, os.X_OK)), None)
    if path is None:
        pytest.fail(f"{name} is not installed: these tests need the real one "
                    f"(scripts/install-system-deps.sh installs it; .ci/run runs that)")
    return path


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, within=10.0):
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.02)
    raise AssertionError(f"nothing listens on {port}")


class Redis:
    def __init__(self):
        self.bin = program("redis-server")
        self.port = free_port()
        self.proc = None
        self.start()

    @property
    def url(self):
        return f"redis://127.0.0.1:{self.port}"

    def start(self):
        self.proc = subprocess.Popen(
            [self.bin, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_port(self.port)

    def command(self, *args):
        """One command over RESP (redis-cli is another package)."""
        req = f"*{len(args)}\r\n" + "".join(f"${len(a)}\r\n{a}\r\n" for a in args)
        with socket.create_connection(("127.0.0.1", self.port), timeout=5) as s:
            s.sendall(req.encode())
            return s.recv(65536).decode()

    def stop(self):
        if self.proc:
            self.proc.kill()
            self.proc.wait()
            self.proc = None


def start_upstream():
    proc = subprocess.Popen([sys.executable, os.path.join(os.path.dirname(__file__), "upstream.py")],
                            stdout=subprocess.PIPE, text=True)
    return proc, Upstream(read_address(proc))


def post(url, path, body):
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(), method="POST",
                                 headers={"content-type": "application/json"})
    urllib.request.urlopen(req, timeout=5).read()


def get(url, path):
    try:
        with urllib.request.urlopen(url + path, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def metrics(url):
    out = {}
    for line in get(url, "/metrics")[1].splitlines():
        if line and not line.startswith("#") and "{" not in line:
            name, value = line.split()
            out[name] = float(value)
    return out


def eventually(within, check):
    deadline = time.monotonic() + within
    while True:
        if check():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)


class Fleet:
    """redis-server, three upstreams, three replicas and HAProxy in front of them."""

    def __init__(self, tmp_path):
        self.procs = []
        self.redis = Redis()
        self.main, self.backup, self.flaky = (self._upstream() for _ in range(3))
        top = f"""
run_secret_env = "SELFHEAL_RUN_SECRET"
breaker_failures = 2
breaker_cooldown_ms = 60000
[state]
refresh_ms = {REFRESH_MS}
[upstreams.backup]
base_url = "{self.backup.url}/v1"
timeout_ms = 1500
[upstreams.flaky]
base_url = "{self.flaky.url}/v1"
timeout_ms = 1500
[models.smart]
chain = [{{upstream = "default", model = "m"}}, {{upstream = "backup", model = "m"}}]
[models.other]
chain = [{{upstream = "flaky", model = "m"}}, {{upstream = "backup", model = "m"}}]
"""
        self.replicas, self.logs = [], []
        for i in range(3):
            d = tmp_path / f"replica{i}"
            d.mkdir()
            log = open(d / "stderr.log", "w")
            self.logs.append(d / "stderr.log")
            gw = start_gateway(self.main, d, extra=("--state", self.redis.url), top=top,
                               stderr=log, env={"SELFHEAL_RUN_SECRET": "one deployment"})
            self.replicas.append(gw)
        self.lb_port = free_port()
        cfg = tmp_path / "haproxy.cfg"
        servers = "\n".join(f"  server r{i} {gw.url.removeprefix('http://')}"
                            for i, gw in enumerate(self.replicas))
        cfg.write_text(f"""
global
  maxconn 512
defaults
  mode http
  option http-server-close
  timeout connect 2s
  timeout client 30s
  timeout server 30s
frontend gateways
  bind 127.0.0.1:{self.lb_port}
  default_backend replicas
backend replicas
  balance roundrobin
{servers}
""")
        self.lb = subprocess.Popen([program("haproxy"), "-db", "-f", str(cfg)],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_port(self.lb_port)
        self.lb_url = f"http://127.0.0.1:{self.lb_port}"

    def _upstream(self):
        proc, up = start_upstream()
        self.procs.append(proc)
        return up

    def client(self, base):
        return OpenAI(base_url=base + "/v1", api_key="sk-test", max_retries=0, timeout=20)

    def close(self):
        self.lb.kill()
        self.lb.wait()
        for gw in self.replicas:
            if gw.proc.poll() is None:
                gw.stop()
        for p in self.procs:
            p.kill()
            p.wait()
        self.redis.stop()


@pytest.fixture
def fleet(tmp_path):
    f = Fleet(tmp_path)
    try:
        yield f
    finally:
        f.close()


def ask(client, model="smart", stream=False):
    messages = [{"role": "user", "content": "what is the answer?"}]
    if stream:
        chunks = client.chat.completions.create(model=model, messages=messages, stream=True)
        # The stub streams word by word, each with its space.
        return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices).strip()
    return client.chat.completions.create(model=model, messages=messages).choices[0].message.content


def shared_within_staleness(fleet):
    """Waits until replica 0's open circuit of `flaky` is in Redis (it is sent at once), then
    for the documented staleness: by then every replica must have read it."""
    assert eventually(5, lambda: fleet.redis.command("HEXISTS", "selfheal:shared",
                                                     "circuit:flaky").strip() == ":1"), \
        "replica 0 published the open circuit"
    time.sleep(STALENESS_S)


def an_outage_learned_on_one_replica_is_skipped_by_the_others(fleet):
    """`flaky` is down: replica 0 learns it (its core opens the circuit after two failures);
    within the staleness the other two leave it out of their chains, and no request through the
    load balancer reaches it again."""
    fleet.flaky.script([{"kind": "status", "status": 503, "message": "provider outage"}] * 100)
    assert ask(fleet.client(fleet.replicas[0].url), model="other") == EXPECTED
    tried = len(fleet.flaky.log())
    assert tried >= 2, "replica 0 tried the down provider until its circuit opened"
    shared_within_staleness(fleet)
    others = fleet.replicas[1:]
    lb = fleet.client(fleet.lb_url)
    for i in range(6):
        assert ask(lb, model="other", stream=i % 2 == 1) == EXPECTED
    assert len(fleet.flaky.log()) == tried, \
        "no replica tried the provider another had learned was down"
    for gw in others:
        assert metrics(gw.url)["selfheal_upstream_shared_skips_total"] >= 1, \
            "round robin sent requests to every replica, and each skipped the provider"


def test_a_provider_outage_learned_on_one_replica_is_skipped_by_the_others(fleet):
    for gw in fleet.replicas:
        status, body = get(gw.url, "/readyz")
        assert status == 200, body
        assert json.loads(body)["state_store"] == {"backend": "redis", "up": True}
    an_outage_learned_on_one_replica_is_skipped_by_the_others(fleet)


def test_redis_stopped_and_restarted_mid_run_fails_no_request_and_sharing_resumes(fleet):
    # 20 % healable faults on the main provider, streams and not, through the load balancer.
    post(fleet.main.url, "/_chaos", {"rate": 0.2, "seed": 11, "kinds": HEALABLE})
    stop, lock = threading.Event(), threading.Lock()
    results = {"ok": 0, "failed": [], "bad": []}

    def traffic(n):
        client = fleet.client(fleet.lb_url)
        i = 0
        while not stop.is_set():
            i += 1
            try:
                got = ask(client, stream=(i + n) % 2 == 0)
            except Exception as e:  # noqa: BLE001 - every failure is counted and shown
                with lock:
                    results["failed"].append(repr(e))
                continue
            with lock:
                if got == EXPECTED:
                    results["ok"] += 1
                else:
                    results["bad"].append(got)

    threads = [threading.Thread(target=traffic, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    try:
        time.sleep(1.0)
        fleet.redis.stop()
        assert eventually(10, lambda: all(
            metrics(gw.url)["selfheal_state_store_up"] == 0 for gw in fleet.replicas)), \
            "every replica reports the store down on /metrics"
        for gw in fleet.replicas:
            status, body = get(gw.url, "/readyz")
            assert status == 200, "a replica without Redis still serves: it stays ready"
            assert json.loads(body)["state_store"] == {"backend": "redis", "up": False}
        during = results["ok"]
        time.sleep(1.5)
        assert results["ok"] > during, "requests were answered while Redis was down"
        # Learned while Redis is down: shared once it is back.
        stop.set()
        for t in threads:
            t.join(timeout=30)
        fleet.flaky.script([{"kind": "status", "status": 503}] * 100)
        assert ask(fleet.client(fleet.replicas[0].url), model="other") == EXPECTED
        tried = len(fleet.flaky.log())
        fleet.redis.start()
        assert eventually(10, lambda: all(
            metrics(gw.url)["selfheal_state_store_up"] == 1 for gw in fleet.replicas)), \
            "every replica reconnects by itself"
        # What replica 0 learned during the outage reaches the others once Redis is back.
        shared_within_staleness(fleet)
        lb = fleet.client(fleet.lb_url)
        for i in range(6):
            assert ask(lb, model="other", stream=i % 2 == 0) == EXPECTED
        assert len(fleet.flaky.log()) == tried, "sharing resumed: no replica tried it again"
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=30)
    assert results["failed"] == [], results["failed"][:5]
    assert results["bad"] == [], results["bad"][:5]
    assert results["ok"] >= 20, results
    for gw in fleet.replicas:
        m = metrics(gw.url)
        assert m["selfheal_requests_total"] >= 3, "round robin reached every replica"
        assert m["selfheal_state_store_outages_total"] == 1, m
    for gw, log in zip(fleet.replicas, fleet.logs):
        gw.stop()
        text = log.read_text()
        assert text.count(UNREACHABLE) == 1, f"one warning per outage, not per request:\n{text}"
        assert "sharing resumes" in text, text


TOOLS = [
    {"type": "function", "function": {"name": "web_search", "parameters": {
        "type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}},
    {"type": "function", "function": {"name": "fetch_url", "parameters": {
        "type": "object", "properties": {"url": {"type": "string"}}, "required": ["url"]}}},
]


def failing_turn(client, i, run, stream=False):
    """The `i`th request of an agent whose search keeps failing. It keeps only its newest tool
    result in the history (as agents with a context budget do) and names its run with a label,
    so a replica that had not seen the earlier requests could not count them from the history:
    only the shared run can. Its `selfheal` report."""
    messages = [
        {"role": "user", "content": "What does the page say?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": f"ws{i}", "type": "function",
             "function": {"name": "web_search", "arguments": json.dumps({"query": f"page {i}"})}}]},
        {"role": "tool", "tool_call_id": f"ws{i}", "content": '{"error": "search backend down"}'},
    ]
    extra = {"extra_headers": {"x-selfheal-run": run}}
    if stream:
        chunks = list(client.chat.completions.create(
            model="smart", messages=messages, tools=TOOLS, stream=True, **extra))
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices).strip()
        return None
    resp = client.chat.completions.create(model="smart", messages=messages, tools=TOOLS, **extra)
    assert resp.choices[0].message.content
    return resp.model_extra["selfheal"]


def offered(body):
    return [t["function"]["name"] for t in body.get("tools", [])]


def system_text(body):
    return "\n".join(m["content"] for m in body["messages"]
                     if m["role"] == "system" and isinstance(m.get("content"), str))


def spent(report):
    """What the run's ledger has spent, in the dimensions that count events."""
    return {k: v for k, v in report["budget"]["spent"].items() if k not in ("latency_ms", "cost")}


def conversation(fleet, clients, run, start=0, fault=True):
    """Failing turns of one run, the `i`th through `clients[i]`, each meeting one upstream
    fault the gateway heals (with `fault`): the reports, and the request each answer came from
    as the upstreams saw it (the main provider, or the fallback the controller escalated to)."""
    reports, answered = [], []
    for i, client in enumerate(clients):
        fleet.main.script([{"kind": "status", "status": 500}] if fault else [])
        fleet.backup.script([])
        reports.append(failing_turn(client, start + i, run))
        seen = [b for b in fleet.backup.log() + fleet.main.log() if b.get("tools")]
        answered.append(seen[0] if fleet.backup.log() else seen[-1])
    return reports, answered


def test_a_conversation_alternating_replicas_is_one_run(fleet):
    """Five requests through the round-robin balancer land on r0, r1, r2, r0, r1: the 3rd is
    warned and the 5th has the tool hidden, though no replica saw more than two of the five
    failures. The run's one ledger is charged as one process would charge it: the same
    conversation served by one replica alone spends exactly the same (no upstream fault here:
    the breakers they open would make the two differ for another reason)."""
    lb = fleet.client(fleet.lb_url)
    reports, answered = conversation(fleet, [lb] * 5, "alternating", fault=False)
    assert offered(answered[1]) == ["web_search", "fetch_url"]
    assert "`fetch_url`" in system_text(answered[2]), system_text(answered[2])
    assert offered(answered[3]) == ["web_search", "fetch_url"]
    assert offered(answered[4]) == ["fetch_url"], "hidden at the 5th failure"
    assert [r["failures"] for r in reports] == [1, 2, 3, 4, 5], reports
    alone, _ = conversation(fleet, [fleet.client(fleet.replicas[2].url)] * 5, "alone",
                            fault=False)
    assert [spent(r) for r in reports] == [spent(r) for r in alone]
    # What the equality compares is real spending: the ladder's actions before the run routes
    # around the tool (warning and hiding are not charged, so the ledger stops growing there).
    assert sum(spent(reports[1]).values()) > 0, reports
    assert sum(spent(reports[-1]).values()) >= sum(spent(reports[1]).values()), reports
    loaded = [metrics(gw.url)["selfheal_state_runs_loaded_total"] for gw in fleet.replicas]
    assert all(n >= 1 for n in loaded), f"every replica continued the run from Redis: {loaded}"


def test_a_replica_killed_mid_conversation_loses_nothing_it_answered(fleet):
    """Three requests on r0 (the first streamed), then `kill -9` of r0: the conversation goes on on r1 and r2 with
    its state — the 5th failure hides the tool, and the budget and failures carry on from
    where r0 left them, as they would have on r0 alone."""
    r0, r1, r2 = (fleet.client(gw.url) for gw in fleet.replicas)
    failing_turn(r0, 0, "killed", stream=True)
    first, _ = conversation(fleet, [r0, r0], "killed", start=1)
    fleet.replicas[0].proc.kill()
    fleet.replicas[0].proc.wait()
    then, answered = conversation(fleet, [r1, r2], "killed", start=3)
    assert [r["failures"] for r in first + then] == [2, 3, 4, 5], first + then
    assert sum(spent(then[-1]).values()) >= sum(spent(first[-1]).values()) > 0
    assert offered(answered[-1]) == ["fetch_url"], "hidden at the 5th failure, on another replica"


RESPONSES_TOOLS = [{"type": "function", "name": t["function"]["name"],
                    "parameters": t["function"]["parameters"]} for t in TOOLS]


def test_a_responses_conversation_continued_on_another_replica_keeps_its_run(fleet):
    """An agent on the Responses API continues each answer with `previous_response_id`, sending
    only its failing search's result, and each turn lands on the next replica. The replica that
    did not send the answer finds its run through Redis (the link written with the run): one
    run throughout — the same `x-selfheal-run` on every continued turn, and its failures
    counted 1, 2, 3 across the three replicas. Before, each replica started a run of its own for such a turn."""
    clients = [fleet.client(gw.url) for gw in fleet.replicas]
    fleet.main.script([{"kind": "tool", "id": f"resp_{i}", "call_id": f"call_{i}",
                        "name": "web_search", "arguments": json.dumps({"query": f"page {i}"})}
                       for i in range(5)])
    raw = clients[0].responses.with_raw_response.create(
        model="smart", input="What does the page say?", tools=RESPONSES_TOOLS)
    previous = raw.parse().id
    assert previous == "resp_0"
    failures, runs = [], [raw.headers["x-selfheal-run"]]
    for i in range(1, 4):
        raw = clients[i % 3].responses.with_raw_response.create(
            model="smart", previous_response_id=previous, tools=RESPONSES_TOOLS,
            input=[{"type": "function_call_output", "call_id": f"call_{i - 1}",
                    "output": '{"error": "search backend down"}'}])
        resp = raw.parse()
        runs.append(raw.headers["x-selfheal-run"])
        failures.append(resp.model_extra["selfheal"]["failures"])
        previous = resp.id
    # The first answer's id is the one the run is stored under, on every replica.
    assert len(set(runs)) == 1, runs
    assert failures == [1, 2, 3], failures


def test_a_run_id_answered_by_one_replica_names_the_run_on_another(fleet):
    """A chat client that sends back the `x-selfheal-run` one replica answered, to a replica
    that has never seen the run, continues that run (read from Redis), not a new run keyed by
    the id as a label."""
    r0, r1 = (fleet.client(gw.url) for gw in fleet.replicas[:2])
    fleet.main.script([])
    resp = r0.chat.completions.with_raw_response.create(
        model="smart", tools=TOOLS, messages=[
            {"role": "user", "content": "What does the page say?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "ws0", "type": "function",
                 "function": {"name": "web_search", "arguments": '{"query": "page"}'}}]},
            {"role": "tool", "tool_call_id": "ws0", "content": '{"error": "search backend down"}'}])
    run = resp.headers["x-selfheal-run"]
    assert resp.parse().model_extra["selfheal"]["failures"] == 1
    report = failing_turn(r1, 1, run)
    assert report["failures"] == 2, report


def test_chaos_across_three_replicas_fails_nothing(tmp_path):
    """scripts/chaos.py's replicas scenario at CI size: 20 % upstream faults (seeded), half the
    requests streaming, conversations of three turns (agents among them, on chat completions and
    the Responses API) through HAProxy to three replicas sharing one redis-server: no
    client-visible failure, no silent bad answer, nothing hung, and the agents' runs went
    through Redis. The 2,000-request run's figures are in docs/guides/replicas.md."""
    import importlib.util

    from conftest import BIN, ROOT

    spec = importlib.util.spec_from_file_location("chaos", ROOT / "scripts" / "chaos.py")
    chaos = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(chaos)
    procs = [subprocess.Popen([sys.executable, str(chaos.UPSTREAM)], stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True) for _ in range(2)]
    try:
        faulty, healthy = (read_address(p) for p in procs)
        chaos.post(healthy, "/_script", [])
        chaos.post(healthy, "/_chaos", {"rate": 0, "seed": 0, "kinds": []})
        chaos.post(faulty, "/_chaos", {"rate": 0.2, "seed": 13, "kinds": chaos.FAULTS})
        line = chaos.replicas(BIN, faulty, healthy, tmp_path, requests=300, turns=3, threads=8,
                              timeout=15)
    finally:
        for p in procs:
            p.kill()
            p.wait()
    assert line["requests"] >= 300 and line["streaming"] > 0, line
    assert line["faults_injected"] > 0, line
    for k in ("failed", "silent_bad", "hung", "flagged"):
        assert line[k] == 0, line
    shared = line["per_replica"]
    assert all(n > 0 for n in shared["selfheal_requests_total"]), shared
    assert sum(shared["selfheal_state_runs_loaded_total"]) > 0, shared
    assert line["runs_in_redis"] > 0, line
