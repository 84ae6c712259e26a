//! Rendering a [`Report`]: the terminal table, a Markdown report and SVG plots.
//!
//! The table and the report lead with RSR (the share of faulted episodes that still succeeded)
//! and put TSR beside it; then the paired comparisons, the drawn fault census, the per-fault
//! truth table, cost per success, the verifier's error rates and the classifier's confusion
//! matrix — what a skeptical reader needs to judge the headline.
//!
//! The SVG plots are drawn by [`crate::plot`].

use std::fmt::Write as _;

use selfheal_core::FailureClass;

use crate::Report;

/// The risk/coverage frontier in one line: the strategies on it, and where self-healing sits.
pub(crate) fn frontier_line(report: &Report) -> String {
    let top = report.frontier.first().map_or(0, |p| p.budget);
    let on: Vec<String> = report
        .frontier
        .iter()
        .filter(|p| p.on_frontier)
        .map(|p| {
            format!(
                "{} ({} recovered, {} silent)",
                p.strategy,
                pct(p.recovered),
                pct(p.silent)
            )
        })
        .collect();
    let sh = report
        .frontier
        .iter()
        .find(|p| p.strategy == "self-healing")
        .map(|p| {
            format!(
                "; self-healing {} ({} recovered, {} silent)",
                if p.on_frontier {
                    "is on it"
                } else {
                    "is not on it"
                },
                pct(p.recovered),
                pct(p.silent)
            )
        })
        .unwrap_or_default();
    format!(
        "risk/coverage (R = {top}, faulted episodes): frontier {}{sh}",
        on.join(", ")
    )
}

/// Self-healing's curve over its policy's `risk` setting in one line (empty when the report has
/// none: only a `--sweep` draws it).
pub(crate) fn risk_curve_line(report: &Report) -> String {
    if report.risk_curve.is_empty() {
        return String::new();
    }
    let pts: Vec<String> = report
        .risk_curve
        .iter()
        .map(|p| {
            format!(
                "{}{} {}/{}{}",
                p.risk,
                if p.configured { " (policy)" } else { "" },
                pct(p.recovered),
                pct(p.silent),
                if p.on_frontier { " *" } else { "" }
            )
        })
        .collect();
    format!(
        "self-healing over risk (R = {}, faulted episodes, risk recovered/silent, * on the frontier): {}",
        report.risk_curve[0].budget,
        pts.join(", ")
    )
}

/// What a deployment run is, and which strategies carry memory across its episodes.
pub(crate) fn deployment_line(report: &Report) -> String {
    let memory: Vec<&str> = report
        .config
        .strategies
        .iter()
        .filter(|s| s.carries_memory())
        .map(|s| s.as_str())
        .collect();
    format!(
        "deployment: each seed's {} episodes run in sequence against one world (a tool broken for good stays broken); strategies carrying memory across episodes: {}",
        report.config.tasks,
        if memory.is_empty() {
            "none".to_owned()
        } else {
            memory.join(", ")
        }
    )
}

/// The per-detector false-alarm line: on episodes where nothing went wrong, in how many each
/// detector fired.
pub(crate) fn false_alarm_line(d: &crate::Detail, budget: u32) -> String {
    let fired: Vec<String> = d
        .false_alarms_clean
        .iter()
        .map(|(k, n)| {
            let share = if d.clean_episodes == 0 {
                0.0
            } else {
                *n as f64 / d.clean_episodes as f64
            };
            format!("{k} {n} ({})", pct(share))
        })
        .collect();
    format!(
        "false alarms ({}, R = {budget}) on {} episodes where nothing went wrong: {}",
        d.strategy,
        d.clean_episodes,
        if fired.is_empty() {
            "none".to_owned()
        } else {
            fired.join(", ")
        }
    )
}

fn pct(x: f64) -> String {
    format!("{:.1} %", x * 100.0)
}

fn per_success(x: Option<f64>) -> String {
    x.map_or_else(|| "—".to_owned(), |k| format!("{k:.2}"))
}

