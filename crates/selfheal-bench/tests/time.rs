//! Issue 32: faults in time — windows on the benchmark's clock, transient faults that clear after
//! a duration (so waiting is a real choice), `onset` on model-side faults, and faults aimed at a
//! step position. Mechanics of the world, not scores.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use selfheal_bench::{BenchConfig, TaskSet, schedules};
use selfheal_bench::{EPISODE_SPACING_MS, Episode, Purpose, Response, Writer, Written};
use selfheal_bench::{FaultModel, Injected, ModelRates};
use selfheal_bench::{builtin, resolve_args};

fn model(fault: &str) -> FaultModel {
    let mut m = FaultModel::from_toml_str(&format!("[[fault]]\n{fault}")).unwrap();
    m.model = ModelRates::PERFECT;
    m
}

fn raised(ep: &mut Episode<'_>, s: usize, tool: &str, args: &serde_json::Value) -> bool {
    matches!(
        ep.call(s, tool, args, Purpose::Step, false).response,
        Response::Raised { .. }
    )
}

#[test]
fn a_fault_that_clears_by_time_clears_for_waiting_not_for_retrying() {
    let m = model(
        "name = \"blip\"\nfamily = \"runtime\"\nweight = 1\ntarget = \"primary\"\n\
         effect = { kind = \"http\", status = 503, message = \"503\", retry_after_ms = 5000 }\n\
         transient_k = [1, 1]\nclears_after_ms = [5000, 5000]",
    );
    let task = &builtin(1)[0];
    let f = Injected {
        step: 0,
        spec: 0,
        permanent: false,
        k: 1,
        skew: 0.0,
    };
    let mut ep = Episode::new(task, &[f], &m, 1);
    let tool = task.plan.steps[0].tool.clone();
    let args = resolve_args(&task.plan, 0, &[]).unwrap();
    // Ten quick retries all meet it (by attempts it would have cleared after one).
    assert!((0..10).all(|_| raised(&mut ep, 0, &tool, &args)));
    ep.wait(5_000);
    assert!(!raised(&mut ep, 0, &tool, &args));
}

#[test]
fn a_window_strikes_the_episodes_running_inside_it_and_ends() {
    let m = model(
        "name = \"outage\"\nfamily = \"runtime\"\nweight = 1\ntarget = \"both\"\n\
         effect = { kind = \"http\", status = 503, message = \"503 provider down\" }\n\
         window = { start_ms = 0, end_ms = 150000 }",
    );
    let config = BenchConfig {
        seeds: 1,
        tasks: 5,
        fault_rate: 0.0,
        task_set: TaskSet::builtin(),
        fault_model: m.clone(),
        ..BenchConfig::default()
    };
    // Episodes start a minute apart: the first three start inside the window, whatever the
    // fault rate (a window is not drawn per step).
    assert_eq!(EPISODE_SPACING_MS, 60_000);
    let hit: Vec<bool> = schedules(&config)[0]
        .iter()
        .map(|f| !f.is_empty())
        .collect();
    assert_eq!(hit, [true, true, true, false, false]);
    let task = &builtin(1)[0];
    let faults = &schedules(&config)[0][0];
    let mut ep = Episode::new(task, faults, &m, 1);
    ep.start_at(0);
    let args = resolve_args(&task.plan, 0, &[]).unwrap();
    let tool = task.plan.steps[0].tool.clone();
    let sub = task.plan.steps[0].tool.clone();
    let sub = task.plan.tool(&sub).unwrap().substitute.clone().unwrap();
    // Primary and substitute alike, on every step the fault applies to, until the window ends.
    assert!(raised(&mut ep, 0, &tool, &args));
    assert!(raised(&mut ep, 0, &sub, &args));
    ep.wait(150_000);
    assert!(!raised(&mut ep, 0, &tool, &args));
}

