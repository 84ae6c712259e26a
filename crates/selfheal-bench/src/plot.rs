//! The report's charts, drawn as plain SVG.
//!
//! Why by hand: three small charts do not justify a plotting stack, and hand-written SVG is
//! byte-for-byte reproducible, like the rest of the report. The module has two layers: three
//! chart shapes that know nothing about the benchmark ([`grouped_bars`], [`lines`],
//! [`horizontal_bars`], each drawing a [`Chart`] of rates with Wilson intervals), and the
//! benchmark's figures built on them ([`tsr_by_budget`], [`recovery_by_class`]), which
//! [`crate::report`] and the live benchmark call.
//!
//! Every chart has a value axis with tick labels, a title and a subtitle that says what `n` is
//! and what the whiskers are. Bars start at zero (a truncated bar lies about ratios); the line
//! chart's value axis is fitted to the data, since there the differences are the point.

use std::fmt::Write as _;

use selfheal_core::FailureClass;

use crate::strategies::Strategy;
use crate::{Detail, Report, wilson};

/// A rate in `[0, 1]` with its 95 % interval and the number of trials behind it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rate {
    /// The rate.
    pub value: f64,
    /// Its 95 % interval (Wilson), low and high.
    pub ci: [f64; 2],
    /// Trials.
    pub n: u64,
}

impl Rate {
    /// `successes` out of `n`, with its Wilson interval.
    pub fn of(successes: u64, n: u64) -> Rate {
        Rate {
            value: if n == 0 {
                0.0
            } else {
                successes as f64 / n as f64
            },
            ci: wilson(successes, n),
            n,
        }
    }
}

/// One series of a chart (a strategy): a name, a colour and one rate per category.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    /// Shown in the legend.
    pub name: String,
    /// Fill and stroke colour (`#rrggbb`).
    pub color: &'static str,
    /// One entry per category of the chart; `None` where the series has no value.
    pub rates: Vec<Option<Rate>>,
}

/// What a chart shows.
#[derive(Debug, Clone, PartialEq)]
pub struct Chart {
    /// The title.
    pub title: String,
    /// One line under the title: what n is and what the whiskers are.
    pub subtitle: String,
    /// The value axis's title.
    pub axis: String,
    /// The category axis's title (may be empty).
    pub category_axis: String,
    /// Category labels: groups of bars, or points along the line chart's x axis.
    pub categories: Vec<String>,
    /// The series, drawn in this order.
    pub series: Vec<Series>,
}

/// Colour-blind-safe colours (Okabe and Ito), one per strategy in [`Strategy::ALL`] order, with
/// grey for the do-nothing baseline; strategies past the palette reuse it from the start.
const PALETTE: [&str; 8] = [
    "#8c8c8c", "#e69f00", "#56b4e9", "#cc79a7", "#009e73", "#0072b2", "#d55e00", "#f0e442",
];

/// The colour of a strategy, by its name (the same in every chart, simulated or live).
pub fn strategy_color(name: &str) -> &'static str {
    let i = Strategy::ALL
        .iter()
        .position(|s| s.as_str() == name)
        .unwrap_or(Strategy::ALL.len());
    PALETTE[i % PALETTE.len()]
}

const FONT: &str = "Helvetica, Arial, 'DejaVu Sans', sans-serif";
const INK: &str = "#222222";
const GRID: &str = "#e3e3e3";

/// The drawing area of a chart, in SVG pixels.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Frame {
    pub(crate) width: f64,
    pub(crate) height: f64,
    pub(crate) left: f64,
    pub(crate) top: f64,
    pub(crate) right: f64,
    pub(crate) bottom: f64,
}

fn esc(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            c => out.push(c),
        }
    }
    out
}

fn open(s: &mut String, f: &Frame, chart: &Chart) {
    let _ = writeln!(
        s,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" viewBox=\"0 0 {w} {h}\" font-family=\"{FONT}\" font-size=\"12\" fill=\"{INK}\">\n\
         <rect width=\"{w}\" height=\"{h}\" fill=\"white\"/>\n\
         <text x=\"{x:.1}\" y=\"22\" text-anchor=\"middle\" font-size=\"15\" font-weight=\"bold\">{}</text>\n\
         <text x=\"{x:.1}\" y=\"40\" text-anchor=\"middle\" font-size=\"11\" fill=\"#555555\">{}</text>",
        esc(&chart.title),
        esc(&chart.subtitle),
        w = f.width,
        h = f.height,
        x = f.width / 2.0,
    );
}

/// A legend in one row centred at `y`: a swatch and the name of each series.
fn legend(s: &mut String, f: &Frame, series: &[Series], y: f64) {
    // DejaVu Sans at 12 px averages about 7 px per character.
    let widths: Vec<f64> = series
        .iter()
        .map(|se| 18.0 + 7.0 * se.name.chars().count() as f64 + 16.0)
        .collect();
    let mut x = (f.width - widths.iter().sum::<f64>()) / 2.0;
    s.push_str("<g class=\"legend\">\n");
    for (se, w) in series.iter().zip(&widths) {
        let _ = writeln!(
            s,
            "<rect x=\"{x:.1}\" y=\"{:.1}\" width=\"12\" height=\"12\" fill=\"{}\"/><text x=\"{:.1}\" y=\"{:.1}\">{}</text>",
            y - 10.0,
            se.color,
            x + 17.0,
            y,
            esc(&se.name)
        );
        x += w;
    }
    s.push_str("</g>\n");
}

/// A round tick step (percent) giving at most eight ticks over `span`.
fn tick_step(span: f64) -> f64 {
    [1.0, 2.0, 5.0, 10.0, 20.0, 25.0, 50.0]
        .into_iter()
        .find(|st| span.max(1.0) / st <= 8.0)
        .unwrap_or(100.0)
}

