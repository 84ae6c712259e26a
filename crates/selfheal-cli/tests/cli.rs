//! End-to-end tests of `selfheal bench`, `monitor`, `demo`, `mcp` and `trace`: the real binary.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

use serde_json::Value;

fn selfheal(args: &[&str], stdin: &str) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_selfheal"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start selfheal");
    // The binary may exit before reading stdin (usage errors): ignore a broken pipe.
    let _ = child.stdin.take().unwrap().write_all(stdin.as_bytes());
    child.wait_with_output().unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A fresh directory under the system temp dir, unique to this process and test.
fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("selfheal-cli-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn lines(out: &Output) -> Vec<Value> {
    text(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

const SMALL: &[&str] = &["bench", "--seeds", "1", "--tasks", "20"];

#[test]
fn bench_json_has_the_documented_shape() {
    let out = selfheal(&[SMALL, &["--json"]].concat(), "");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let v: Value = serde_json::from_str(&text(&out.stdout)).unwrap();
    assert!(v["config"].is_object());
    let results = v["results"].as_array().unwrap();
    assert_eq!(results.len(), 8);
    let mut names: Vec<&str> = Vec::new();
    for r in results {
        let mut keys: Vec<&str> = r.as_object().unwrap().keys().map(String::as_str).collect();
        keys.sort_unstable();
        assert_eq!(
            keys,
            [
                "budget",
                "cost",
                "episodes",
                "latency_ms",
                "rsr",
                "sfr",
                "strategy",
                "tsr"
            ]
        );
        assert_eq!(r["episodes"], 20);
        for k in ["tsr", "rsr", "sfr"] {
            let x = r[k].as_f64().unwrap();
            assert!((0.0..=1.0).contains(&x), "{k} = {x}");
        }
        names.push(r["strategy"].as_str().unwrap());
    }
    assert_eq!(
        names,
        [
            "static",
            "retry-only",
            "react",
            "react+verify",
            "full-replan",
            "full-replan+verify",
            "class-agnostic",
            "self-healing"
        ]
    );
    // Issue 32, item 7: the risk/coverage frontier is in --json, one point per strategy.
    let frontier = v["frontier"].as_array().unwrap();
    assert_eq!(frontier.len(), 8);
    assert!(frontier.iter().all(|p| p["recovered"].is_number()
        && p["silent"].is_number()
        && p["on_frontier"].is_boolean()));
    assert!(frontier.iter().any(|p| p["on_frontier"] == true));
}

#[test]
fn bench_json_is_reproducible() {
    let args = [SMALL, &["--json", "--fault-rate", "0.3"]].concat();
    let a = selfheal(&args, "");
    let b = selfheal(&args, "");
    assert_eq!(a.status.code(), Some(0), "{}", text(&a.stderr));
    assert!(!a.stdout.is_empty());
    assert_eq!(a.stdout, b.stdout);
}

#[test]
fn bench_rejects_bad_options_with_exit_2() {
    let out = selfheal(&[SMALL, &["--fault-rate", "2"]].concat(), "");
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("--fault-rate"),
        "{}",
        text(&out.stderr)
    );
    assert!(out.stdout.is_empty());

    let out = selfheal(&[SMALL, &["--mix", "cosmic=1"]].concat(), "");
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("--mix"), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("cosmic"),
        "{}",
        text(&out.stderr)
    );

    // A simulated-only strategy asked of the live benchmark is refused before any model call.
    let out = selfheal(
        &[
            "bench",
            "--live",
            "--model-url",
            "http://127.0.0.1:9/v1",
            "--model",
            "m",
            "--strategies",
            "static,react",
        ],
        "",
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("\"react\" is not a live strategy"),
        "{}",
        text(&out.stderr)
    );
}

