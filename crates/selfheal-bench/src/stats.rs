//! Paired statistics: the exact McNemar test and a paired bootstrap clustered by task.
//!
//! Why paired: every strategy meets the same schedule on the same `(seed, task)` episodes, so
//! the honest question is "on the same episodes, how often does A succeed where B fails and the
//! reverse?", not whether two independent proportions differ. Why clustered by task: the seeds of
//! one task share its plan and its tools, so they are not independent draws; resampling whole
//! tasks keeps that dependence in the interval.

use selfheal_core::{Rng, SplitMix64};

/// One episode seen by two strategies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Pair {
    /// The cluster (task index).
    pub cluster: usize,
    /// Whether the episode met a fault.
    pub faulted: bool,
    /// A succeeded.
    pub a_success: bool,
    /// B succeeded.
    pub b_success: bool,
    /// A returned a wrong answer as correct.
    pub a_silent: bool,
    /// B returned a wrong answer as correct.
    pub b_silent: bool,
}

/// A difference and its 95 % interval.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Diff {
    /// A − B.
    pub diff: f64,
    /// Lower bound.
    pub lo: f64,
    /// Upper bound.
    pub hi: f64,
}

/// A paired comparison of A against B.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Comparison {
    /// RSR difference (faulted episodes).
    pub rsr: Diff,
    /// TSR difference.
    pub tsr: Diff,
    /// SFR difference.
    pub sfr: Diff,
    /// Episodes only A solved.
    pub only_a: u64,
    /// Episodes only B solved.
    pub only_b: u64,
    /// Exact two-sided McNemar p-value.
    pub mcnemar_p: f64,
}

/// The exact two-sided McNemar p-value for `b` and `c` discordant pairs.
pub(crate) fn mcnemar_exact(b: u64, c: u64) -> f64 {
    let n = b + c;
    if n == 0 {
        return 1.0;
    }
    let k = b.min(c);
    // P(X ≤ k) for X ~ Bin(n, 1/2), summed in log space.
    let ln_half_n = -(n as f64) * std::f64::consts::LN_2;
    let mut ln_choose = 0.0f64; // ln C(n, 0)
    let mut tail = 0.0;
    for i in 0..=k {
        if i > 0 {
            ln_choose += ((n - i + 1) as f64).ln() - (i as f64).ln();
        }
        tail += (ln_choose + ln_half_n).exp();
    }
    (2.0 * tail).min(1.0)
}

#[derive(Debug, Clone, Copy, Default)]
struct Sums {
    n: f64,
    nf: f64,
    a: f64,
    b: f64,
    af: f64,
    bf: f64,
    asil: f64,
    bsil: f64,
}

impl Sums {
    fn add(&mut self, o: &Sums) {
        self.n += o.n;
        self.nf += o.nf;
        self.a += o.a;
        self.b += o.b;
        self.af += o.af;
        self.bf += o.bf;
        self.asil += o.asil;
        self.bsil += o.bsil;
    }

    fn diffs(&self) -> (f64, f64, f64) {
        let per = |x: f64, d: f64| if d > 0.0 { x / d } else { 0.0 };
        (
            per(self.af - self.bf, self.nf),
            per(self.a - self.b, self.n),
            per(self.asil - self.bsil, self.n),
        )
    }
}

fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// Compares A with B on `pairs` (clusters `0..n_clusters`), with 2,000 bootstrap resamples
/// drawn from `seed`.
pub(crate) fn compare(pairs: &[Pair], n_clusters: usize, seed: u64) -> Comparison {
    let mut per: Vec<Sums> = vec![Sums::default(); n_clusters.max(1)];
    let (mut only_a, mut only_b) = (0u64, 0u64);
    for p in pairs {
        let Some(s) = per.get_mut(p.cluster) else {
            continue;
        };
        let f = |x: bool| f64::from(u8::from(x));
        s.n += 1.0;
        s.a += f(p.a_success);
        s.b += f(p.b_success);
        s.asil += f(p.a_silent);
        s.bsil += f(p.b_silent);
        if p.faulted {
            s.nf += 1.0;
            s.af += f(p.a_success);
            s.bf += f(p.b_success);
        }
        only_a += u64::from(p.a_success && !p.b_success);
        only_b += u64::from(!p.a_success && p.b_success);
    }
    let mut all = Sums::default();
    per.iter().for_each(|s| all.add(s));
    let (rsr, tsr, sfr) = all.diffs();
    let mut rng = SplitMix64::new(seed ^ 0xB007_57A9);
    let reps = 2_000;
    let (mut rs, mut ts, mut ss) = (
        Vec::with_capacity(reps),
        Vec::with_capacity(reps),
        Vec::with_capacity(reps),
    );
    let k = per.len() as u64;
    for _ in 0..reps {
        let mut acc = Sums::default();
        for _ in 0..k {
            acc.add(&per[rng.below(k) as usize]);
        }
        let (r, t, s) = acc.diffs();
        rs.push(r);
        ts.push(t);
        ss.push(s);
    }
    for v in [&mut rs, &mut ts, &mut ss] {
        v.sort_by(f64::total_cmp);
    }
    let diff = |d: f64, v: &[f64]| Diff {
        diff: d,
        lo: percentile(v, 0.025),
        hi: percentile(v, 0.975),
    };
    Comparison {
        rsr: diff(rsr, &rs),
        tsr: diff(tsr, &ts),
        sfr: diff(sfr, &ss),
        only_a,
        only_b,
        mcnemar_p: mcnemar_exact(only_a, only_b),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mcnemar_matches_the_binomial() {
        // 10 vs 0 discordant pairs: p = 2 / 2^10.
        assert!((mcnemar_exact(10, 0) - 2.0 / 1024.0).abs() < 1e-12);
        assert_eq!(mcnemar_exact(0, 0), 1.0);
        assert_eq!(mcnemar_exact(5, 5), 1.0);
        assert!(mcnemar_exact(30, 10) < 0.01);
    }

    #[test]
    fn bootstrap_interval_brackets_the_difference() {
        let pairs: Vec<Pair> = (0..200)
            .map(|i| Pair {
                cluster: i % 20,
                faulted: i % 2 == 0,
                a_success: i % 3 != 0,
                b_success: i % 4 != 0,
                a_silent: false,
                b_silent: i % 4 == 0 && i % 8 == 0,
            })
            .collect();
        let c = compare(&pairs, 20, 1);
        assert!(c.tsr.lo <= c.tsr.diff && c.tsr.diff <= c.tsr.hi);
        assert!(c.sfr.diff < 0.0);
        assert_eq!(compare(&pairs, 20, 1), c, "deterministic");
    }
}