/// Tick values from `lo` to `hi` (percent), at a round step.
fn ticks(lo: f64, hi: f64) -> Vec<f64> {
    let step = tick_step(hi - lo);
    let mut out = Vec::new();
    let mut v = (lo / step).ceil() * step;
    while v <= hi + 1e-9 {
        out.push(v);
        v += step;
    }
    out
}

/// The value range (percent) of a line chart: fitted to every point and interval with a
/// margin, widened to whole ticks, never narrower than 10 points, always inside 0–100.
pub(crate) fn fitted_range(series: &[Series]) -> (f64, f64) {
    let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
    for r in series.iter().flat_map(|se| se.rates.iter().flatten()) {
        lo = lo.min(r.ci[0].min(r.value) * 100.0);
        hi = hi.max(r.ci[1].max(r.value) * 100.0);
    }
    if !lo.is_finite() || !hi.is_finite() {
        return (0.0, 100.0);
    }
    let (mut lo, mut hi) = ((lo - 1.0).max(0.0), (hi + 1.0).min(100.0));
    if hi - lo < 10.0 {
        lo = (hi - 10.0).max(0.0);
        hi = lo + 10.0;
    }
    // Snap outwards to the tick step; a wider range may call for a larger step, so repeat.
    for _ in 0..4 {
        let step = tick_step(hi - lo);
        let (l, h) = ((lo / step).floor() * step, (hi / step).ceil() * step);
        if (l, h) == (lo, hi) {
            break;
        }
        (lo, hi) = (l.max(0.0), h.min(100.0));
    }
    (lo, hi)
}

/// The value axis on the left: gridlines, tick labels (percent), the axis line and its title.
fn value_axis_left(s: &mut String, f: &Frame, lo: f64, hi: f64, title: &str) {
    let y = |v: f64| f.top + (hi - v) / (hi - lo) * (f.height - f.top - f.bottom);
    s.push_str("<g class=\"value-axis\">\n");
    for t in ticks(lo, hi) {
        let _ = writeln!(
            s,
            "<line x1=\"{l}\" x2=\"{r}\" y1=\"{yy:.1}\" y2=\"{yy:.1}\" stroke=\"{GRID}\"/><line x1=\"{}\" x2=\"{l}\" y1=\"{yy:.1}\" y2=\"{yy:.1}\" stroke=\"{INK}\"/><text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{t:.0} %</text>",
            f.left - 5.0,
            f.left - 8.0,
            y(t) + 4.0,
            l = f.left,
            r = f.width - f.right,
            yy = y(t),
        );
    }
    let _ = writeln!(
        s,
        "<line class=\"axis\" x1=\"{l}\" x2=\"{l}\" y1=\"{}\" y2=\"{}\" stroke=\"{INK}\"/><line class=\"axis\" x1=\"{l}\" x2=\"{}\" y1=\"{b}\" y2=\"{b}\" stroke=\"{INK}\"/>",
        f.top,
        f.height - f.bottom,
        f.width - f.right,
        l = f.left,
        b = f.height - f.bottom,
    );
    let mid = (f.top + f.height - f.bottom) / 2.0;
    let _ = writeln!(
        s,
        "<text x=\"18\" y=\"{mid:.1}\" text-anchor=\"middle\" transform=\"rotate(-90 18 {mid:.1})\">{}</text>",
        esc(title)
    );
    s.push_str("</g>\n");
}

/// A vertical whisker from `lo` to `hi` at `x`, with caps, in `color`.
fn whisker_v(s: &mut String, x: f64, lo: f64, hi: f64, cap: f64, color: &str) {
    let _ = writeln!(
        s,
        "<path class=\"whisker\" d=\"M{x:.1} {lo:.1}V{hi:.1}M{:.1} {lo:.1}H{:.1}M{:.1} {hi:.1}H{:.1}\" stroke=\"{color}\" stroke-width=\"1.2\" fill=\"none\"/>",
        x - cap,
        x + cap,
        x - cap,
        x + cap
    );
}

/// A horizontal whisker from `lo` to `hi` at `y`, with caps.
fn whisker_h(s: &mut String, y: f64, lo: f64, hi: f64, cap: f64) {
    let _ = writeln!(
        s,
        "<path class=\"whisker\" d=\"M{lo:.1} {y:.1}H{hi:.1}M{lo:.1} {:.1}V{:.1}M{hi:.1} {:.1}V{:.1}\" stroke=\"#444444\" stroke-width=\"1\" fill=\"none\"/>",
        y - cap,
        y + cap,
        y - cap,
        y + cap
    );
}

pub(crate) fn grouped_bars_frame(chart: &Chart) -> Frame {
    let bars = chart.series.len().max(1) as f64;
    let group = (bars * 44.0 + 40.0).max(150.0);
    Frame {
        width: (80.0 + group * chart.categories.len().max(1) as f64 + 20.0).max(560.0),
        height: 460.0,
        left: 80.0,
        top: 100.0,
        right: 20.0,
        bottom: 50.0,
    }
}

