//! Tasks as data: the shipped NESTFUL conversion loads and runs end to end, and bad files are
//! refused with the line and the reason.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use selfheal_bench::Strategy;
use selfheal_bench::load_jsonl;
use selfheal_bench::{BenchConfig, TaskSet, run};

const NESTFUL: &str = include_str!("../../../data/nestful.jsonl");

#[test]
fn the_nestful_set_loads_and_runs() {
    let tasks = load_jsonl(NESTFUL).unwrap();
    assert_eq!(tasks.len(), 85);
    // Nested references: some step reads a field of an earlier step's output.
    assert!(
        tasks
            .iter()
            .any(|t| t.plan.steps.iter().any(|s| s.args.iter().any(
                |(_, a)| matches!(a, selfheal_bench::ArgSrc::Ref { path, .. } if path.contains('.'))
            )))
    );
    let mut fault_model = selfheal_bench::FaultModel::default_model().unwrap();
    fault_model.model = selfheal_bench::ModelRates::PERFECT;
    let config = BenchConfig {
        seeds: 1,
        tasks: 85,
        fault_rate: 0.2,
        task_set: TaskSet {
            name: "nestful".into(),
            tasks,
        },
        strategies: vec![Strategy::Static, Strategy::SelfHealing],
        fault_model,
        ..BenchConfig::default()
    };
    config.validate().unwrap();
    let report = run(&config, &mut |_, _| {}, None);
    assert_eq!(report.results.len(), 2);
    assert!(report.census.faulted_episodes > 0);
    // With a model that never errs on its own, unfaulted episodes succeed for every strategy:
    // the simulated world answers its own plan, and nothing in the prompt-grounded checks
    // refuses a right call.
    for d in &report.details {
        assert_eq!(d.successes - d.recovered, 85 - d.faulted, "{}", d.strategy);
    }
}