#[test]
fn onset_holds_for_model_side_faults_and_at_aims_at_a_position() {
    let m = model(
        "name = \"late_wrong_tool\"\nfamily = \"agent\"\nweight = 1\ntarget = \"agent\"\n\
         permanent = 1.0\nonset = 1\neffect = { kind = \"wrong_tool\", op = \"unknown\" }",
    );
    let task = &builtin(1)[0];
    let f = Injected {
        step: 0,
        spec: 0,
        permanent: true,
        k: 1,
        skew: 0.0,
    };
    let mut ep = Episode::new(task, &[f], &m, 1);
    let plan_tool = task.plan.steps[0].tool.clone();
    // No successful call yet: the fault is not armed, and the model writes the step's tool.
    let w = ep.write(0, Writer::Agent, true, &[]);
    assert!(
        matches!(&w, Written::Call { tool, .. } if *tool == plan_tool),
        "{w:?}"
    );
    let Written::Call { args, .. } = w else {
        unreachable!()
    };
    assert!(!raised(&mut ep, 0, &plan_tool, &args));
    // One success later it is.
    let w = ep.write(0, Writer::Agent, true, &[]);
    assert!(
        matches!(&w, Written::Call { tool, .. } if *tool != plan_tool),
        "{w:?}"
    );

    let last = model(
        "name = \"x\"\nfamily = \"runtime\"\nweight = 1\ntarget = \"primary\"\nat = \"last\"\n\
         effect = { kind = \"timeout\" }",
    );
    let third = model(
        "name = \"x\"\nfamily = \"runtime\"\nweight = 1\ntarget = \"agent\"\nat = 2\n\
         effect = { kind = \"wrong_tool\", op = \"unknown\" }",
    );
    for t in builtin(20) {
        let n = t.plan.steps.len();
        for s in 0..n {
            let external = t.plan.step_tool(s).unwrap().external;
            assert_eq!(last.faults[0].applies(&t, s), s + 1 == n && external);
            assert_eq!(third.faults[0].applies(&t, s), s == 2);
        }
    }
}

/// Issue 32: in a deployment a tool broken for good stays broken for every later episode of the
/// seed that calls it; without one, each episode draws its own faults. The strategies that run
/// the core's controller carry its trust store across episodes (issue 33), and the report says
/// which.
#[test]
fn a_deployment_keeps_broken_tools_broken() {
    let m = model(
        "name = \"down\"\nfamily = \"runtime\"\nweight = 1\ntarget = \"primary\"\npermanent = 1.0\n\
         effect = { kind = \"http\", status = 503, message = \"503\" }",
    );
    let base = BenchConfig {
        seeds: 1,
        tasks: 30,
        fault_rate: 0.05,
        fault_model: m,
        ..BenchConfig::default()
    };
    let deployed = BenchConfig {
        deployment: true,
        ..base.clone()
    };
    let (a, b) = (&schedules(&base)[0], &schedules(&deployed)[0]);
    let tasks = builtin(30);
    let count = |s: &[Vec<Injected>]| s.iter().map(Vec::len).sum::<usize>();
    assert!(count(b) > count(a), "{} vs {}", count(b), count(a));
    // Every fault of the independent schedule is still there; each added one sits on a tool an
    // earlier episode broke.
    for (ti, (x, y)) in a.iter().zip(b).enumerate() {
        assert!(x.iter().all(|f| y.contains(f)));
        for f in y.iter().filter(|f| !x.contains(f)) {
            let tool = &tasks[ti].plan.steps[f.step].tool;
            let earlier = (0..ti).any(|tj| {
                b[tj]
                    .iter()
                    .any(|g| g.permanent && tasks[tj].plan.steps[g.step].tool == *tool)
            });
            assert!(earlier, "task {ti} step {} inherited from nowhere", f.step);
        }
    }
    let report = selfheal_bench::run(&deployed, &mut |_, _| {}, None);
    let text = selfheal_bench::report_table(&report);
    assert!(
        text.contains("strategies carrying memory across episodes: class-agnostic, self-healing"),
        "{text}"
    );
}