/// Vertical bars grouped by category, one bar per series, on a 0–100 % axis, each with its
/// Wilson whisker and its value written above it.
pub fn grouped_bars(chart: &Chart) -> String {
    let f = grouped_bars_frame(chart);
    let mut s = String::new();
    open(&mut s, &f, chart);
    legend(&mut s, &f, &chart.series, 66.0);
    value_axis_left(&mut s, &f, 0.0, 100.0, &chart.axis);
    let plot_w = f.width - f.left - f.right;
    let group_w = plot_w / chart.categories.len().max(1) as f64;
    let n = chart.series.len().max(1) as f64;
    let bar_w = (group_w * 0.8 / n).min(40.0);
    let y = |v: f64| f.top + (1.0 - v) * (f.height - f.top - f.bottom);
    let base = f.height - f.bottom;
    let label_size = if bar_w >= 34.0 { 11.0 } else { 9.0 };
    for (ci, cat) in chart.categories.iter().enumerate() {
        let center = f.left + group_w * (ci as f64 + 0.5);
        let _ = writeln!(
            s,
            "<text x=\"{center:.1}\" y=\"{:.1}\" text-anchor=\"middle\" font-size=\"13\">{}</text>",
            base + 20.0,
            esc(cat)
        );
        for (si, se) in chart.series.iter().enumerate() {
            let Some(r) = se.rates.get(ci).copied().flatten() else {
                continue;
            };
            let x = center + (si as f64 - (n - 1.0) / 2.0) * bar_w;
            let top = y(r.value);
            let _ = writeln!(
                s,
                "<rect class=\"bar\" x=\"{:.1}\" y=\"{top:.1}\" width=\"{:.1}\" height=\"{:.1}\" fill=\"{}\"><title>{}: {:.1} % (n = {})</title></rect>",
                x - bar_w / 2.0 + 1.0,
                bar_w - 2.0,
                (base - top).max(0.0),
                se.color,
                esc(&se.name),
                r.value * 100.0,
                r.n
            );
            whisker_v(
                &mut s,
                x,
                y(r.ci[0]),
                y(r.ci[1]),
                (bar_w / 5.0).min(5.0),
                INK,
            );
            let _ = writeln!(
                s,
                "<text x=\"{x:.1}\" y=\"{:.1}\" text-anchor=\"middle\" font-size=\"{label_size}\">{:.1}</text>",
                y(r.ci[1]) - 4.0,
                r.value * 100.0
            );
        }
    }
    if !chart.category_axis.is_empty() {
        let _ = writeln!(
            s,
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>",
            f.left + plot_w / 2.0,
            f.height - 8.0,
            esc(&chart.category_axis)
        );
    }
    s.push_str("</svg>\n");
    s
}

pub(crate) fn lines_frame(_chart: &Chart) -> Frame {
    Frame {
        width: 720.0,
        height: 460.0,
        left: 80.0,
        top: 60.0,
        right: 140.0,
        bottom: 60.0,
    }
}

/// One line per series across the categories (e.g. budgets), with Wilson whiskers, on a value
/// axis fitted to the data; series are named at the end of their line.
pub(crate) fn lines(chart: &Chart) -> String {
    let f = lines_frame(chart);
    let (lo, hi) = fitted_range(&chart.series);
    let mut s = String::new();
    open(&mut s, &f, chart);
    value_axis_left(&mut s, &f, lo, hi, &chart.axis);
    let plot_w = f.width - f.left - f.right;
    let cats = chart.categories.len().max(1) as f64;
    let x = |i: usize| f.left + plot_w * (i as f64 + 0.5) / cats;
    let y = |v: f64| f.top + (hi - v * 100.0) / (hi - lo) * (f.height - f.top - f.bottom);
    let base = f.height - f.bottom;
    for (ci, cat) in chart.categories.iter().enumerate() {
        let _ = writeln!(
            s,
            "<line x1=\"{xx:.1}\" x2=\"{xx:.1}\" y1=\"{base}\" y2=\"{:.1}\" stroke=\"{INK}\"/><text x=\"{xx:.1}\" y=\"{:.1}\" text-anchor=\"middle\" font-size=\"13\">{}</text>",
            base + 5.0,
            base + 20.0,
            esc(cat),
            xx = x(ci),
        );
    }
    if !chart.category_axis.is_empty() {
        let _ = writeln!(
            s,
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>",
            f.left + plot_w / 2.0,
            f.height - 14.0,
            esc(&chart.category_axis)
        );
    }
    // Series are spread sideways a little so that their whiskers do not cover each other.
    let n = chart.series.len().max(1) as f64;
    let dodge = (plot_w / cats * 0.25 / n).min(5.0);
    let mut ends: Vec<(f64, &Series)> = Vec::new();
    for (si, se) in chart.series.iter().enumerate() {
        let off = (si as f64 - (n - 1.0) / 2.0) * dodge;
        let pts: Vec<(f64, Rate)> = se
            .rates
            .iter()
            .enumerate()
            .filter_map(|(i, r)| r.map(|r| (x(i) + off, r)))
            .collect();
        let Some(&(_, last)) = pts.last() else {
            continue;
        };
        let _ = write!(s, "<g class=\"series\" stroke=\"{}\">", se.color);
        let path: Vec<String> = pts
            .iter()
            .map(|(px, r)| format!("{px:.1},{:.1}", y(r.value)))
            .collect();
        let _ = writeln!(
            s,
            "<polyline fill=\"none\" stroke-width=\"2.2\" points=\"{}\"/></g>",
            path.join(" ")
        );
        for (px, r) in &pts {
            whisker_v(&mut s, *px, y(r.ci[0]), y(r.ci[1]), 3.0, se.color);
            let _ = writeln!(
                s,
                "<circle class=\"point\" cx=\"{px:.1}\" cy=\"{:.1}\" r=\"4\" fill=\"{}\" stroke=\"white\" stroke-width=\"1\"><title>{}: {:.1} % (n = {})</title></circle>",
                y(r.value),
                se.color,
                esc(&se.name),
                r.value * 100.0,
                r.n
            );
        }
        ends.push((y(last.value), se));
    }
    // Labels at the right end of each line, pushed apart so they never overlap.
    ends.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut placed: Vec<f64> = Vec::with_capacity(ends.len());
    for (want, _) in &ends {
        let floor = placed.last().map_or(f64::NEG_INFINITY, |p| p + 15.0);
        placed.push(want.max(floor));
    }
    let overflow = placed.last().map_or(0.0, |p| (p - base).max(0.0));
    let lx = f.width - f.right + 12.0;
    for ((want, se), at) in ends.iter().zip(&placed) {
        let at = at - overflow;
        let _ = writeln!(
            s,
            "<path d=\"M{:.1} {want:.1}L{:.1} {at:.1}\" stroke=\"{}\" fill=\"none\"/><text x=\"{lx:.1}\" y=\"{:.1}\" fill=\"{INK}\">{}</text>",
            lx - 10.0,
            lx - 3.0,
            se.color,
            at + 4.0,
            esc(&se.name)
        );
    }
    s.push_str("</svg>\n");
    s
}