#[test]
fn bad_task_files_are_refused_with_line_and_reason() {
    let tool = r#"{"name":"a","parameters":{"type":"object","properties":{"q":{"type":"string"}},"required":["q"]},"output":{"v":"number"}}"#;
    let good = format!(
        r#"{{"id":"t","tools":[{tool}],"plan":[{{"tool":"a","args":{{"q":"x"}},"label":"v1"}}],"answer":"$v1.v$"}}"#
    );
    assert_eq!(load_jsonl(&good).unwrap().len(), 1);
    let cases = [
        ("{not json".to_owned(), "not JSON"),
        (
            good.replace(r#""tool":"a""#, r#""tool":"b""#),
            "not in `tools`",
        ),
        (good.replace("$v1.v$", "$v2.v$"), "unknown label"),
        (
            good.replace(r#""q":"x""#, r#""r":"x""#),
            "fails without faults",
        ),
        (
            good.replace(r#""answer":"$v1.v$""#, r#""answer":"$v1.v$","expected":1"#),
            "differs",
        ),
        (String::new(), "no task"),
    ];
    for (text, needle) in cases {
        let e = load_jsonl(&text).unwrap_err().to_string();
        assert!(e.contains(needle), "{text:?}: {e}");
    }
}

/// A tool with no equivalent source is checked by a second read (a real, charged call): a wrong
/// value that does not last is caught by every strategy with the verifier, one the tool repeats
/// is caught by none. Properties of the verifier, not a score.
#[test]
fn a_tool_without_a_substitute_is_read_twice_by_the_verifier() {
    use selfheal_bench::Episode;
    use selfheal_bench::{FaultModel, Injected};
    let tool = r#"{"name":"a","parameters":{"type":"object","properties":{"q":{"type":"string"}},"required":["q"]},"output":{"v":"number"}}"#;
    let file = format!(
        r#"{{"id":"t","tools":[{tool}],"plan":[{{"tool":"a","args":{{"q":"x"}},"label":"v1"}}],"answer":"$v1.v$"}}"#
    );
    let task = &load_jsonl(&file).unwrap()[0];
    let model = FaultModel::default_model().unwrap();
    let spec = model
        .faults
        .iter()
        .position(|f| f.name == "plausible_wrong")
        .unwrap();
    let skew = |permanent| Injected {
        step: 0,
        spec,
        permanent,
        k: 1,
        skew: 0.05,
    };
    let play = |s: Strategy, f: Injected| {
        let mut ep = Episode::new(task, &[f], &model, 7);
        let ended = s.run(&mut ep, 5, None, 7, false);
        let right = ended
            .answer
            .as_ref()
            .map(|a| selfheal_bench::ANSWER_TOLERANCE.agrees(a, &task.expected));
        (right, ep.costs().verifier_calls)
    };
    for s in [
        Strategy::ReactVerify,
        Strategy::FullReplanVerify,
        Strategy::SelfHealing,
    ] {
        let (right, checks) = play(s, skew(false));
        assert_eq!(right, Some(true), "{s:?}: a wrong first read is caught");
        assert!(checks >= 2, "{s:?}: {checks} second reads");
        assert_eq!(
            play(s, skew(true)).0,
            Some(false),
            "{s:?}: a repeated one is not"
        );
    }
    for s in [Strategy::Static, Strategy::React, Strategy::FullReplan] {
        let (right, checks) = play(s, skew(false));
        assert_eq!((right, checks), (Some(false), 0), "{s:?} reads once");
    }
}

/// A task of two single-source steps, `a` then `b` on `a`'s value, whose answer is `b`'s value.
fn two_step_task() -> selfheal_bench::TaskSpec {
    let tool = |name: &str, arg: &str| {
        format!(
            r#"{{"name":"{name}","parameters":{{"type":"object","properties":{{"{arg}":{{"type":"string"}}}},"required":["{arg}"]}},"output":{{"v":"number"}}}}"#
        )
    };
    let file = format!(
        r#"{{"id":"t","tools":[{},{}],"plan":[{{"tool":"a","args":{{"q":"x"}},"label":"v1"}},{{"tool":"b","args":{{"x":"$v1.v$"}},"label":"v2"}}],"answer":"$v2.v$"}}"#,
        tool("a", "q"),
        tool("b", "x")
    );
    load_jsonl(&file).unwrap().remove(0)
}

/// Before answering a run that needed recovery, self-healing reads once more the values only a
/// second read of their own source confirmed: a wrong value that outlasted two reads and came
/// before a failure is caught; on a run with no failure nothing is read again.
#[test]
fn after_a_recovery_single_source_values_are_read_once_more() {
    use selfheal_bench::Episode;
    use selfheal_bench::{FaultModel, Injected};
    let task = &two_step_task();
    let model = FaultModel::default_model().unwrap();
    let spec = |name: &str| model.faults.iter().position(|f| f.name == name).unwrap();
    let wrong_twice = Injected {
        step: 0,
        spec: spec("plausible_wrong"),
        permanent: false,
        k: 2,
        skew: 0.05,
    };
    let timeout = Injected {
        step: 1,
        spec: spec("timeout"),
        permanent: false,
        k: 1,
        skew: 0.0,
    };
    let play = |s: Strategy, faults: &[Injected]| {
        let mut ep = Episode::new(task, faults, &model, 7);
        let ended = s.run(&mut ep, 5, None, 7, false);
        ended
            .answer
            .as_ref()
            .map(|a| selfheal_bench::ANSWER_TOLERANCE.agrees(a, &task.expected))
    };
    assert_eq!(
        play(Strategy::SelfHealing, &[wrong_twice, timeout]),
        Some(true)
    );
    // Two reads in a row agree on the wrong value, and nothing went wrong that would call for a
    // third: the value is returned, as by every strategy that reads twice.
    assert_eq!(play(Strategy::SelfHealing, &[wrong_twice]), Some(false));
    assert_eq!(
        play(Strategy::ReactVerify, &[wrong_twice, timeout]),
        Some(false)
    );
}

/// The read before answering reads each value `reread_reads` times: a wrong value that lasts
/// three reads (the step's, the cross-check's and the first re-read) is caught by the second
/// re-read, which the default makes, and returned when the policy reads once.
#[test]
fn a_wrong_value_that_outlasts_one_reread_is_caught_by_the_next() {
    use selfheal_bench::Episode;
    use selfheal_bench::{FaultModel, Injected};
    use selfheal_core::Policy;
    let task = &two_step_task();
    let model = FaultModel::default_model().unwrap();
    let spec = |name: &str| model.faults.iter().position(|f| f.name == name).unwrap();
    let faults = [
        Injected {
            step: 0,
            spec: spec("plausible_wrong"),
            permanent: false,
            k: 3,
            skew: 0.05,
        },
        Injected {
            step: 1,
            spec: spec("timeout"),
            permanent: false,
            k: 1,
            skew: 0.0,
        },
    ];
    let play = |policy: &Policy| {
        let mut ep = Episode::new(task, &faults, &model, 7);
        let ended = Strategy::SelfHealing.run(&mut ep, 5, Some(policy), 7, false);
        let right = ended
            .answer
            .as_ref()
            .map(|a| selfheal_bench::ANSWER_TOLERANCE.agrees(a, &task.expected));
        (right, ep.costs().verifier_calls)
    };
    let (right, twice) = play(&Policy::default());
    assert_eq!(
        right,
        Some(true),
        "the second re-read sees the value change"
    );
    let once = Policy::from_toml_str("reread_reads = 1").unwrap();
    let (right, checks) = play(&once);
    assert_eq!(
        right,
        Some(false),
        "one re-read agrees with the wrong value"
    );
    assert!(twice > checks, "{twice} reads against {checks}");
}

/// Issue 32: a plan that reads a status twice in a row makes the same call twice on purpose; on
/// a fault-free run with a model that never errs, no strategy takes it for a loop, every one
/// answers, and no detector fires (the per-detector false-alarm count is what says so).
#[test]
fn a_status_read_twice_is_not_a_loop() {
    let line = r#"{"id": "twice", "prompt": "Check the status of job j42 twice and report the second reading.", "tools": [{"name": "status", "parameters": {"type": "object", "properties": {"job": {"type": "string"}}, "required": ["job"]}, "output": {"state": "string"}}], "plan": [{"tool": "status", "args": {"job": "j42"}, "label": "var1"}, {"tool": "status", "args": {"job": "j42"}, "label": "var2"}], "answer": "$var2.state$"}"#;
    let tasks = load_jsonl(line).unwrap();
    let mut fault_model = selfheal_bench::FaultModel::default_model().unwrap();
    fault_model.model = selfheal_bench::ModelRates::PERFECT;
    let config = BenchConfig {
        seeds: 2,
        tasks: 1,
        fault_rate: 0.0,
        task_set: TaskSet {
            name: "twice".into(),
            tasks,
        },
        fault_model,
        ..BenchConfig::default()
    };
    let report = run(&config, &mut |_, _| {}, None);
    for d in &report.details {
        assert_eq!(d.clean_episodes, 2, "{}", d.strategy);
        assert_eq!(d.successes, 2, "{}", d.strategy);
        assert!(
            d.false_alarms_clean.is_empty(),
            "{}: {:?}",
            d.strategy,
            d.false_alarms_clean
        );
    }
}

/// Issue 32: tools with real semantics. The built-in comparison tasks (a DAG: two chains joined
/// by `calc.compare`) answer with the comparison of the two prices the plan fetches, and both
/// answers occur; a file's `"semantics": "add"` adds and `"greater"` compares what it is given.
#[test]
fn comparisons_compare_and_arithmetic_computes() {
    use selfheal_bench::{ArgSrc, builtin, resolve_args};
    let tasks = builtin(100);
    let compare: Vec<_> = tasks
        .iter()
        .filter(|t| t.name == "compare-share-prices")
        .collect();
    assert_eq!(compare.len(), 16);
    let mut seen = std::collections::BTreeSet::new();
    for t in &compare {
        // Fan-in: the last step reads two different earlier steps.
        let reads: Vec<usize> = t.plan.steps[4]
            .args
            .iter()
            .filter_map(|(_, a)| match a {
                ArgSrc::Ref { step, .. } => Some(*step),
                _ => None,
            })
            .collect();
        assert_eq!(reads, [1, 3]);
        seen.insert(t.expected.as_bool().unwrap());
    }
    assert_eq!(seen.len(), 2, "every comparison came out the same way");

    let tool = |name: &str, sem: &str, out: &str| {
        format!(
            r#"{{"name":"{name}","semantics":"{sem}","external":false,"parameters":{{"type":"object","properties":{{"a":{{"type":"number"}},"b":{{"type":"number"}}}},"required":["a","b"]}},"output":{{"{out}":"number"}}}}"#
        )
    };
    let line = format!(
        r#"{{"id":"sum","prompt":"Is 2.5 + 4 more than 6?","tools":[{},{}],"plan":[{{"tool":"add","args":{{"a":2.5,"b":4}},"label":"var1"}},{{"tool":"gt","args":{{"a":"$var1.value$","b":6}},"label":"var2"}}],"answer":{{"sum":"$var1.value$","more":"$var2.greater$"}}}}"#,
        tool("add", "add", "value"),
        tool("gt", "greater", "greater").replace(r#""greater":"number""#, r#""greater":"boolean""#)
    );
    let t = &load_jsonl(&line).unwrap()[0];
    assert_eq!(t.expected["sum"], 6.5);
    assert_eq!(t.expected["more"], true);
    assert!(resolve_args(&t.plan, 0, &[]).is_ok());
    let bad = line.replace(r#""semantics":"add""#, r#""semantics":"pow""#);
    assert!(load_jsonl(&bad).is_err_and(|e| e.message.contains("semantics")));
}

/// Issue 32, item 2: every task offers more tools than its plan uses — for each tool a step
/// calls (but the built-in `calc.compare`), a sibling on offer that takes the same arguments,
/// and a tool no step calls that is not
/// a sibling nor a substitute of one (an unrelated tool) — in the built-in set and in NESTFUL,
/// whose source file offers only the tools its plans call (the loader adds the rest).
#[test]
fn every_task_offers_siblings_and_unrelated_tools() {
    let check = |set: &str, tasks: &[selfheal_bench::TaskSpec]| {
        for t in tasks {
            let plan = &t.plan;
            let used: Vec<&str> = plan.steps.iter().map(|s| s.tool.as_str()).collect();
            let mut related: Vec<&str> = used.clone();
            // The built-in comparison's calculator is the one step tool without a sibling.
            for name in used.iter().filter(|n| **n != "calc.compare") {
                let tool = plan.tool(name).unwrap();
                let sibling = tool
                    .sibling
                    .as_deref()
                    .unwrap_or_else(|| panic!("{set} task {}: `{name}` has no sibling", t.id));
                let offered = plan
                    .tool(sibling)
                    .unwrap_or_else(|| panic!("{set} task {}: `{sibling}` not on offer", t.id));
                let params = |x: &selfheal_bench::ToolSpec| {
                    x.params.iter().map(|p| p.name.clone()).collect::<Vec<_>>()
                };
                assert_eq!(params(offered), params(tool), "{set} task {}", t.id);
                related.push(sibling);
                related.extend(tool.substitute.as_deref());
            }
            assert!(
                plan.tools
                    .iter()
                    .any(|x| !related.contains(&x.name.as_str())),
                "{set} task {} offers no unrelated tool",
                t.id
            );
        }
    };
    check("built-in", &selfheal_bench::builtin(100));
    check("NESTFUL", &load_jsonl(NESTFUL).unwrap());
    // The source file itself offers no tool its plan does not call.
    for line in NESTFUL.lines().filter(|l| !l.trim().is_empty()) {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        let called: Vec<&str> = v["plan"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["tool"].as_str().unwrap())
            .collect();
        assert!(
            v["tools"]
                .as_array()
                .unwrap()
                .iter()
                .all(|t| called.contains(&t["name"].as_str().unwrap()))
        );
    }
}