/// Issue 32, correlated faults: a provider-wide outage (`provider_wide = true` on a window)
/// takes the agent's own model with the tools — every call it writes inside the window raises —
/// while the fallback model, another provider's, stays up; without the key the model is not
/// behind the window (the behaviour before the key existed).
#[test]
fn a_provider_wide_outage_takes_the_agents_model_and_the_tools_behind_it() {
    let fault = |wide: &str| {
        model(&format!(
            "name = \"outage\"\nfamily = \"runtime\"\nweight = 1\ntarget = \"both\"\n\
             effect = {{ kind = \"http\", status = 503, message = \"503 provider down\", retry_after_ms = 1000 }}\n\
             window = {{ start_ms = 0, end_ms = 150000 }}\n{wide}"
        ))
    };
    let (wide, narrow) = (fault("provider_wide = true"), fault(""));
    let config = |m: &FaultModel| BenchConfig {
        seeds: 1,
        tasks: 1,
        fault_rate: 0.0,
        task_set: TaskSet::builtin(),
        fault_model: m.clone(),
        ..BenchConfig::default()
    };
    let task = &builtin(1)[0];
    let tool = task.plan.steps[0].tool.clone();
    let args = resolve_args(&task.plan, 0, &[]).unwrap();
    let faults = &schedules(&config(&wide))[0][0];
    let mut ep = Episode::new(task, faults, &wide, 1);
    ep.start_at(0);
    let w = ep.write(0, Writer::Agent, true, &[]);
    assert!(
        matches!(
            &w,
            Written::Unavailable {
                status: Some(503),
                retry_after_ms: Some(1000),
                ..
            }
        ),
        "{w:?}"
    );
    // The tools are down too, the fallback model is not.
    assert!(raised(&mut ep, 0, &tool, &args));
    assert!(matches!(
        ep.write(0, Writer::Fallback, true, &[]),
        Written::Call { .. }
    ));
    // After the window the model writes again.
    ep.wait(150_000);
    assert!(matches!(
        ep.write(0, Writer::Agent, true, &[]),
        Written::Call { .. }
    ));

    let faults = &schedules(&config(&narrow))[0][0];
    let mut ep = Episode::new(task, faults, &narrow, 1);
    ep.start_at(0);
    assert!(matches!(
        ep.write(0, Writer::Agent, true, &[]),
        Written::Call { .. }
    ));
    assert!(raised(&mut ep, 0, &tool, &args));

    // Every external tool is behind the provider, those with no substitute too; a local tool is
    // not, and the key is refused where it cannot mean an outage.
    for t in builtin(100) {
        for s in 0..t.plan.steps.len() {
            let spec = t.plan.step_tool(s).unwrap();
            assert_eq!(wide.faults[0].applies(&t, s), spec.external);
            assert_eq!(
                narrow.faults[0].applies(&t, s),
                spec.external && spec.substitute.is_some()
            );
        }
    }
    for bad in [
        "target = \"primary\"\neffect = { kind = \"http\", status = 503, message = \"x\" }",
        "target = \"both\"\nwindow = { start_ms = 0, end_ms = 10 }\neffect = { kind = \"skew\", range = [0.1, 0.2] }",
        "target = \"local\"\nwindow = { start_ms = 0, end_ms = 10 }\neffect = { kind = \"timeout\" }",
    ] {
        let e = FaultModel::from_toml_str(&format!(
            "[[fault]]\nname = \"x\"\nfamily = \"runtime\"\nweight = 1\nprovider_wide = true\n{bad}"
        ))
        .unwrap_err()
        .to_string();
        assert!(e.contains("provider_wide"), "{bad}: {e}");
    }

    // Over whole episodes inside the window: without the model no strategy gets a call out
    // with it, and self-healing reaches the fallback model; with the narrow outage it never
    // needs to escalate for the model.
    let run = |m: &FaultModel| {
        let c = BenchConfig {
            seeds: 1,
            tasks: 2,
            strategies: vec![
                selfheal_bench::Strategy::Static,
                selfheal_bench::Strategy::SelfHealing,
            ],
            ..config(m)
        };
        selfheal_bench::run(&c, &mut |_, _| {}, None)
    };
    let (w, n) = (run(&wide), run(&narrow));
    let esc = |r: &selfheal_bench::Report, s: &str| {
        r.details
            .iter()
            .find(|d| d.strategy == s)
            .unwrap()
            .escalated_calls
    };
    let tools = |r: &selfheal_bench::Report, s: &str| {
        r.details
            .iter()
            .find(|d| d.strategy == s)
            .unwrap()
            .tool_calls
    };
    assert_eq!(tools(&w, "static"), 0.0, "static's first model call fails");
    assert!(tools(&n, "static") > 0.0);
    assert!(esc(&w, "self-healing") > esc(&n, "self-healing"));
}