fn signed_pct(x: f64) -> String {
    format!("{:+.1}", x * 100.0)
}

fn header(report: &Report) -> String {
    let c = &report.config;
    let mix = match &c.mix {
        Some(m) => format!(
            ", mix runtime {} / output {} / context {} / semantic {} / agent {}",
            m.runtime, m.output, m.context, m.semantic, m.agent
        ),
        None => String::new(),
    };
    format!(
        "{} tasks of `{}` × {} seeds (from {}), fault rate {}, fault model `{}`{}{}",
        c.tasks,
        c.task_set.name,
        c.seeds,
        c.seed,
        c.fault_rate,
        c.fault_model_name,
        mix,
        if c.silent {
            ", semantic faults only (--silent)"
        } else {
            ""
        }
    ) + if c.deployment {
        ", deployment (episodes in sequence, one world)"
    } else {
        ""
    }
}

/// The results as a terminal table: RSR first, TSR next to it.
pub fn table(report: &Report) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "selfheal bench — {}", header(report));
    if report.config.policy.is_some() {
        let _ = writeln!(
            out,
            "self-healing runs a custom policy (--policy), not the default"
        );
    }
    let _ = writeln!(
        out,
        "{:<19} {:>2} {:>6} {:>20} {:>7} {:>7} {:>7} {:>8} {:>9}",
        "strategy", "R", "eps", "RSR (95 % CI)", "TSR", "SFR", "K", "K/succ", "lat ms"
    );
    for (r, d) in report.results.iter().zip(&report.details) {
        let _ = writeln!(
            out,
            "{:<19} {:>2} {:>6} {:>7} [{:>4.1}–{:>5.1}] {:>7} {:>7} {:>7.2} {:>8} {:>9.0}",
            r.strategy,
            r.budget,
            r.episodes,
            pct(r.rsr),
            d.rsr_ci[0] * 100.0,
            d.rsr_ci[1] * 100.0,
            pct(r.tsr),
            pct(r.sfr),
            r.cost,
            per_success(d.cost_per_success),
            r.latency_ms
        );
    }
    if report.config.deployment {
        let _ = writeln!(out, "{}", deployment_line(report));
    }
    let cen = &report.census;
    let _ = writeln!(
        out,
        "workload: {} of {} episodes faulted; faults transient {} / permanent {}, explicit {} / implicit {}, {} steps with two faults",
        cen.faulted_episodes,
        cen.episodes,
        cen.transient,
        cen.permanent,
        cen.explicit,
        cen.implicit,
        cen.multi_fault_steps
    );
    let top = report.results.iter().map(|r| r.budget).max().unwrap_or(0);
    for d in report.details.iter().filter(|d| d.budget == top) {
        if d.verifier.on_faithful + d.verifier.on_wrong > 0 && d.strategy == "self-healing" {
            let _ = writeln!(
                out,
                "verifier (self-healing, R = {top}): false alarms {} of {} faithful ({}), misses {} of {} wrong ({}), could not tell {}",
                d.verifier.false_alarms,
                d.verifier.on_faithful,
                pct(d.verifier.false_alarm_rate()),
                d.verifier.misses,
                d.verifier.on_wrong,
                pct(d.verifier.miss_rate()),
                d.verifier.uncertain
            );
        }
    }
    for d in report
        .details
        .iter()
        .filter(|d| d.budget == top && d.strategy == "self-healing")
    {
        let _ = writeln!(out, "{}", false_alarm_line(d, top));
    }
    let _ = writeln!(out, "{}", frontier_line(report));
    if !report.risk_curve.is_empty() {
        let _ = writeln!(out, "{}", risk_curve_line(report));
    }
    for c in &report.confusion {
        let _ = writeln!(
            out,
            "classifier ({}, R = {top}): {} of {} inferences match the injected class ({})",
            c.strategy,
            c.correct,
            c.total,
            pct(if c.total == 0 {
                0.0
            } else {
                c.correct as f64 / c.total as f64
            })
        );
    }
    for p in report.paired.iter().filter(|p| p.budget == top) {
        let _ = writeln!(
            out,
            "self-healing vs {:<19} RSR {:>6} pp [{:>6}, {:>6}]  SFR {:>5} pp [{:>5}, {:>5}]  McNemar {}:{} p = {:.4}  wrong only here {}+{}, only there {}+{}",
            p.against,
            signed_pct(p.rsr_diff),
            signed_pct(p.rsr_ci[0]),
            signed_pct(p.rsr_ci[1]),
            signed_pct(p.sfr_diff),
            signed_pct(p.sfr_ci[0]),
            signed_pct(p.sfr_ci[1]),
            p.only_self_healing,
            p.only_other,
            p.mcnemar_p,
            p.self_wrong_other_right,
            p.self_wrong_other_none,
            p.other_wrong_self_right,
            p.other_wrong_self_none
        );
    }
    out
}

