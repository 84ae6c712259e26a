//! Rendering a [`Report`]: the terminal table, a Markdown report and SVG plots.
//!
//! Plots are written as plain SVG by hand: two small charts do not justify a plotting stack, and
//! hand-written SVG is byte-for-byte reproducible.

use std::fmt::Write as _;

use selfheal_core::FailureClass;

use crate::{Report, strategies::Strategy};

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

const COLORS: [&str; 5] = ["#888888", "#d62728", "#ff7f0e", "#9467bd", "#2ca02c"];

fn color(strategy: &str) -> &'static str {
    Strategy::ALL
        .iter()
        .position(|s| s.as_str() == strategy)
        .map_or("#000000", |i| COLORS[i])
}

/// TSR against budget, one line per strategy.
pub fn svg_tsr_by_budget(report: &Report) -> String {
    let (w, h, l, r, t, b) = (640.0, 400.0, 60.0, 150.0, 30.0, 50.0);
    let budgets: Vec<u32> = {
        let mut v: Vec<u32> = report.results.iter().map(|r| r.budget).collect();
        v.sort_unstable();
        v.dedup();
        v
    };
    let bmin = f64::from(*budgets.first().unwrap_or(&1));
    let bmax = f64::from(*budgets.last().unwrap_or(&1)).max(bmin + 1.0);
    let x = |bud: f64| l + (bud - bmin) / (bmax - bmin) * (w - l - r);
    let y = |tsr: f64| t + (1.0 - tsr) * (h - t - b);
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n<text x=\"{}\" y=\"18\" text-anchor=\"middle\" font-size=\"14\">Task success rate by recovery budget R</text>\n",
        (w - r + l) / 2.0
    );
    for i in 0..=5 {
        let v = f64::from(i) / 5.0;
        let _ = writeln!(
            s,
            "<line x1=\"{l}\" x2=\"{}\" y1=\"{:.1}\" y2=\"{:.1}\" stroke=\"#ddd\"/><text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{:.0} %</text>",
            w - r,
            y(v),
            y(v),
            l - 6.0,
            y(v) + 4.0,
            v * 100.0
        );
    }
    for &bud in &budgets {
        let _ = writeln!(
            s,
            "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">{bud}</text>",
            x(f64::from(bud)),
            h - b + 18.0
        );
    }
    let _ = writeln!(
        s,
        "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">recovery actions per failure (R)</text>",
        (w - r + l) / 2.0,
        h - 10.0
    );
    let mut legend_y = t + 10.0;
    for strategy in Strategy::ALL {
        let pts: Vec<(f64, f64)> = report
            .results
            .iter()
            .filter(|r| r.strategy == strategy.as_str())
            .map(|r| (x(f64::from(r.budget)), y(r.tsr)))
            .collect();
        if pts.is_empty() {
            continue;
        }
        let c = color(strategy.as_str());
        let path: Vec<String> = pts.iter().map(|(a, b)| format!("{a:.1},{b:.1}")).collect();
        let _ = writeln!(
            s,
            "<polyline fill=\"none\" stroke=\"{c}\" stroke-width=\"2\" points=\"{}\"/>",
            path.join(" ")
        );
        for (a, b2) in &pts {
            let _ = writeln!(
                s,
                "<circle cx=\"{a:.1}\" cy=\"{b2:.1}\" r=\"3\" fill=\"{c}\"/>"
            );
        }
        let _ = writeln!(
            s,
            "<rect x=\"{}\" y=\"{:.1}\" width=\"12\" height=\"3\" fill=\"{c}\"/><text x=\"{}\" y=\"{:.1}\">{}</text>",
            w - r + 12.0,
            legend_y - 4.0,
            w - r + 30.0,
            legend_y,
            strategy.as_str()
        );
        legend_y += 18.0;
    }
    s.push_str("</svg>\n");
    s
}

/// Recovery by failure class at the largest budget, grouped bars.
pub fn svg_class_bars(report: &Report) -> String {
    let budget = report.results.iter().map(|r| r.budget).max().unwrap_or(0);
    let details: Vec<_> = report
        .details
        .iter()
        .filter(|d| d.budget == budget)
        .collect();
    let classes: Vec<FailureClass> = FailureClass::ALL
        .into_iter()
        .filter(|c| {
            details
                .iter()
                .any(|d| d.by_class.get(c).is_some_and(|r| r.met > 0))
        })
        .collect();
    let (l, t, row, bar) = (170.0, 40.0, 16.0 * details.len().max(1) as f64 + 10.0, 14.0);
    let w = 720.0;
    let h = t + row * classes.len() as f64 + 30.0;
    let x = |v: f64| l + v * (w - l - 40.0);
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"11\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n<text x=\"{}\" y=\"18\" text-anchor=\"middle\" font-size=\"14\">Episodes recovered, by failure class met (R = {budget})</text>\n",
        w / 2.0
    );
    for (i, d) in details.iter().enumerate() {
        let _ = write!(
            s,
            "<rect x=\"{}\" y=\"24\" width=\"10\" height=\"10\" fill=\"{}\"/><text x=\"{}\" y=\"33\">{}</text>",
            l + i as f64 * 105.0,
            color(d.strategy),
            l + i as f64 * 105.0 + 14.0,
            d.strategy
        );
    }
    s.push('\n');
    for (ci, class) in classes.iter().enumerate() {
        let y0 = t + ci as f64 * row;
        let _ = writeln!(
            s,
            "<text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{class}</text>",
            l - 8.0,
            y0 + row / 2.0
        );
        for (di, d) in details.iter().enumerate() {
            let r = d.by_class.get(class).copied().unwrap_or_default();
            let v = r.succeeded as f64 / r.met.max(1) as f64;
            let _ = writeln!(
                s,
                "<rect x=\"{l}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{}\" fill=\"{}\"/>",
                y0 + di as f64 * 16.0,
                x(v) - l,
                bar,
                color(d.strategy)
            );
        }
    }
    s.push_str("</svg>\n");
    s
}