pub(crate) fn horizontal_bars_frame(chart: &Chart) -> Frame {
    let row = 13.0 * chart.series.len().max(1) as f64 + 14.0;
    Frame {
        width: 760.0,
        height: 90.0 + row * chart.categories.len().max(1) as f64 + 50.0,
        left: 230.0,
        top: 90.0,
        right: 60.0,
        bottom: 50.0,
    }
}

/// Horizontal bars, one row of bars per category (label on the left), on a 0–100 % axis at the
/// bottom, each bar with its Wilson whisker and value.
pub(crate) fn horizontal_bars(chart: &Chart) -> String {
    let f = horizontal_bars_frame(chart);
    let mut s = String::new();
    open(&mut s, &f, chart);
    legend(&mut s, &f, &chart.series, 66.0);
    let plot_w = f.width - f.left - f.right;
    let x = |v: f64| f.left + v * plot_w;
    let base = f.height - f.bottom;
    s.push_str("<g class=\"value-axis\">\n");
    for t in ticks(0.0, 100.0) {
        let _ = writeln!(
            s,
            "<line x1=\"{xx:.1}\" x2=\"{xx:.1}\" y1=\"{}\" y2=\"{base}\" stroke=\"{GRID}\"/><line x1=\"{xx:.1}\" x2=\"{xx:.1}\" y1=\"{base}\" y2=\"{:.1}\" stroke=\"{INK}\"/><text x=\"{xx:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{t:.0} %</text>",
            f.top - 6.0,
            base + 5.0,
            base + 19.0,
            xx = x(t / 100.0),
        );
    }
    let _ = writeln!(
        s,
        "<line class=\"axis\" x1=\"{l}\" x2=\"{}\" y1=\"{base}\" y2=\"{base}\" stroke=\"{INK}\"/><line class=\"axis\" x1=\"{l}\" x2=\"{l}\" y1=\"{}\" y2=\"{base}\" stroke=\"{INK}\"/><text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>",
        f.width - f.right,
        f.top - 6.0,
        f.left + plot_w / 2.0,
        f.height - 12.0,
        esc(&chart.axis),
        l = f.left,
    );
    s.push_str("</g>\n");
    let n = chart.series.len().max(1);
    let row = (base - f.top) / chart.categories.len().max(1) as f64;
    let bar_h = 12.0;
    for (ci, cat) in chart.categories.iter().enumerate() {
        let y0 = f.top + row * ci as f64 + (row - bar_h * n as f64) / 2.0;
        let (nmin, nmax) = chart
            .series
            .iter()
            .filter_map(|se| se.rates.get(ci).copied().flatten())
            .fold((u64::MAX, 0), |(a, b), r| (a.min(r.n), b.max(r.n)));
        let n_text = match (nmin, nmax) {
            (u64::MAX, _) => String::new(),
            (a, b) if a == b => format!("n = {a}"),
            (a, b) => format!("n = {a}–{b}"),
        };
        let mid = y0 + bar_h * n as f64 / 2.0;
        let _ = writeln!(
            s,
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\" font-size=\"12\">{}</text><text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\" font-size=\"10\" fill=\"#555555\">{n_text}</text>",
            f.left - 10.0,
            mid - 1.0,
            esc(cat),
            f.left - 10.0,
            mid + 11.0,
        );
        for (si, se) in chart.series.iter().enumerate() {
            let Some(r) = se.rates.get(ci).copied().flatten() else {
                continue;
            };
            let yb = y0 + bar_h * si as f64;
            let _ = writeln!(
                s,
                "<rect class=\"bar\" x=\"{l}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{:.1}\" fill=\"{}\"><title>{}: {:.1} % (n = {})</title></rect>",
                yb + 1.0,
                (x(r.value) - f.left).max(0.0),
                bar_h - 2.0,
                se.color,
                esc(&se.name),
                r.value * 100.0,
                r.n,
                l = f.left,
            );
            whisker_h(&mut s, yb + bar_h / 2.0, x(r.ci[0]), x(r.ci[1]), 2.5);
            // Values in a column right of the plot, where no whisker reaches.
            let _ = writeln!(
                s,
                "<text x=\"{:.1}\" y=\"{:.1}\" font-size=\"10\" text-anchor=\"end\">{:.0} %</text>",
                f.width - 8.0,
                yb + bar_h / 2.0 + 3.5,
                r.value * 100.0
            );
        }
    }
    s.push_str("</svg>\n");
    s
}

/// The strategies in `details`, in first-seen order.
fn strategies_of<'a>(details: &[&'a Detail]) -> Vec<&'a str> {
    let mut names: Vec<&str> = Vec::new();
    for d in details {
        if !names.contains(&d.strategy) {
            names.push(d.strategy);
        }
    }
    names
}