/// Issue 32: `--timings` counts every episode the elapsed time holds — with --sweep, the risk
/// curve's too, named apart.
#[test]
fn bench_timings_count_the_risk_curves_episodes() {
    let out = selfheal(&["bench", "--seeds", "1", "--tasks", "5", "--timings"], "");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    // 8 strategies x 5 tasks.
    assert!(
        text(&out.stderr).contains("timings: 40 episodes in "),
        "{}",
        text(&out.stderr)
    );
    let out = selfheal(
        &[
            "bench",
            "--seeds",
            "1",
            "--tasks",
            "5",
            "--sweep",
            "--timings",
        ],
        "",
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    // R = 1..5 x 8 strategies x 5 tasks, and 7 risk settings x 5 tasks.
    assert!(
        text(&out.stderr).contains(
            "timings: 235 episodes (200 by the strategies, 35 on self-healing's risk curve) in "
        ),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn bench_out_writes_a_report_and_three_svgs() {
    let dir = temp_dir("bench-out");
    let out = selfheal(&[SMALL, &["--out", dir.to_str().unwrap()]].concat(), "");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let md = std::fs::read_to_string(dir.join("report.md")).unwrap();
    assert!(!md.trim().is_empty());
    let svgs: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "svg"))
        .collect();
    assert_eq!(svgs.len(), 3, "{svgs:?}");
    for p in &svgs {
        let body = std::fs::read_to_string(p).unwrap();
        assert!(
            body.starts_with("<svg"),
            "{}: {}",
            p.display(),
            &body[..body.len().min(80)]
        );
        // The report links the plots it was written with.
        let name = p.file_name().unwrap().to_str().unwrap();
        assert!(md.contains(name), "report.md does not mention {name}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bench_trace_writes_parseable_json_lines() {
    let dir = temp_dir("bench-trace");
    let path = dir.join("trace.jsonl");
    let out = selfheal(
        &[
            SMALL,
            &["--fault-rate", "0.3", "--trace", path.to_str().unwrap()],
        ]
        .concat(),
        "",
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let body = std::fs::read_to_string(&path).unwrap();
    let mut episodes = 0;
    for l in body.lines() {
        let v: Value = serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"));
        assert!(v["strategy"].is_string(), "{l}");
        episodes += usize::from(v["event"] == "episode");
    }
    assert_eq!(episodes, 8 * 20, "one episode line per strategy and task");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn monitor_flags_empty_inputs_and_duplicates() {
    let line =
        r#"{"tool":"web_search","args":{"query":""},"result":{"results":[]},"required":["query"]}"#;
    let input = format!("{}\n", [line; 10].join("\n"));
    let out = selfheal(&["monitor"], &input);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let ls = lines(&out);
    assert_eq!(ls.len(), 10);
    let signals: Vec<&str> = ls[1]["signals"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap())
        .collect();
    assert!(signals.contains(&"empty_input"), "{signals:?}");
    assert!(signals.contains(&"duplicate_call"), "{signals:?}");
    for (i, l) in ls.iter().enumerate() {
        assert_eq!(l["call"], i as u64 + 1, "{l}");
    }
}

#[test]
fn monitor_opens_the_circuit_after_repeated_hard_failures() {
    let line = r#"{"tool":"web_search","args":{"query":"rust"},"error":"HTTP 503"}"#;
    let input = format!("{}\n", [line; 5].join("\n"));
    let out = selfheal(&["monitor"], &input);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let ls = lines(&out);
    assert_eq!(ls.len(), 5);
    assert_eq!(ls[0]["hidden_tools"], serde_json::json!([]));
    let signals = ls[4]["signals"].as_array().unwrap();
    assert!(signals.contains(&Value::from("circuit_open")), "{}", ls[4]);
    assert_eq!(ls[4]["hidden_tools"], serde_json::json!(["web_search"]));
}

#[test]
fn monitor_reports_a_bad_line_and_carries_on() {
    let good = r#"{"tool":"web_search","args":{"query":"rust"},"result":{"results":[1]}}"#;
    let input = format!("{good}\nnot json\n{good}\n");
    let out = selfheal(&["monitor"], &input);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let ls = lines(&out);
    assert_eq!(ls.len(), 3);
    assert_eq!(ls[0]["call"], 1);
    assert_eq!(ls[1]["line"], 2);
    assert!(
        ls[1]["error"].as_str().is_some_and(|e| !e.is_empty()),
        "{}",
        ls[1]
    );
    assert_eq!(ls[2]["call"], 2, "processing continues after the bad line");
    assert!(
        text(&out.stderr).contains("line 2"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn monitor_rejects_a_bad_config_with_exit_2() {
    let dir = temp_dir("monitor-config");
    let path = dir.join("bad.toml");
    std::fs::write(&path, "warn_after = \"three\"\n").unwrap();
    let out = selfheal(&["monitor", "--config", path.to_str().unwrap()], "");
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("bad.toml"),
        "{}",
        text(&out.stderr)
    );
    assert!(out.stdout.is_empty());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn demo_json_shows_the_monitor_never_costs_calls() {
    let out = selfheal(&["demo", "--json"], "");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let v: Value = serde_json::from_str(&text(&out.stdout)).unwrap();
    let scenarios = v.as_array().unwrap();
    assert_eq!(scenarios.len(), 3);
    for s in scenarios {
        let with = s["with"]["calls"].as_u64().unwrap();
        let without = s["without"]["calls"].as_u64().unwrap();
        assert!(with <= without, "{}: {with} > {without}", s["scenario"]);
    }
}

#[test]
fn bench_policy_runs_self_healing_under_another_policy_on_the_same_episodes() {
    let dir = temp_dir("policy");
    let give_up = dir.join("give-up.toml");
    std::fs::write(
        &give_up,
        "[ladders]\ntool_timeout = [\"degrade\"]\ntool_unavailable = [\"degrade\"]\n",
    )
    .unwrap();
    // Enough faults that outages occur in 20 episodes, and some are recovered by default.
    let tsr = |extra: &[&str]| -> f64 {
        let args = [
            SMALL,
            &[
                "--strategies",
                "self-healing",
                "--json",
                "--fault-rate",
                "0.3",
            ],
            extra,
        ]
        .concat();
        let out = selfheal(&args, "");
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        v["results"][0]["tsr"].as_f64().unwrap()
    };
    let default = tsr(&[]);
    let given_up = tsr(&["--policy", give_up.to_str().unwrap()]);
    assert!(
        given_up < default,
        "degrading at once on outages must cost tasks: {given_up} vs {default}"
    );

    let table = selfheal(
        &[
            SMALL,
            &[
                "--strategies",
                "self-healing",
                "--policy",
                give_up.to_str().unwrap(),
            ],
        ]
        .concat(),
        "",
    );
    assert!(text(&table.stdout).contains("custom policy"));

    let bad = dir.join("bad.toml");
    std::fs::write(
        &bad,
        "[ladders]\ntool_timeout = [\"terminate\", \"retry\"]\n",
    )
    .unwrap();
    let out = selfheal(&[SMALL, &["--policy", bad.to_str().unwrap()]].concat(), "");
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("can never be reached"),
        "{}",
        text(&out.stderr)
    );
}

/// `bench --gateway`: both rows on the same episodes, as a table and as JSON, and the options
/// it does not take refused.
#[cfg(feature = "gateway")]
#[test]
fn bench_gateway_prints_both_rows_on_the_same_episodes() {
    let args = ["bench", "--gateway", "--seeds", "1", "--tasks", "8"];
    let out = selfheal(&args, "");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let table = text(&out.stdout);
    assert!(table.contains("| self-healing |"), "{table}");
    assert!(table.contains("| self-healing via gateway |"), "{table}");
    let out = selfheal(&[&args[..], &["--json"]].concat(), "");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = v["results"].as_array().unwrap();
    assert_eq!(rows.len(), 2);
    assert!(rows.iter().all(|r| r["episodes"] == 8));
    assert_eq!(v["episodes"].as_array().map(Vec::len), Some(8));
    let out = selfheal(&[&args[..], &["--sweep"]].concat(), "");
    assert_eq!(out.status.code(), Some(2), "--sweep is not taken");
}

#[cfg(feature = "mcp")]
#[test]
fn mcp_answers_and_exits_when_the_server_dies_while_the_client_waits() {
    use std::io::{BufRead, BufReader};
    // The "server" reads one line and exits without answering; the client keeps its input open.
    let mut child = Command::new(env!("CARGO_BIN_EXE_selfheal"))
        .args([
            "mcp",
            "--no-trace",
            "--",
            "sh",
            "-c",
            "head -n 1 >/dev/null",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin
        .write_all(
            br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","arguments":{}}}"#,
        )
        .unwrap();
    stdin.write_all(b"\n").unwrap();
    stdin.flush().unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let answer: Value = serde_json::from_str(&line).unwrap();
    assert_eq!(answer["id"], 1);
    assert!(
        answer["error"]["message"]
            .as_str()
            .unwrap()
            .contains("exited")
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            assert!(status.success(), "{status}");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the proxy is still running with its client's input open"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    drop(stdin);
}

#[test]
fn bench_reads_fault_models_and_task_files_and_refuses_bad_ones_with_exit_2() {
    let dir = temp_dir("bench-files");
    // A model with one unrecoverable fault: no strategy may return a correct answer on a
    // faulted episode, and self-healing must not return a wrong one. The models' own mistakes
    // are switched off (`[model]`): a model that calls a sibling tool routes around the outage,
    // which is the model's doing, not the file's.
    let outage = dir.join("outage.toml");
    let perfect = "wrong_tool = 0\nwrong_arg = 0\nmissing_arg = 0\nskip_step = 0\nrepeat_step = 0\npremature_answer = 0\nreplan_failure = 0\n";
    std::fs::write(
        &outage,
        format!("[model.agent]\n{perfect}[model.fallback]\n{perfect}[[fault]]\nname = \"outage\"\nfamily = \"runtime\"\nweight = 1\ntarget = \"both\"\npermanent = 1.0\neffect = {{ kind = \"http\", status = 503, message = \"down\" }}\n"),
    )
    .unwrap();
    let args = [
        SMALL,
        &[
            "--faults",
            outage.to_str().unwrap(),
            "--fault-rate",
            "0.5",
            "--json",
        ],
    ]
    .concat();
    let out = selfheal(&args, "");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["config"]["fault_model_name"], "outage.toml");
    for r in v["results"].as_array().unwrap() {
        assert_eq!(r["rsr"], 0.0, "{r}");
    }
    let sh = v["details"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["strategy"] == "self-healing")
        .unwrap();
    assert_eq!(sh["silent_failures"], 0);

    let bad = dir.join("bad.toml");
    std::fs::write(&bad, "[[fault]]\nname = \"x\"\n").unwrap();
    let out = selfheal(&[SMALL, &["--faults", bad.to_str().unwrap()]].concat(), "");
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("--faults"),
        "{}",
        text(&out.stderr)
    );
    assert!(out.stdout.is_empty());

    let tasks = dir.join("tasks.jsonl");
    std::fs::write(
        &tasks,
        r#"{"id":"t","tools":[{"name":"a","parameters":{"type":"object","properties":{"q":{"type":"string"}},"required":["q"]},"output":{"v":"number"}}],"plan":[{"tool":"a","args":{"q":"x"},"label":"v1"}],"answer":"$v1.v$"}"#,
    )
    .unwrap();
    let out = selfheal(
        &[
            "bench",
            "--seeds",
            "1",
            "--tasks",
            tasks.to_str().unwrap(),
            "--json",
        ],
        "",
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["results"][0]["episodes"], 1);
    std::fs::write(&tasks, "{\"tools\": 3}\n").unwrap();
    let out = selfheal(&["bench", "--tasks", tasks.to_str().unwrap()], "");
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("line 1"),
        "{}",
        text(&out.stderr)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 12: `"result": null` was rejected as a missing result, though any JSON is a result.
#[test]
fn issue12_monitor_accepts_a_null_result() {
    let input = concat!(
        r#"{"tool":"lookup","args":{"key":"k"},"result":null}"#,
        "\n",
        r#"{"tool":"lookup","args":{"key":"k"}}"#,
        "\n"
    );
    let out = selfheal(&["monitor"], input);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let ls = lines(&out);
    assert_eq!(ls.len(), 2);
    assert_eq!(ls[0]["call"], 1, "{}", ls[0]);
    assert!(ls[0].get("error").is_none(), "{}", ls[0]);
    // A line with neither key is still refused.
    assert_eq!(ls[1]["line"], 2, "{}", ls[1]);
    assert!(
        ls[1]["error"]
            .as_str()
            .is_some_and(|e| e.contains("missing"))
    );
}

/// Issue 12: the top-level help described an older binary (no gateway, MCP proxy or trace).
#[test]
fn issue12_top_level_help_lists_every_command() {
    let out = selfheal(&["--help"], "");
    assert_eq!(out.status.code(), Some(0));
    let help = text(&out.stdout);
    let about = help.lines().next().unwrap_or("");
    for word in [
        "benchmark",
        "monitor",
        "repair",
        "gateway",
        "MCP proxy",
        "trace",
    ] {
        assert!(
            about.contains(word),
            "`{word}` not in the about line: {about}"
        );
    }
    for command in [
        "bench", "demo", "monitor", "repair", "serve", "mcp", "trace",
    ] {
        assert!(
            help.lines()
                .any(|l| l.trim_start().starts_with(&format!("{command} "))),
            "`{command}` not listed in\n{help}"
        );
    }
}

/// Issue 12: `trace list --trace-db TYPO` created an empty database at the typo.
#[cfg(any(feature = "gateway", feature = "mcp"))]
#[test]
fn issue12_trace_refuses_a_path_that_does_not_exist() {
    let dir = temp_dir("trace-missing");
    let path = dir.join("typo.db");
    for args in [
        ["trace", "list"].as_slice(),
        ["trace", "show", "r1"].as_slice(),
    ] {
        let mut args = args.to_vec();
        args.extend(["--trace-db", path.to_str().unwrap()]);
        let out = selfheal(&args, "");
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(
            text(&out.stderr).contains("no trace at"),
            "{}",
            text(&out.stderr)
        );
        assert!(!path.exists(), "{args:?} created {}", path.display());
    }
}

/// Issue 12: `trace list` printed raw Unix milliseconds and counted 0 actions for a run whose
/// `trace show` listed a repair and a re-ask.
#[cfg(any(feature = "gateway", feature = "mcp"))]
#[test]
fn issue12_trace_list_prints_local_times_and_counts_actions_like_show() {
    use selfheal_trace::{Kind, RunSummary, TraceEvent, TraceWriter};
    let dir = temp_dir("trace-list");
    let path = dir.join("trace.db");
    let writer = TraceWriter::open(&path).unwrap();
    // 2025-11-30T08:00:00.123Z
    for kind in [Kind::Request, Kind::Repair, Kind::Reask, Kind::Response] {
        writer.send(TraceEvent {
            run: "run-1".into(),
            t_ms: 1_764_489_600_123,
            kind,
            detail: serde_json::json!({}).into(),
            summary: (kind == Kind::Response).then(|| RunSummary {
                status: "complete".into(),
                failures: 0,
                actions: 0,
            }),
        });
    }
    writer.flush_and_close();
    let run = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_selfheal"))
            .args(args)
            .args(["--trace-db", path.to_str().unwrap()])
            .env("TZ", "XST-2")
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        text(&out.stdout)
    };
    let list = run(&["trace", "list"]);
    let row = list
        .lines()
        .find(|l| l.starts_with("run-1"))
        .unwrap_or_else(|| panic!("no run-1 in\n{list}"));
    let cols: Vec<&str> = row.split_whitespace().collect();
    // run, requests, events, failures, actions, status, last seen
    assert_eq!(cols[4], "2", "{row}");
    assert_eq!(cols[6], "2025-11-30T10:00:00.123+02:00", "{row}");
    let show = run(&["trace", "show", "run-1"]);
    let marked = show.lines().filter(|l| l.contains(" * ")).count();
    assert_eq!(marked, 2, "{show}");
    assert!(show.starts_with("2025-11-30T10:00:00.123+02:00"), "{show}");
}

/// Issue 11: `trace replay` makes a `bench --trace` run's decisions again. Under the policy the
/// run used nothing differs (exit 0); under one that only degrades, every recovery does (exit 3).
#[cfg(any(feature = "gateway", feature = "mcp"))]
#[test]
fn trace_replay_remakes_bench_decisions_and_finds_a_policy_change() {
    let dir = temp_dir("trace-replay");
    let path = dir.join("trace.jsonl");
    let out = selfheal(
        &[
            SMALL,
            &[
                "--strategies",
                "self-healing",
                "--fault-rate",
                "0.3",
                "--trace",
                path.to_str().unwrap(),
            ],
        ]
        .concat(),
        "",
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let replay = |extra: &[&str]| {
        selfheal(
            &[
                &[
                    "trace",
                    "replay",
                    "--json",
                    "--jsonl",
                    path.to_str().unwrap(),
                ],
                extra,
            ]
            .concat(),
            "",
        )
    };
    // The policy the run used: the default, its actions per failure capped at R = 5 by the
    // benchmark.
    let used = dir.join("used.toml");
    std::fs::write(&used, "max_actions_per_failure = 5\n").unwrap();
    let same = replay(&["--policy", used.to_str().unwrap()]);
    assert_eq!(same.status.code(), Some(0), "{}", text(&same.stderr));
    let v: Value = serde_json::from_slice(&same.stdout).unwrap();
    assert!(v["decisions"].as_u64().unwrap() > 0, "{v}");
    assert_eq!(v["differing"], 0, "{v}");

    let degrade = dir.join("degrade.toml");
    let classes = [
        "tool_timeout",
        "tool_unavailable",
        "argument_invalid",
        "malformed_output",
        "empty_output",
        "wrong_tool",
        "stale_context",
        "contradictory_evidence",
        "planning_failure",
        "verification_failure",
        "control_loop",
    ];
    let ladders: String = classes
        .iter()
        .map(|c| format!("{c} = [\"degrade\"]\n"))
        .collect();
    std::fs::write(&degrade, format!("[ladders]\n{ladders}")).unwrap();
    let other = replay(&["--policy", degrade.to_str().unwrap()]);
    assert_eq!(other.status.code(), Some(3), "{}", text(&other.stderr));
    let v: Value = serde_json::from_slice(&other.stdout).unwrap();
    // Degrade, or terminate where nothing partial was produced yet.
    let first = &v["runs"][0]["decisions"][0];
    let stop = first["replayed"]["action"].as_str().unwrap();
    assert!(matches!(stop, "degrade" | "terminate"), "{first}");
    assert_eq!(first["differs"], first["recorded"]["action"] != stop);
    assert!(v["differing"].as_u64().unwrap() > 0, "{v}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The subcommand names listed under `Commands:` in a `--help` text (without `help`).
#[cfg(all(feature = "gateway", feature = "mcp", feature = "live"))]
fn subcommands(help: &str) -> Vec<String> {
    help.lines()
        .skip_while(|l| l.trim() != "Commands:")
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .filter(|l| l.starts_with("  ") && !l.starts_with("   "))
        .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
        .filter(|name| name != "help")
        .collect()
}

/// Every command's `--help`, in order, as the Markdown of `docs/reference/cli.md`.
#[cfg(all(feature = "gateway", feature = "mcp", feature = "live"))]
fn cli_reference() -> String {
    let mut md = String::from(
        "# CLI reference\n\n\
         <!-- Generated from the binary's own `--help`; do not edit by hand. Regenerate with\n     \
         SELFHEAL_BLESS=1 cargo test -p selfheal-cli --test cli cli_reference -->\n\n\
         Every `selfheal` command's `--help`, exactly as the full binary prints it. A test\n\
         (`cli_reference_is_the_help_of_every_command` in `crates/selfheal-cli/tests/cli.rs`)\n\
         fails when this page and the binary disagree.\n",
    );
    let mut queue: Vec<Vec<String>> = vec![vec![]];
    while let Some(path) = queue.pop() {
        let mut args: Vec<&str> = path.iter().map(String::as_str).collect();
        args.push("--help");
        let out = selfheal(&args, "");
        assert!(
            out.status.success(),
            "selfheal {args:?}: {}",
            text(&out.stderr)
        );
        let help = text(&out.stdout);
        let title = if path.is_empty() {
            "selfheal".to_owned()
        } else {
            format!("selfheal {}", path.join(" "))
        };
        md.push_str(&format!(
            "\n## `{title}`\n\n```text\n{}\n```\n",
            help.trim_end()
        ));
        let mut children: Vec<Vec<String>> = subcommands(&help)
            .into_iter()
            .map(|c| {
                let mut p = path.clone();
                p.push(c);
                p
            })
            .collect();
        children.reverse();
        queue.extend(children);
    }
    md
}

/// `docs/reference/cli.md` is the help of every command, so it cannot drift from the binary; and
/// every command's help carries an example.
#[cfg(all(feature = "gateway", feature = "mcp", feature = "live"))]
#[test]
fn cli_reference_is_the_help_of_every_command() {
    let md = cli_reference();
    let sections: Vec<&str> = md.split("\n## `").skip(1).collect();
    assert!(
        sections.len() >= 10,
        "too few commands found: {}",
        sections.len()
    );
    for section in &sections {
        assert!(
            section.contains("EXAMPLE"),
            "no example in the help of `{section}"
        );
    }
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/reference/cli.md");
    if std::env::var_os("SELFHEAL_BLESS").is_some() {
        std::fs::write(&path, &md).unwrap();
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == md,
        "docs/reference/cli.md differs from the binary's --help; regenerate it with \
         SELFHEAL_BLESS=1 cargo test -p selfheal-cli --test cli cli_reference"
    );
}

/// A config file that does not read is named in the error, with the place and the keys allowed.
#[cfg(feature = "gateway")]
#[test]
fn a_bad_serve_config_names_its_file() {
    let dir = temp_dir("bad-config");
    let path = dir.join("gateway.toml");
    std::fs::write(&path, "bogus = 1\n").unwrap();
    let out = selfheal(&["serve", "--config", path.to_str().unwrap()], "");
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains(path.to_str().unwrap()), "{err}");
    assert!(err.contains("line 1, column 1"), "{err}");
    assert!(err.contains("`upstreams`"), "{err}");
}
