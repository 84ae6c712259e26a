//! What deciding through the one `Run` costs a front-end per upstream call: a call begun and
//! answered the first time (the common case), and a call that fails once with a 503 and falls
//! back. (The bare call plan it replaced in the gateway is a private part of the run since the
//! core's API was curated, so it is no longer measured on its own.) Also the size and
//! the round trip of a run's state through bytes, what a shared store pays per request.
//!
//! Run with `cargo bench -p selfheal-core --bench run`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};

use selfheal_core::{
    BreakerConfig, Breakers, BudgetLimits, CallMode, ControllerConfig, Env, Input, Run, Signal,
    SplitMix64,
};

fn breakers() -> Breakers {
    Breakers::new(
        BreakerConfig {
            after: 5,
            cooldown_calls: 0,
            cooldown_ms: 30_000,
        },
        ["main".to_owned(), "backup".to_owned()],
    )
}

fn targets() -> Vec<String> {
    vec!["main".to_owned(), "backup".to_owned()]
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("one upstream call");
    g.bench_function("run, answered", |b| {
        let mut br = breakers();
        let mut rng = SplitMix64::new(1);
        let mut run = Run::new(ControllerConfig::default()).unwrap();
        let mut id = 0;
        b.iter(|| {
            id += 1;
            let mut env = Env {
                now_ms: 0,
                rng: &mut rng,
                breakers: &mut br,
            };
            let start = Input::CallStarted {
                call: id,
                targets: targets(),
                mode: CallMode::Heal,
                retry_safe: true,
            };
            black_box(run.decide(start, &mut env));
            black_box(run.decide(Input::AttemptSucceeded { call: id }, &mut env));
            black_box(run.take_call_events(id));
            black_box(run.take_records());
        });
    });
    let busy = Signal::HttpStatus {
        status: 503,
        retry_after_ms: None,
        message: String::new(),
    };
    g.bench_function("run, one 503 then answered", |b| {
        let mut rng = SplitMix64::new(1);
        // One run for every call (as a conversation's requests share theirs), with a ledger
        // that does not run out, so each iteration decides the same first failure.
        let mut run = Run::new(ControllerConfig {
            budget: BudgetLimits::unlimited(),
            ..ControllerConfig::default()
        })
        .unwrap();
        b.iter(|| {
            let mut br = breakers();
            let mut env = Env {
                now_ms: 0,
                rng: &mut rng,
                breakers: &mut br,
            };
            let start = Input::CallStarted {
                call: 1,
                targets: targets(),
                mode: CallMode::Heal,
                retry_safe: true,
            };
            run.decide(start, &mut env);
            let failed = Input::AttemptFailed {
                call: 1,
                signal: &busy,
                offer: Default::default(),
            };
            black_box(run.decide(failed, &mut env));
            black_box(run.decide(Input::AttemptSucceeded { call: 1 }, &mut env));
            black_box(run.take_records());
        });
    });
    g.finish();
    let mut run = Run::new(ControllerConfig::default()).unwrap();
    let bytes = run.to_bytes().unwrap();
    println!("a fresh run's state: {} bytes", bytes.len());
    let mut rng = SplitMix64::new(1);
    let mut br = breakers();
    let mut env = Env {
        now_ms: 0,
        rng: &mut rng,
        breakers: &mut br,
    };
    for i in 0..3 {
        let start = Input::CallStarted {
            call: i,
            targets: targets(),
            mode: CallMode::Heal,
            retry_safe: true,
        };
        run.decide(start, &mut env);
        let failed = Input::AttemptFailed {
            call: i,
            signal: &busy,
            offer: Default::default(),
        };
        run.decide(failed, &mut env);
        run.decide(Input::AttemptSucceeded { call: i }, &mut env);
    }
    let bytes = run.to_bytes().unwrap();
    println!("after three recovered calls: {} bytes", bytes.len());
    c.bench_function("run state to bytes and back", |b| {
        b.iter(|| {
            let bytes = run.to_bytes().unwrap();
            black_box(Run::from_bytes(&bytes, ControllerConfig::default()).unwrap());
        });
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