/// The report's main figure. With one budget: TSR, RSR and SFR of every strategy as grouped
/// bars. With several (`--sweep`): TSR against R, one line per strategy.
pub(crate) fn tsr_by_budget(report: &Report) -> String {
    let mut budgets: Vec<u32> = report.details.iter().map(|d| d.budget).collect();
    budgets.sort_unstable();
    budgets.dedup();
    let details: Vec<&Detail> = report.details.iter().collect();
    let names = strategies_of(&details);
    let episodes = report.results.first().map_or(0, |r| r.episodes);
    let c = &report.config;
    let setting = format!(
        "{} tasks × {} seeds, fault rate {}{}",
        c.tasks,
        c.seeds,
        c.fault_rate,
        if c.silent { ", silent setting" } else { "" }
    );
    if let [budget] = budgets[..] {
        let series = names
            .iter()
            .map(|&name| {
                let d = details.iter().find(|d| d.strategy == name);
                Series {
                    name: name.to_owned(),
                    color: strategy_color(name),
                    rates: match d {
                        Some(d) => vec![
                            Some(Rate::of(d.successes, episodes)),
                            Some(Rate::of(d.recovered, d.faulted)),
                            Some(Rate::of(d.silent_failures, episodes)),
                        ],
                        None => vec![None; 3],
                    },
                }
            })
            .collect();
        return grouped_bars(&Chart {
            title: format!("Outcomes by strategy at R = {budget}"),
            subtitle: format!(
                "{setting}; n = {episodes} episodes per strategy (RSR: the faulted ones); whiskers: Wilson 95 % intervals"
            ),
            axis: "share of episodes".into(),
            category_axis: String::new(),
            categories: vec![
                "TSR: task success".into(),
                "RSR: recovered when faulted".into(),
                "SFR: silent failure".into(),
            ],
            series,
        });
    }
    let series = names
        .iter()
        .map(|&name| Series {
            name: name.to_owned(),
            color: strategy_color(name),
            rates: budgets
                .iter()
                .map(|&b| {
                    details
                        .iter()
                        .find(|d| d.strategy == name && d.budget == b)
                        .map(|d| Rate::of(d.successes, episodes))
                })
                .collect(),
        })
        .collect();
    lines(&Chart {
        title: "Task success rate by recovery budget R".into(),
        subtitle: format!(
            "{setting}; n = {episodes} episodes per point; whiskers: Wilson 95 % intervals"
        ),
        axis: "task success rate (TSR)".into(),
        category_axis: "recovery actions allowed per failure (R)".into(),
        categories: budgets.iter().map(|b| b.to_string()).collect(),
        series,
    })
}

/// Risk against coverage at the largest budget: each strategy as a point — x the share of faulted
/// episodes answered wrongly as if correct, y the share recovered — with Wilson whiskers both
/// ways; the frontier (no other strategy recovers more with fewer silent failures) is joined by a
/// line and its points are ringed.
pub(crate) fn risk_coverage(report: &Report) -> String {
    let pts = &report.frontier;
    let budget = pts.first().map_or(0, |p| p.budget);
    let f = Frame {
        width: 760.0,
        height: 520.0,
        left: 70.0,
        top: 60.0,
        right: 170.0,
        bottom: 60.0,
    };
    let chart = Chart {
        title: format!("Risk and coverage at R = {budget}"),
        subtitle: if report.risk_curve.is_empty() {
            "faulted episodes: recovered (up) against answered wrongly as if correct (left is better); ringed: the frontier".into()
        } else {
            "faulted episodes: recovered against answered wrongly as if correct; ringed: the frontier; squares: self-healing by risk".into()
        },
        axis: String::new(),
        category_axis: String::new(),
        categories: Vec::new(),
        series: Vec::new(),
    };
    let ymax = 100.0;
    let xmax = pts
        .iter()
        .map(|p| p.silent_ci[1] * 100.0)
        .chain(report.risk_curve.iter().map(|p| p.silent * 100.0 + 1.0))
        .fold(5.0_f64, f64::max)
        .ceil();
    let xmax = (xmax / 5.0).ceil() * 5.0;
    let mut s = String::new();
    open(&mut s, &f, &chart);
    value_axis_left(&mut s, &f, 0.0, ymax, "recovered (RSR)");
    let pw = f.width - f.left - f.right;
    let ph = f.height - f.top - f.bottom;
    let x = |v: f64| f.left + v * 100.0 / xmax * pw;
    let y = |v: f64| f.top + (ymax - v * 100.0) / ymax * ph;
    let base = f.height - f.bottom;
    let mut t = 0.0;
    while t <= xmax + 1e-9 {
        let _ = writeln!(
            s,
            r#"<line x1="{xx:.1}" x2="{xx:.1}" y1="{base}" y2="{:.1}" stroke="{INK}"/><text x="{xx:.1}" y="{:.1}" text-anchor="middle">{t:.0} %</text>"#,
            base + 5.0,
            base + 19.0,
            xx = f.left + t / xmax * pw,
        );
        t += if xmax > 30.0 { 10.0 } else { 5.0 };
    }
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">silent: answered wrongly as if correct</text>"#,
        f.left + pw / 2.0,
        f.height - 14.0
    );
    let mut front: Vec<&crate::RiskPoint> = pts.iter().filter(|p| p.on_frontier).collect();
    front.sort_by(|a, b| a.silent.total_cmp(&b.silent));
    if front.len() > 1 {
        let path: Vec<String> = front
            .iter()
            .map(|p| format!("{:.1},{:.1}", x(p.silent), y(p.recovered)))
            .collect();
        let _ = writeln!(
            s,
            r##"<polyline class="frontier" fill="none" stroke="#999999" stroke-dasharray="4 3" points="{}"/>"##,
            path.join(" ")
        );
    }
    // Self-healing over its policy's `risk` setting: a line through its points, each marked
    // with a small square and its setting.
    let curve = &report.risk_curve;
    if !curve.is_empty() {
        let c = strategy_color("self-healing");
        let path: Vec<String> = curve
            .iter()
            .map(|p| format!("{:.1},{:.1}", x(p.silent), y(p.recovered)))
            .collect();
        let _ = writeln!(
            s,
            r#"<polyline class="risk-curve" fill="none" stroke="{c}" stroke-width="2" points="{}"/>"#,
            path.join(" ")
        );
        // Settings that land on the same point share one square and one label.
        let mut groups: Vec<(&crate::RiskSetting, Vec<String>)> = Vec::new();
        for p in curve {
            match groups.last_mut() {
                Some((q, risks)) if q.recovered == p.recovered && q.silent == p.silent => {
                    risks.push(p.risk.to_string());
                }
                _ => groups.push((p, vec![p.risk.to_string()])),
            }
        }
        for (p, risks) in groups {
            let (px, py) = (x(p.silent), y(p.recovered));
            let _ = writeln!(
                s,
                r#"<rect class="risk-setting" x="{:.1}" y="{:.1}" width="6" height="6" fill="{c}" stroke="{INK}" stroke-width="0.5"><title>self-healing at risk = {}: recovered {:.1} %, silent {:.1} %</title></rect><text x="{:.1}" y="{:.1}" font-size="10" fill="{INK}">risk {}</text>"#,
                (px - 3.0).max(f.left + 1.0),
                py - 3.0,
                risks.join(", "),
                p.recovered * 100.0,
                p.silent * 100.0,
                px + 8.0,
                py + 14.0,
                risks.join(", ")
            );
        }
    }
    let mut labels: Vec<(f64, &crate::RiskPoint)> = Vec::new();
    for p in pts {
        let c = strategy_color(p.strategy);
        let (px, py) = (x(p.silent), y(p.recovered));
        let _ = writeln!(
            s,
            r#"<line x1="{:.1}" x2="{:.1}" y1="{py:.1}" y2="{py:.1}" stroke="{c}"/><line x1="{px:.1}" x2="{px:.1}" y1="{:.1}" y2="{:.1}" stroke="{c}"/>"#,
            x(p.silent_ci[0]),
            x(p.silent_ci[1]),
            y(p.recovered_ci[0]),
            y(p.recovered_ci[1]),
        );
        if p.on_frontier {
            let _ = writeln!(
                s,
                r#"<circle cx="{px:.1}" cy="{py:.1}" r="8" fill="none" stroke="{INK}"/>"#
            );
        }
        let _ = writeln!(
            s,
            r#"<circle class="point" cx="{px:.1}" cy="{py:.1}" r="5" fill="{c}" stroke="white"><title>{}: recovered {:.1} %, silent {:.1} %</title></circle>"#,
            esc(p.strategy),
            p.recovered * 100.0,
            p.silent * 100.0
        );
        labels.push((py, p));
    }
    // Names in a column on the right, in the order of the points' heights, with leader lines.
    labels.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut at = f64::NEG_INFINITY;
    let lx = f.width - f.right + 20.0;
    for (py, p) in labels {
        at = py.max(at + 16.0);
        let _ = writeln!(
            s,
            r#"<path d="M{:.1} {py:.1}L{:.1} {at:.1}" stroke="{}" fill="none" stroke-opacity="0.5"/><text x="{lx:.1}" y="{:.1}">{}</text>"#,
            x(p.silent) + 6.0,
            lx - 4.0,
            strategy_color(p.strategy),
            at + 4.0,
            esc(p.strategy)
        );
    }
    s.push_str("</svg>\n");
    s
}