fn top_details(report: &Report) -> (u32, Vec<&crate::Detail>) {
    let budget = report.results.iter().map(|r| r.budget).max().unwrap_or(0);
    (
        budget,
        report
            .details
            .iter()
            .filter(|d| d.budget == budget)
            .collect(),
    )
}

/// Per-class recovery at the largest budget run, as a Markdown table.
pub(crate) fn class_table(report: &Report) -> String {
    let (budget, details) = top_details(report);
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

/// The per-fault truth table at the largest budget: success (and silent failures) of every
/// strategy on the episodes that drew each fault. Cells at exactly 0 % or 100 % are marked `*`:
/// check whether the world makes them so by construction.
pub(crate) fn truth_table(report: &Report) -> String {
    let (budget, details) = top_details(report);
    let mut out = String::new();
    let _ = write!(out, "| fault (R = {budget}) | drawn |");
    for d in &details {
        let _ = write!(out, " {} |", d.strategy);
    }
    out.push_str("\n|---|---:|");
    for _ in &details {
        out.push_str("---:|");
    }
    out.push('\n');
    for (name, drawn) in &report.census.by_fault {
        let met = details
            .first()
            .and_then(|d| d.by_fault.get(name))
            .map_or(0, |k| k.met);
        let _ = write!(out, "| {name} | {drawn} |");
        for d in &details {
            let k = d.by_fault.get(name).copied().unwrap_or_default();
            let rate = k.succeeded as f64 / k.met.max(1) as f64;
            let mark = if met > 0 && (k.succeeded == 0 || k.succeeded == k.met) {
                "*"
            } else {
                ""
            };
            let silent = if k.silent > 0 {
                format!(" ({} silent)", k.silent)
            } else {
                String::new()
            };
            let _ = write!(out, " {}{mark}{silent} |", pct(rate));
        }
        out.push('\n');
    }
    out
}

/// The Markdown report.
pub fn markdown(report: &Report, plots: &[&str]) -> String {
    let mut out = String::from("# selfheal bench report\n\n");
    let c = &report.config;
    let _ = writeln!(out, "{}, budgets {:?}.\n", header(report), c.budgets());
    out.push_str("RSR is the share of faulted episodes that still ended with a correct answer; TSR counts all episodes; SFR is the share of all episodes that returned a wrong answer as if correct. K weighs model, tool, verifier and recovery calls at 1 and fallback-model calls at their own price.\n\n");
    out.push_str("| strategy | R | episodes | RSR | 95 % CI | TSR | SFR | K | K per success | latency ms |\n");
    out.push_str("|---|---:|---:|---:|---|---:|---:|---:|---:|---:|\n");
    for (r, d) in report.results.iter().zip(&report.details) {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {:.1}–{:.1} | {} | {} | {:.2} | {} | {:.0} |",
            r.strategy,
            r.budget,
            r.episodes,
            pct(r.rsr),
            d.rsr_ci[0] * 100.0,
            d.rsr_ci[1] * 100.0,
            pct(r.tsr),
            pct(r.sfr),
            r.cost,
            per_success(d.cost_per_success),
            r.latency_ms
        );
    }
    out.push_str("\n## Self-healing against each strategy, same episodes\n\nDifferences in percentage points (self-healing minus the other); 95 % intervals from a paired bootstrap that resamples whole tasks; McNemar's exact test on success (episodes only self-healing solved : only the other solved). *Wrong only here* counts the episodes where self-healing returned a wrong answer as correct and the other did not, split by what the other returned (the right answer / none); *wrong only there* the reverse. A silent failure of self-healing where the other returned nothing is a wrong value met after a recovery the other did not make.\n\n| R | against | RSR diff | 95 % CI | TSR diff | SFR diff | 95 % CI | McNemar | p | wrong only here (other right / none) | wrong only there (here right / none) |\n|---:|---|---:|---|---:|---:|---|---|---:|---|---|\n");
    for p in &report.paired {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} to {} | {} | {} | {} to {} | {}:{} | {:.4} | {} / {} | {} / {} |",
            p.budget,
            p.against,
            signed_pct(p.rsr_diff),
            signed_pct(p.rsr_ci[0]),
            signed_pct(p.rsr_ci[1]),
            signed_pct(p.tsr_diff),
            signed_pct(p.sfr_diff),
            signed_pct(p.sfr_ci[0]),
            signed_pct(p.sfr_ci[1]),
            p.only_self_healing,
            p.only_other,
            p.mcnemar_p,
            p.self_wrong_other_right,
            p.self_wrong_other_none,
            p.other_wrong_self_right,
            p.other_wrong_self_none
        );
    }
    let _ = writeln!(
        out,
        "\n## Risk and coverage\n\nOf the faulted episodes at the largest budget: the share each strategy recovered and the share it answered wrongly as if correct. A strategy is on the frontier when no other recovers at least as much with at most as many silent failures.\n\n{}\n\n| strategy | recovered | 95 % CI | silent | 95 % CI | frontier |\n|---|---:|---|---:|---|---|",
        frontier_line(report)
    );
    for p in &report.frontier {
        let _ = writeln!(
            out,
            "| {} | {} | {:.1}–{:.1} | {} | {:.1}–{:.1} | {} |",
            p.strategy,
            pct(p.recovered),
            p.recovered_ci[0] * 100.0,
            p.recovered_ci[1] * 100.0,
            pct(p.silent),
            p.silent_ci[0] * 100.0,
            p.silent_ci[1] * 100.0,
            if p.on_frontier { "yes" } else { "" }
        );
    }
    if !report.risk_curve.is_empty() {
        let _ = writeln!(
            out,
            "\n### Self-healing over its policy's `risk` setting\n\nThe same episodes, self-healing's policy as configured but for `risk` (the share of claimed answers the user accepts being wrong: it sets whether a recovered value nothing could check is claimed, how many times values are read again before answering, and at 0 whether anything is claimed after a recovery). A setting is on the frontier when no strategy's point above recovers at least as much with at most as many silent failures.\n\n| risk | recovered | 95 % CI | silent | 95 % CI | SFR (all episodes) | frontier |\n|---:|---:|---|---:|---|---:|---|"
        );
        for p in &report.risk_curve {
            let _ = writeln!(
                out,
                "| {}{} | {} | {:.1}–{:.1} | {} | {:.1}–{:.1} | {} | {} |",
                p.risk,
                if p.configured { " (the policy's)" } else { "" },
                pct(p.recovered),
                p.recovered_ci[0] * 100.0,
                p.recovered_ci[1] * 100.0,
                pct(p.silent),
                p.silent_ci[0] * 100.0,
                p.silent_ci[1] * 100.0,
                pct(p.sfr),
                if p.on_frontier { "yes" } else { "" }
            );
        }
    }
    out.push_str(
        "\n## False alarms where nothing went wrong\n\nPer strategy at the largest budget: of the episodes with no fault scheduled and no mistake of the model's own, how many saw each detector fire.\n\n",
    );
    let top = report.results.iter().map(|r| r.budget).max().unwrap_or(0);
    for d in report.details.iter().filter(|d| d.budget == top) {
        let _ = writeln!(out, "- {}", false_alarm_line(d, top));
    }
    let cen = &report.census;
    let total: u64 = cen.by_fault.values().sum();
    let _ = writeln!(
        out,
        "\n## Fault census (drawn, not nominal)\n\n{} of {} episodes met at least one fault; {} faults: transient {} / permanent {}, explicit {} / implicit {}; {} steps drew two faults.\n",
        cen.faulted_episodes,
        cen.episodes,
        total,
        cen.transient,
        cen.permanent,
        cen.explicit,
        cen.implicit,
        cen.multi_fault_steps
    );
    out.push_str("| family | drawn | share |\n|---|---:|---:|\n");
    for (f, k) in &cen.by_family {
        let _ = writeln!(
            out,
            "| {} | {k} | {} |",
            f.as_str(),
            pct(*k as f64 / total.max(1) as f64)
        );
    }
    out.push_str("\n## Truth table by fault\n\nSuccess rate of each strategy on the episodes that drew the fault (silent failures in brackets). `*` marks 0 % or 100 %. Some are so by construction: `static` has no recovery, so any fault that stops or corrupts its path is 0 %; a fault that takes down both sources, or gives both the same wrong value, or corrupts a tool with no substitute has no fix for anyone; a slow-but-correct tool is no failure. The rest are measurements.\n\n");
    out.push_str(&truth_table(report));
    out.push_str("\n## Recovery by failure class\n\nShare of episodes that met the (injected) class and still succeeded.\n\n");
    out.push_str(&class_table(report));
    let (budget, details) = top_details(report);
    let _ = writeln!(
        out,
        "\n## Detectors against the truth (R = {budget})\n\nThe cross-check verifier calls the equivalent source; equivalent sources differ by documented noise, so it can reject a faithful value (false alarm) or accept a wrong one (miss).\n\n| strategy | verdicts on faithful | false alarms | rate | verdicts on wrong | misses | rate | could not tell | fallback-model calls / episode |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    for d in &details {
        let v = &d.verifier;
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {:.3} |",
            d.strategy,
            v.on_faithful,
            v.false_alarms,
            pct(v.false_alarm_rate()),
            v.on_wrong,
            v.misses,
            pct(v.miss_rate()),
            v.uncertain,
            d.escalated_calls
        );
    }
    for c in &report.confusion {
        let _ = writeln!(
            out,
            "\n### Classifier confusion matrix ({}, R = {budget})\n\nRows: the class of the fault last met at the step, or of the earlier step the model skipped when the failure is a missing input (`none`: no fault there, e.g. a verifier false alarm). Columns: the class the classifier inferred. {} of {} inferences on faulted steps match ({}).\n",
            c.strategy,
            c.correct,
            c.total,
            pct(if c.total == 0 {
                0.0
            } else {
                c.correct as f64 / c.total as f64
            })
        );
        let cols: Vec<FailureClass> = FailureClass::ALL
            .into_iter()
            .filter(|f| c.matrix.values().any(|row| row.contains_key(f)))
            .collect();
        out.push_str("| injected \\ inferred |");
        for f in &cols {
            let _ = write!(out, " {f} |");
        }
        out.push_str("\n|---|");
        for _ in &cols {
            out.push_str("---:|");
        }
        out.push('\n');
        for (inj, row) in &c.matrix {
            let _ = write!(out, "| {inj} |");
            for f in &cols {
                let _ = write!(out, " {} |", row.get(f).copied().unwrap_or(0));
            }
            out.push('\n');
        }
    }
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

/// Risk against coverage at the largest budget, the frontier marked. See [`crate::plot`].
pub fn svg_risk_coverage(report: &Report) -> String {
    crate::plot::risk_coverage(report)
}

/// Recovery by failure class at the largest budget, grouped bars. See [`crate::plot`].
pub fn svg_class_bars(report: &Report) -> String {
    crate::plot::recovery_by_class(report)
}
