//! Rendering a [`Report`]: the terminal table, a Markdown report and SVG plots (drawn by
//! [`crate::plot`]).

use std::fmt::Write as _;

use selfheal_core::FailureClass;

use crate::Report;

fn pct(x: f64) -> String {
    format!("{:.1} %", x * 100.0)
}

/// The results as a terminal table, shaped like the paper's.
pub fn table(report: &Report) -> String {
    let mut out = String::new();
    let c = &report.config;
    let _ = writeln!(
        out,
        "selfheal bench — {} tasks × {} seeds (from {}), fault rate {}, {}",
        c.tasks,
        c.seeds,
        c.seed,
        c.fault_rate,
        if c.silent {
            "semantic silent-failure setting".to_owned()
        } else {
            format!(
                "mix runtime {} / output {} / context {} / semantic {} / agent {}",
                c.mix.runtime, c.mix.output, c.mix.context, c.mix.semantic, c.mix.agent
            )
        }
    );
    if c.policy.is_some() {
        let _ = writeln!(
            out,
            "self-healing runs a custom policy (--policy), not the default"
        );
    }
    let _ = writeln!(
        out,
        "{:<13} {:>3} {:>8} {:>19} {:>8} {:>8} {:>8} {:>11}",
        "strategy", "R", "episodes", "TSR (95 % CI)", "RSR", "SFR", "cost K", "latency ms"
    );
    for (r, d) in report.results.iter().zip(&report.details) {
        let _ = writeln!(
            out,
            "{:<13} {:>3} {:>8} {:>7} [{:>4.1}–{:>5.1}] {:>8} {:>8} {:>8.2} {:>11.0}",
            r.strategy,
            r.budget,
            r.episodes,
            pct(r.tsr),
            d.tsr_ci[0] * 100.0,
            d.tsr_ci[1] * 100.0,
            pct(r.rsr),
            pct(r.sfr),
            r.cost,
            r.latency_ms
        );
    }
    let cen = &report.census;
    let _ = writeln!(
        out,
        "workload: {} of {} episodes faulted; faults transient {} / permanent {}, explicit {} / implicit {}",
        cen.faulted_episodes,
        cen.episodes,
        cen.transient,
        cen.permanent,
        cen.explicit,
        cen.implicit
    );
    out
}

/// Per-class recovery at the largest budget run, as a Markdown table.
pub fn class_table(report: &Report) -> String {
    let budget = report.results.iter().map(|r| r.budget).max().unwrap_or(0);
    let details: Vec<_> = report
        .details
        .iter()
        .filter(|d| d.budget == budget)
        .collect();
    let mut out = String::new();
    let _ = write!(out, "| class (R = {budget}) |");
    for d in &details {
        let _ = write!(out, " {} |", d.strategy);
    }
    out.push_str("\n|---|");
    for _ in &details {
        out.push_str("---:|");
    }
    out.push('\n');
    for class in FailureClass::ALL {
        let met = details
            .first()
            .and_then(|d| d.by_class.get(&class))
            .map_or(0, |r| r.met);
        if met == 0 {
            continue;
        }
        let _ = write!(out, "| {class} ({met}) |");
        for d in &details {
            let r = d.by_class.get(&class).copied().unwrap_or_default();
            let _ = write!(out, " {} |", pct(r.succeeded as f64 / r.met.max(1) as f64));
        }
        out.push('\n');
    }
    out
}

/// The Markdown report.
pub fn markdown(report: &Report, plots: &[&str]) -> String {
    let mut out = String::from("# selfheal bench report\n\n");
    let c = &report.config;
    let _ = writeln!(
        out,
        "{} tasks × {} seeds starting at {}, fault rate {}, budgets {:?}{}.\n",
        c.tasks,
        c.seeds,
        c.seed,
        c.fault_rate,
        c.budgets(),
        if c.silent {
            ", semantic silent-failure setting"
        } else {
            ""
        }
    );
    out.push_str("| strategy | R | episodes | TSR | 95 % CI | RSR | SFR | cost K | latency ms |\n");
    out.push_str("|---|---:|---:|---:|---|---:|---:|---:|---:|\n");
    for (r, d) in report.results.iter().zip(&report.details) {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {:.1}–{:.1} | {} | {} | {:.2} | {:.0} |",
            r.strategy,
            r.budget,
            r.episodes,
            pct(r.tsr),
            d.tsr_ci[0] * 100.0,
            d.tsr_ci[1] * 100.0,
            pct(r.rsr),
            pct(r.sfr),
            r.cost,
            r.latency_ms
        );
    }
    out.push_str("\n## Recovery by failure class\n\nShare of episodes that met the class and still succeeded.\n\n");
    out.push_str(&class_table(report));
    for p in plots {
        let _ = writeln!(out, "\n![{p}]({p})");
    }
    out
}

/// The report's main figure: with one budget, TSR, RSR and SFR as grouped bars; with several
/// (`--sweep`), TSR against R. See [`crate::plot`].
pub fn svg_tsr_by_budget(report: &Report) -> String {
    crate::plot::tsr_by_budget(report)
}

/// Recovery by failure class at the largest budget, grouped bars. See [`crate::plot`].
pub fn svg_class_bars(report: &Report) -> String {
    crate::plot::recovery_by_class(report)
}