/// Recovery by failure class at the largest budget run: for each class met, the share of the
/// episodes that met it and still succeeded, per strategy.
pub(crate) fn recovery_by_class(report: &Report) -> String {
    let budget = report.details.iter().map(|d| d.budget).max().unwrap_or(0);
    let details: Vec<&Detail> = report
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
    let series = strategies_of(&details)
        .into_iter()
        .map(|name| Series {
            name: name.to_owned(),
            color: strategy_color(name),
            rates: classes
                .iter()
                .map(|c| {
                    details
                        .iter()
                        .find(|d| d.strategy == name)
                        .and_then(|d| d.by_class.get(c))
                        .filter(|r| r.met > 0)
                        .map(|r| Rate::of(r.succeeded, r.met))
                })
                .collect(),
        })
        .collect();
    horizontal_bars(&Chart {
        title: format!("Episodes that still succeeded, by failure class met (R = {budget})"),
        subtitle:
            "n: episodes of each strategy that met the class; whiskers: Wilson 95 % intervals"
                .into(),
        axis: "episodes that met the class and succeeded".into(),
        category_axis: String::new(),
        categories: classes.iter().map(|c| c.to_string()).collect(),
        series,
    })
}

/// The charts rendered to pixels (resvg), so that a chart that draws nothing, draws outside its
/// axes or squeezes its lines together fails here rather than in a reader's browser. With
/// `SELFHEAL_PLOTS_DIR` set, the PNGs are also written there to be looked at.
#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use crate::BenchConfig;
    use resvg::{tiny_skia, usvg};

    /// A rendered chart: RGBA pixels, row-major.
    struct Image {
        width: usize,
        height: usize,
        rgba: Vec<u8>,
        /// Whether any font was found, so that text could be drawn.
        fonts: bool,
    }

    impl Image {
        fn px(&self, x: usize, y: usize) -> [u8; 3] {
            let i = (y * self.width + x) * 4;
            [self.rgba[i], self.rgba[i + 1], self.rgba[i + 2]]
        }

        fn dark(&self, x: usize, y: usize) -> bool {
            let [r, g, b] = self.px(x, y);
            u32::from(r) + u32::from(g) + u32::from(b) < 3 * 200
        }

        /// Pixels of `color` (±6 per channel) inside the rectangle `[x0, x1) × [y0, y1)`, and
        /// the lowest and highest row they are on.
        fn count(
            &self,
            color: &str,
            (x0, y0, x1, y1): (f64, f64, f64, f64),
        ) -> (usize, usize, usize) {
            let want = rgb(color);
            let (mut n, mut top, mut bottom) = (0, usize::MAX, 0);
            for y in (y0.max(0.0) as usize)..(y1.min(self.height as f64) as usize) {
                for x in (x0.max(0.0) as usize)..(x1.min(self.width as f64) as usize) {
                    let p = self.px(x, y);
                    if p.iter().zip(want).all(|(a, b)| a.abs_diff(b) <= 6) {
                        n += 1;
                        top = top.min(y);
                        bottom = bottom.max(y);
                    }
                }
            }
            (n, top, bottom)
        }
    }

    /// Whether a colour can be told from anti-aliased black text (which has every grey).
    fn chromatic(color: &str) -> bool {
        let [r, g, b] = rgb(color);
        r.max(g).max(b) - r.min(g).min(b) > 40
    }

    fn rgb(color: &str) -> [u8; 3] {
        let hex = |i: usize| u8::from_str_radix(&color[i..i + 2], 16).unwrap();
        [hex(1), hex(3), hex(5)]
    }

    fn render(svg: &str, name: &str) -> Image {
        let mut opt = usvg::Options::default();
        opt.fontdb_mut().load_system_fonts();
        opt.fontdb_mut().set_sans_serif_family("DejaVu Sans");
        let fonts = !opt.fontdb.is_empty();
        let tree = usvg::Tree::from_str(svg, &opt).expect("the SVG parses");
        let size = tree.size().to_int_size();
        let mut pixmap = tiny_skia::Pixmap::new(size.width(), size.height()).unwrap();
        resvg::render(&tree, tiny_skia::Transform::default(), &mut pixmap.as_mut());
        if let Some(dir) = std::env::var_os("SELFHEAL_PLOTS_DIR") {
            let dir = std::path::PathBuf::from(dir);
            std::fs::create_dir_all(&dir).unwrap();
            // Twice the size, as a reader would see it on a high-density screen or in print.
            let mut big = tiny_skia::Pixmap::new(size.width() * 2, size.height() * 2).unwrap();
            resvg::render(
                &tree,
                tiny_skia::Transform::from_scale(2.0, 2.0),
                &mut big.as_mut(),
            );
            big.save_png(dir.join(format!("{name}.png"))).unwrap();
        }
        Image {
            width: size.width() as usize,
            height: size.height() as usize,
            rgba: pixmap.data().to_vec(),
            fonts,
        }
    }

    fn report(sweep: bool) -> Report {
        let config = BenchConfig {
            seeds: 2,
            tasks: 50,
            sweep,
            ..BenchConfig::default()
        };
        crate::run(&config, &mut |_, _| {}, None)
    }

    /// The value axis (a vertical line at `x`) and the base line (at `y`) are drawn along the
    /// whole plot area.
    fn assert_axes(img: &Image, f: &Frame, name: &str) {
        let (x, base) = (f.left as usize, (f.height - f.bottom) as usize);
        let rows = (f.top as usize + 2)..(base - 2);
        let on_axis = rows
            .clone()
            .filter(|&y| img.dark(x, y) || img.dark(x - 1, y))
            .count();
        assert!(
            on_axis * 10 >= rows.len() * 9,
            "{name}: no value axis at x = {x}"
        );
        let cols = (f.left as usize + 2)..((f.width - f.right) as usize - 2);
        let on_base = cols
            .clone()
            .filter(|&c| img.dark(c, base) || img.dark(c, base - 1))
            .count();
        assert!(
            on_base * 10 >= cols.len() * 9,
            "{name}: no base line at y = {base}"
        );
    }

    /// Text was drawn left of the plot area (tick labels) and above it (title), when a font is
    /// there to draw it with.
    fn assert_labels(img: &Image, f: &Frame, name: &str) {
        if !img.fonts {
            return;
        }
        let dark_in = |x0: usize, y0: usize, x1: usize, y1: usize| {
            (y0..y1)
                .flat_map(|y| (x0..x1).map(move |x| (x, y)))
                .filter(|&(x, y)| img.dark(x, y))
                .count()
        };
        assert!(dark_in(0, 0, img.width, 30) > 200, "{name}: no title");
        assert!(
            dark_in(
                0,
                f.top as usize,
                f.left as usize - 4,
                (f.height - f.bottom) as usize
            ) > 200,
            "{name}: no labels left of the plot"
        );
    }

    #[test]
    fn single_budget_chart_is_grouped_bars_inside_the_axes() {
        let r = report(false);
        let svg = tsr_by_budget(&r);
        let names = strategies_of(&r.details.iter().collect::<Vec<_>>());
        // A bar, a whisker and a value per strategy and metric.
        assert_eq!(svg.matches("class=\"bar\"").count(), 3 * names.len());
        assert_eq!(svg.matches("class=\"whisker\"").count(), 3 * names.len());
        let chart = Chart {
            categories: vec![String::new(); 3],
            series: vec![
                Series {
                    name: String::new(),
                    color: "",
                    rates: vec![]
                };
                names.len()
            ],
            ..empty_chart()
        };
        let f = grouped_bars_frame(&chart);
        let img = render(&svg, "outcomes-one-budget");
        assert_axes(&img, &f, "bars");
        assert_labels(&img, &f, "bars");
        let plot = (f.left, f.top, f.width - f.right, f.height - f.bottom);
        for name in names {
            let color = strategy_color(name);
            let (inside, _, bottom) = img.count(color, plot);
            // The weakest strategy still succeeds in over half the episodes: a tall bar.
            assert!(
                inside > 1000,
                "{name}: {inside} pixels of its colour in the plot"
            );
            assert!(
                bottom + 3 >= (f.height - f.bottom) as usize,
                "{name}: bar not on the base line"
            );
            if chromatic(color) {
                let below = img.count(color, (0.0, f.height - f.bottom + 2.0, f.width, f.height));
                assert_eq!(below.0, 0, "{name}: drawn below the axis");
            }
        }
    }

    #[test]
    fn sweep_chart_fits_its_value_axis_to_the_lines() {
        let r = report(true);
        let svg = tsr_by_budget(&r);
        let details: Vec<&Detail> = r.details.iter().collect();
        let names = strategies_of(&details);
        let f = lines_frame(&empty_chart());
        let img = render(&svg, "tsr-by-budget-sweep");
        assert_axes(&img, &f, "lines");
        assert_labels(&img, &f, "lines");
        let plot = (f.left, f.top, f.width - f.right, f.height - f.bottom);
        let (mut top, mut bottom) = (usize::MAX, 0);
        for name in &names {
            let (n, t, b) = img.count(strategy_color(name), plot);
            assert!(n > 100, "{name}: its line is not in the plot ({n} pixels)");
            top = top.min(t);
            bottom = bottom.max(b);
            if chromatic(strategy_color(name)) {
                let left_of = img.count(strategy_color(name), (0.0, 0.0, f.left - 1.0, f.height));
                assert_eq!(left_of.0, 0, "{name}: drawn left of the axis");
            }
        }
        // The best and the worst strategy are far apart: the axis is not 0–100 % with every
        // line squeezed into its top third.
        let plot_h = f.height - f.top - f.bottom;
        assert!(
            (bottom - top) as f64 > 0.5 * plot_h,
            "lines span {} of {plot_h} px",
            bottom - top
        );
    }

    /// Issue 32, item 7: self-healing's curve over its risk setting is drawn inside the plot
    /// area, in its colour, and the strategies' points are still there.
    #[test]
    fn risk_chart_draws_self_healings_curve_inside_its_axes() {
        let r = report(true);
        assert!(!r.risk_curve.is_empty());
        let svg = risk_coverage(&r);
        let img = render(&svg, "risk-coverage-sweep");
        let f = Frame {
            width: 760.0,
            height: 520.0,
            left: 70.0,
            top: 60.0,
            right: 170.0,
            bottom: 60.0,
        };
        let plot = (f.left, f.top, f.width - f.right, f.height - f.bottom);
        let (n, _, _) = img.count(strategy_color("self-healing"), plot);
        // The points alone are about 80 pixels; the curve and its squares add more.
        let without = render(
            &risk_coverage(&Report {
                risk_curve: Vec::new(),
                ..r.clone()
            }),
            "risk-coverage",
        );
        let (m, _, _) = without.count(strategy_color("self-healing"), plot);
        assert!(n > m + 100, "the curve adds {} pixels", n.saturating_sub(m));
        let left_of = img.count(
            strategy_color("self-healing"),
            (0.0, 0.0, f.left - 1.0, f.height),
        );
        assert_eq!(left_of.0, 0, "drawn left of the axis");
        for name in ["static", "full-replan+verify"] {
            assert!(
                img.count(strategy_color(name), plot).0 > 20,
                "{name} is missing"
            );
        }
    }

    #[test]
    fn class_chart_has_an_axis_tick_labels_and_n() {
        let r = report(false);
        let svg = recovery_by_class(&r);
        for t in ["0 %", "20 %", "100 %"] {
            assert!(svg.contains(&format!(">{t}</text>")), "no tick label {t}");
        }
        assert!(svg.contains(">n = "), "no n per class");
        let budget = r.details.iter().map(|d| d.budget).max().unwrap_or(0);
        let details: Vec<&Detail> = r.details.iter().filter(|d| d.budget == budget).collect();
        let classes = FailureClass::ALL
            .into_iter()
            .filter(|c| {
                details
                    .iter()
                    .any(|d| d.by_class.get(c).is_some_and(|x| x.met > 0))
            })
            .count();
        let names = strategies_of(&details);
        let chart = Chart {
            categories: vec![String::new(); classes],
            series: vec![
                Series {
                    name: String::new(),
                    color: "",
                    rates: vec![]
                };
                names.len()
            ],
            ..empty_chart()
        };
        let f = horizontal_bars_frame(&chart);
        let img = render(&svg, "recovery-by-class");
        assert_axes(&img, &f, "classes");
        assert_labels(&img, &f, "classes");
        let healing = strategy_color("self-healing");
        let (inside, _, _) = img.count(
            healing,
            (f.left, f.top, f.width - f.right, f.height - f.bottom),
        );
        assert!(inside > 500, "self-healing bars: {inside} pixels");
        let left_of = img.count(healing, (0.0, f.top, f.left - 1.0, f.height));
        assert_eq!(left_of.0, 0, "bars drawn left of the axis");
    }

    #[test]
    fn fitted_range_shows_differences_and_stays_in_bounds() {
        let series = |vals: &[f64]| {
            vec![Series {
                name: "s".into(),
                color: "#000000",
                rates: vals
                    .iter()
                    .map(|&v| {
                        Some(Rate {
                            value: v,
                            ci: [v - 0.02, (v + 0.02).min(1.0)],
                            n: 1000,
                        })
                    })
                    .collect(),
            }]
        };
        assert_eq!(fitted_range(&series(&[0.70, 0.85, 1.0])), (65.0, 100.0));
        let (lo, hi) = fitted_range(&series(&[0.99, 1.0]));
        assert!(hi == 100.0 && hi - lo >= 10.0 && lo > 50.0, "{lo}–{hi}");
        let (lo, hi) = fitted_range(&series(&[0.03, 0.05]));
        assert!(lo == 0.0 && hi <= 20.0, "{lo}–{hi}");
        assert_eq!(fitted_range(&[]), (0.0, 100.0));
    }

    #[test]
    fn labels_are_escaped() {
        let svg = grouped_bars(&Chart {
            title: "a < b & c".into(),
            categories: vec!["x".into()],
            series: vec![Series {
                name: "<s>".into(),
                color: "#000000",
                rates: vec![Some(Rate::of(1, 2))],
            }],
            ..empty_chart()
        });
        assert!(svg.contains("a &lt; b &amp; c") && svg.contains("&lt;s&gt;"));
        render(&svg, "escaped");
    }

    fn empty_chart() -> Chart {
        Chart {
            title: String::new(),
            subtitle: String::new(),
            axis: String::new(),
            category_axis: String::new(),
            categories: Vec::new(),
            series: Vec::new(),
        }
    }
}
