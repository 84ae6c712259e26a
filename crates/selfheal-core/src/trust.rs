//! Trust learned from evidence: how likely a source's value is to be right.
//!
//! # Why this module exists
//!
//! A recovered value that nothing could check (a substitute's answer while the primary is down,
//! a retry's answer whose second source cannot be read) is either claimed or withheld. A fixed
//! rule cannot be right for both a good substitute and a wrong one; what the runs have *seen* of
//! that source can. This module keeps, per source — a tool, a second source (a tool under its
//! own name) or an upstream target — a Beta-style posterior over the chance that a value it
//! gives is right, updated by evidence the runs report, decaying with time, and capped so that
//! old evidence cannot outweigh what happens now. The policy's `risk` setting reads it
//! ([`crate::policy::Policy::claims_unverified`]): a value is claimed when its chance of being
//! right is at least `1 − risk`.
//!
//! The store outlives a run. A front-end keeps one per process (or per benchmark deployment),
//! hands a copy to each run it starts (`ControllerConfig::trust`), and applies the evidence the
//! run reports ([`Trust::apply`]) when it takes it back (`Run::take_trust_evidence`). Sans-IO:
//! time arrives as `now_ms`.
//!
//! # Evidence
//!
//! | evidence | right | wrong | why |
//! |---|---:|---:|---|
//! | a cross-check agreed | 1 | – | two independent sources gave the same value: both sides |
//! | a cross-check disagreed | – | ½ | one of two sources is wrong and nothing says which: each side takes half |
//! | a verifier accepted / rejected | 1 / – | – / 1 | a judgement of this source's value |
//! | a contract breach (unreadable, drifted, empty, stale body) | – | 1 | the source's output was wrong in a way that shows |
//! | a value changed on a re-read | – | 1 | the source did not give a settled value |
//! | an outage / an outage that ended | – | – | availability, not correctness: counted apart ([`Posterior::down`], [`Posterior::up`]) |
//! | a disagreement settled for it / against it | – | −½ / +½ | a later read showed which side changed its value to agree: the side that changed was wrong, and the half-blame moves to it |
//! | a value it agreed on was rejected later | −1 | 1 | the agreement was on a wrong value: taken back, and the value counted wrong for both sides |
//!
//! An outage of the primary is not evidence about its substitute, nor about the primary's
//! values once it answers: availability and correctness are kept apart.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The layout version of a serialised [`Trust`] store.
pub const TRUST_VERSION: u32 = 1;

/// Most sources a store keeps; the one seen longest ago is dropped first.
pub const MAX_SOURCES: usize = 1024;

/// Most evidence reports a run holds before the oldest is dropped.
pub(crate) const MAX_PENDING: usize = 512;

/// How the posterior is formed: the prior, the decay and the cap (`[policy.trust]`).
///
/// The defaults are chosen from principle, not fitted to any benchmark file:
///
/// - **Prior** `Beta(9.6, 0.4)`: mean 0.96, strength 10. A second source is asked because
///   something already went wrong, and a value claimed wrong costs more than a recovery withheld
///   (refuse rather than guess): a source with no record stands *below* the default threshold
///   of 0.99, so its unchecked values are not claimed until evidence earns it — about thirty
///   agreeing cross-checks or accepting verdicts with nothing against it. One disagreement (half
///   the blame) takes it to 0.91. With these defaults a single run behaves as
///   `accept_unverified_recovery = false` did; what changes is what a process (or a benchmark
///   deployment) learns across runs. `Beta(19.9, 0.1)` (mean 0.995) is the optimistic
///   alternative: it claims a substitute nothing speaks against (measured in the CHANGELOG).
/// - **Half-life** one hour: incidents last minutes to hours; yesterday's evidence says little
///   about today.
/// - **Cap** 50 observations of evidence (after decay): the prior and the last few dozen
///   observations always matter, so a long good record cannot hide a source that just turned.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TrustConfig {
    /// Prior pseudo-count of right values (`α₀` > 0).
    pub prior_right: f64,
    /// Prior pseudo-count of wrong values (`β₀` > 0).
    pub prior_wrong: f64,
    /// Evidence loses half its weight every this many milliseconds (0: never decays).
    pub half_life_ms: u64,
    /// Most evidence (right + wrong, after decay) a source holds; more is scaled down to it.
    pub cap: f64,
}

impl Default for TrustConfig {
    fn default() -> Self {
        TrustConfig {
            prior_right: 9.6,
            prior_wrong: 0.4,
            half_life_ms: 3_600_000,
            cap: 50.0,
        }
    }
}

impl TrustConfig {
    /// Appends every problem with these parameters to `out`.
    pub fn problems(&self, out: &mut Vec<String>) {
        if !(self.prior_right.is_finite() && self.prior_right > 0.0) {
            out.push(format!(
                "trust.prior_right must be a number > 0, got {}",
                self.prior_right
            ));
        }
        if !(self.prior_wrong.is_finite() && self.prior_wrong > 0.0) {
            out.push(format!(
                "trust.prior_wrong must be a number > 0, got {}",
                self.prior_wrong
            ));
        }
        if !(self.cap.is_finite() && self.cap >= 1.0) {
            out.push(format!("trust.cap must be a number ≥ 1, got {}", self.cap));
        }
    }

    /// The chance a source with no evidence gives a right value.
    pub fn prior_mean(&self) -> f64 {
        self.prior_right / (self.prior_right + self.prior_wrong)
    }
}

/// What kind of source a posterior is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SourceKind {
    /// A tool, by name; a second source is a tool under its own name.
    Tool,
    /// An upstream target of the gateway (a model endpoint), by name.
    Upstream,
}

/// A source: what trust is about.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Source {
    /// Its kind.
    pub kind: SourceKind,
    /// Its name.
    pub name: String,
}

impl Source {
    /// A tool (or a second source) by name.
    pub fn tool(name: &str) -> Source {
        Source {
            kind: SourceKind::Tool,
            name: name.to_owned(),
        }
    }

    /// An upstream target by name.
    pub fn upstream(name: &str) -> Source {
        Source {
            kind: SourceKind::Upstream,
            name: name.to_owned(),
        }
    }

    /// This source under `scope`: its name prefixed by the scope (length-prefixed, so that no
    /// scope's names can be read as another's). A front-end that serves several tenants keeps
    /// one store and each tenant's sources under the tenant's scope: two applications' tools
    /// named alike are different tools, and what one tenant's runs saw must not decide what
    /// another's claim ([`Trust::scope`]).
    pub fn scoped(&self, scope: &str) -> Source {
        Source {
            kind: self.kind,
            name: format!("{}{}", scope_prefix(scope), self.name),
        }
    }

    /// The source [`Source::scoped`] made under `scope`, with the scope taken off; `None`
    /// for a source of another scope (or of none).
    pub fn unscoped(&self, scope: &str) -> Option<Source> {
        let name = self.name.strip_prefix(&scope_prefix(scope))?;
        Some(Source {
            kind: self.kind,
            name: name.to_owned(),
        })
    }

    fn key(&self) -> String {
        match self.kind {
            SourceKind::Tool => format!("tool:{}", self.name),
            SourceKind::Upstream => format!("upstream:{}", self.name),
        }
    }
}

/// What a source's name starts with under `scope` ([`Source::scoped`]): the scope, length
/// first, so that no scope's names can be read as another's.
fn scope_prefix(scope: &str) -> String {
    format!("{}:{scope}:", scope.len())
}

/// One piece of evidence about a source (see the module documentation for its weights).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Evidence {
    /// A cross-check against another source agreed.
    Agreed,
    /// A cross-check against another source disagreed.
    Disagreed,
    /// A verifier accepted the source's value.
    Accepted,
    /// A verifier rejected the source's value.
    Rejected,
    /// The source's output broke its contract (unreadable, drifted, empty, stale).
    ContractBreach,
    /// The source's value changed when read again.
    ChangedOnReread,
    /// The source was unavailable (timed out, refused, down).
    Outage,
    /// The source answered after being unavailable.
    OutageEnded,
    /// A disagreement it had taken half the blame for was settled for it: the other source
    /// changed its value to agree with this one's (half a wrong value taken back).
    Vindicated,
    /// A disagreement it had taken half the blame for was settled against it: it changed its
    /// own value to agree with the other source's (the other half of a wrong value).
    Convicted,
    /// A value it had agreed on (a cross-check both sides passed) was later rejected by a
    /// verifier: the agreement is taken back and the value counted wrong.
    AgreedWrongly,
}

impl Evidence {
    /// The (right, wrong, up, down) weights of this evidence.
    fn weights(self) -> (f64, f64, f64, f64) {
        match self {
            Evidence::Agreed | Evidence::Accepted => (1.0, 0.0, 0.0, 0.0),
            Evidence::Disagreed => (0.0, 0.5, 0.0, 0.0),
            Evidence::Rejected | Evidence::ContractBreach | Evidence::ChangedOnReread => {
                (0.0, 1.0, 0.0, 0.0)
            }
            Evidence::Outage => (0.0, 0.0, 0.0, 1.0),
            Evidence::OutageEnded => (0.0, 0.0, 1.0, 0.0),
            Evidence::Vindicated => (0.0, -0.5, 0.0, 0.0),
            Evidence::Convicted => (0.0, 0.5, 0.0, 0.0),
            Evidence::AgreedWrongly => (-1.0, 1.0, 0.0, 0.0),
        }
    }
}

/// One report of evidence a run made: what, about whom, when.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Report {
    /// The source.
    pub source: Source,
    /// The evidence.
    pub evidence: Evidence,
    /// When (the run's clock).
    pub at_ms: u64,
}

/// The evidence held about one source, decayed to `at_ms`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Posterior {
    /// Weight of evidence that its values were right.
    pub right: f64,
    /// Weight of evidence that its values were wrong.
    pub wrong: f64,
    /// Weight of evidence that it answered after an outage (availability only).
    pub up: f64,
    /// Weight of evidence that it was unavailable (availability only).
    pub down: f64,
    /// When these weights were last brought up to date.
    pub at_ms: u64,
}

impl Posterior {
    /// These weights decayed to `now_ms` and capped under `config`.
    fn at(&self, now_ms: u64, config: &TrustConfig) -> Posterior {
        let mut p = *self;
        if config.half_life_ms > 0 && now_ms > self.at_ms {
            let f = 0.5f64.powf((now_ms - self.at_ms) as f64 / config.half_life_ms as f64);
            p.right *= f;
            p.wrong *= f;
            p.up *= f;
            p.down *= f;
        }
        p.at_ms = p.at_ms.max(now_ms);
        let total = p.right + p.wrong;
        if total > config.cap && total > 0.0 {
            let s = config.cap / total;
            p.right *= s;
            p.wrong *= s;
        }
        let avail = p.up + p.down;
        if avail > config.cap && avail > 0.0 {
            let s = config.cap / avail;
            p.up *= s;
            p.down *= s;
        }
        p
    }

    /// These weights as of `now_ms` (on the same clock as [`Posterior::at_ms`]): decayed by
    /// `config`'s half-life and capped, as the store reads them.
    pub fn decayed(&self, now_ms: u64, config: &TrustConfig) -> Posterior {
        self.at(now_ms, config)
    }

    /// The posterior mean of the chance a value of this source is right, under `config`'s prior.
    pub fn mean(&self, config: &TrustConfig) -> f64 {
        let a = config.prior_right + self.right;
        let b = config.prior_wrong + self.wrong;
        a / (a + b)
    }
}

/// A store of trust, per source: outlives runs, serialises with a version.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Trust {
    /// [`TRUST_VERSION`] when written.
    #[serde(default = "version")]
    pub version: u32,
    sources: BTreeMap<String, (Source, Posterior)>,
}

fn version() -> u32 {
    TRUST_VERSION
}

/// Why bytes could not be read back as a [`Trust`] store.
#[derive(Debug, thiserror::Error)]
pub enum TrustError {
    /// Written by another layout.
    #[error("trust store version {found} is not the version this build reads ({expected})")]
    Version {
        /// The bytes'.
        found: u32,
        /// This build's.
        expected: u32,
    },
    /// Not a store.
    #[error("trust store unreadable: {0}")]
    Unreadable(#[from] serde_json::Error),
}

impl Trust {
    /// An empty store: every source stands at the prior.
    pub fn new() -> Trust {
        Trust {
            version: TRUST_VERSION,
            sources: BTreeMap::new(),
        }
    }

    /// The entry of `source`, made (empty) when new; a new source past [`MAX_SOURCES`] first
    /// evicts the source seen longest ago.
    fn entry(&mut self, source: &Source) -> &mut (Source, Posterior) {
        let key = source.key();
        if !self.sources.contains_key(&key)
            && self.sources.len() >= MAX_SOURCES
            && let Some(oldest) = self
                .sources
                .iter()
                .min_by_key(|(_, (_, p))| p.at_ms)
                .map(|(k, _)| k.clone())
        {
            self.sources.remove(&oldest);
        }
        self.sources
            .entry(key)
            .or_insert_with(|| (source.clone(), Posterior::default()))
    }

    /// Records one piece of evidence about `source` at `now_ms`.
    pub fn observe(
        &mut self,
        source: &Source,
        evidence: Evidence,
        now_ms: u64,
        config: &TrustConfig,
    ) {
        let entry = self.entry(source);
        let mut p = entry.1.at(now_ms, config);
        let (r, w, u, d) = evidence.weights();
        // Evidence taken back takes back at most what is left of it after decay.
        p.right = (p.right + r).max(0.0);
        p.wrong = (p.wrong + w).max(0.0);
        p.up += u;
        p.down += d;
        entry.1 = p.at(now_ms, config);
    }

    /// Adds evidence weighed elsewhere about `source` — another process's own evidence, its
    /// time moved onto this store's clock — to this store's: both decayed to the later of their
    /// two times, the weights (right, wrong, up, down) summed, then capped. Evidence is counts,
    /// so merging is adding them: for this to count every observation once, `evidence` must
    /// hold only observations this store does not already have (a replica shares its *own*
    /// evidence, never what it merged from others).
    pub fn merge(&mut self, source: &Source, evidence: &Posterior, config: &TrustConfig) {
        let entry = self.entry(source);
        let now = entry.1.at_ms.max(evidence.at_ms);
        let mut p = entry.1.at(now, config);
        let q = evidence.at(now, config);
        p.right += q.right;
        p.wrong += q.wrong;
        p.up += q.up;
        p.down += q.down;
        entry.1 = p.at(now, config);
    }

    /// Brings every source of `other` up to at least `other`'s evidence: both decayed to the
    /// later of their two times, each weight (right, wrong, up, down) the larger of the two.
    /// For evidence that may already be in this store (a run's own evidence, which the run
    /// also reported to the store it is resumed from): none of it is counted twice, and none
    /// of it is lost when the store has not got it yet.
    pub fn cover(&mut self, other: &Trust, config: &TrustConfig) {
        for (source, q) in other.sources() {
            let entry = self.entry(source);
            let now = entry.1.at_ms.max(q.at_ms);
            let mut p = entry.1.at(now, config);
            let q = q.at(now, config);
            p.right = p.right.max(q.right);
            p.wrong = p.wrong.max(q.wrong);
            p.up = p.up.max(q.up);
            p.down = p.down.max(q.down);
            entry.1 = p.at(now, config);
        }
    }

    /// Applies reports a run made (in order).
    pub fn apply(&mut self, reports: &[Report], config: &TrustConfig) {
        for r in reports {
            self.observe(&r.source, r.evidence, r.at_ms, config);
        }
    }

    /// Applies reports a run of `scope` made (in order), each about its source under the
    /// scope ([`Source::scoped`]).
    pub fn apply_scoped(&mut self, scope: &str, reports: &[Report], config: &TrustConfig) {
        for r in reports {
            self.observe(&r.source.scoped(scope), r.evidence, r.at_ms, config);
        }
    }

    /// What this store holds under `scope`, as a store of its own with the scope taken off the
    /// names: what a run of that scope starts from. Sources of other scopes (or of none) are
    /// not in it.
    pub fn scope(&self, scope: &str) -> Trust {
        let prefix = scope_prefix(scope);
        let mut out = Trust::new();
        for (source, p) in self.sources() {
            if let Some(name) = source.name.strip_prefix(&prefix) {
                let own = Source {
                    kind: source.kind,
                    name: name.to_owned(),
                };
                out.sources.insert(own.key(), (own, *p));
            }
        }
        out
    }

    /// The evidence about `source` as of `now_ms` (none: all zero).
    pub fn posterior(&self, source: &Source, now_ms: u64, config: &TrustConfig) -> Posterior {
        self.sources
            .get(&source.key())
            .map_or_else(Posterior::default, |(_, p)| p.at(now_ms, config))
    }

    /// The estimated chance that a value `source` gives now is right.
    pub fn p_right(&self, source: &Source, now_ms: u64, config: &TrustConfig) -> f64 {
        self.posterior(source, now_ms, config).mean(config)
    }

    /// The sources held, with their evidence as last updated.
    pub fn sources(&self) -> impl Iterator<Item = (&Source, &Posterior)> {
        self.sources.values().map(|(s, p)| (s, p))
    }

    /// The store as versioned JSON bytes.
    pub fn to_bytes(&self) -> Result<Vec<u8>, serde_json::Error> {
        let mut t = self.clone();
        t.version = TRUST_VERSION;
        serde_json::to_vec(&t)
    }

    /// A store read back from [`Trust::to_bytes`]; another version is refused.
    pub fn from_bytes(bytes: &[u8]) -> Result<Trust, TrustError> {
        let t: Trust = serde_json::from_slice(bytes)?;
        if t.version != TRUST_VERSION {
            return Err(TrustError::Version {
                found: t.version,
                expected: TRUST_VERSION,
            });
        }
        Ok(t)
    }
}

/// One trust store shared by the runs of a process (the runtime's agent, the gateway, the MCP
/// proxy): each run starts from a [`Shared::snapshot`] and hands its evidence back with
/// [`Shared::report`]. Cloning shares the store. No clock is read here: a front-end whose runs
/// keep their own clocks (each starting at 0) passes the run's start on its process clock as
/// `offset_ms`, so that evidence from runs far apart decays as it should.
#[derive(Debug, Clone, Default)]
pub struct Shared(std::sync::Arc<std::sync::Mutex<Trust>>);

impl Shared {
    /// An empty shared store.
    pub fn new() -> Shared {
        Shared::default()
    }

    /// A shared store starting from `trust`.
    pub fn from_trust(trust: Trust) -> Shared {
        Shared(std::sync::Arc::new(std::sync::Mutex::new(trust)))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Trust> {
        // A run that panicked while holding the lock left a store that is still a store.
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A copy of the store now, for a run to start from.
    pub fn snapshot(&self) -> Trust {
        self.lock().clone()
    }

    /// Applies a run's evidence, its times shifted by `offset_ms` onto the process clock.
    pub fn report(&self, reports: &[Report], offset_ms: u64, config: &TrustConfig) {
        let mut t = self.lock();
        for r in reports {
            t.observe(
                &r.source,
                r.evidence,
                r.at_ms.saturating_add(offset_ms),
                config,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A run's own evidence covering the store it resumes from: counted once whether the store
    /// already holds it or not, and a source only the store knows is left as it is.
    #[test]
    fn cover_counts_evidence_the_store_has_once_and_keeps_what_it_lacks() {
        let c = TrustConfig::default();
        let (s, other) = (Source::tool("search"), Source::tool("other"));
        let mut own = Trust::new();
        own.observe(&s, Evidence::Disagreed, 10, &c);
        own.observe(&s, Evidence::Disagreed, 10, &c);
        // The store got the run's reports, and one more piece of evidence of its own.
        let mut store = own.clone();
        store.observe(&s, Evidence::Disagreed, 10, &c);
        store.observe(&other, Evidence::Agreed, 10, &c);
        let mut covered = store.clone();
        covered.cover(&own, &c);
        assert_eq!(covered, store, "nothing counted twice");
        // A store that has not got the run's evidence yet.
        let mut fresh = Trust::new();
        fresh.observe(&other, Evidence::Agreed, 10, &c);
        fresh.cover(&own, &c);
        assert_eq!(fresh.posterior(&s, 10, &c), own.posterior(&s, 10, &c));
        assert_eq!(
            fresh.posterior(&other, 10, &c),
            store.posterior(&other, 10, &c)
        );
    }

    /// Evidence applied under one scope is seen by that scope only: another scope, a scope
    /// whose name is a prefix of it, and the unscoped store stand at the prior.
    #[test]
    fn a_scope_sees_its_own_evidence_and_no_other() {
        let c = TrustConfig::default();
        let s = Source::tool("search");
        let reports: Vec<Report> = (0..40)
            .map(|i| Report {
                source: s.clone(),
                evidence: Evidence::Agreed,
                at_ms: i,
            })
            .collect();
        let mut store = Trust::new();
        store.apply_scoped("key:alice", &reports, &c);
        let alice = store.scope("key:alice");
        assert!(alice.p_right(&s, 40, &c) > 0.99, "alice's own record");
        assert_eq!(
            alice.posterior(&s, 40, &c),
            store.posterior(&s.scoped("key:alice"), 40, &c)
        );
        for other in ["key:bob", "key:ali", "key:alice:x", ""] {
            let seen = store.scope(other);
            assert_eq!(
                seen.sources().count(),
                0,
                "{other:?} sees nothing of alice's"
            );
            assert_eq!(seen.p_right(&s, 40, &c), c.prior_mean());
        }
        assert_eq!(
            store.p_right(&s, 40, &c),
            c.prior_mean(),
            "unscoped: nothing"
        );
        // A name with the separator in it is still read back whole.
        let odd = Source::tool("a:b");
        assert_eq!(odd.scoped("x:y").unscoped("x:y"), Some(odd.clone()));
        assert_eq!(odd.scoped("x").unscoped("x:y"), None);
    }

    #[test]
    fn agreement_raises_and_disagreement_lowers() {
        let c = TrustConfig::default();
        let s = Source::tool("sub");
        let mut t = Trust::new();
        let p0 = t.p_right(&s, 0, &c);
        assert!((p0 - c.prior_mean()).abs() < 1e-12);
        t.observe(&s, Evidence::Agreed, 0, &c);
        let p1 = t.p_right(&s, 0, &c);
        assert!(p1 > p0);
        t.observe(&s, Evidence::Disagreed, 0, &c);
        let p2 = t.p_right(&s, 0, &c);
        assert!(p2 < p1);
        t.observe(&s, Evidence::Outage, 0, &c);
        assert_eq!(t.p_right(&s, 0, &c), p2, "an outage says nothing of values");
    }

    /// Two stores that each saw part of the evidence, merged, hold what one store that saw all
    /// of it holds (below the cap, where the order of observations does not matter), decay
    /// included: nothing lost, nothing counted twice.
    #[test]
    fn merging_two_stores_counts_each_observation_once() {
        let c = TrustConfig::default();
        let (s, u) = (Source::tool("sub"), Source::upstream("backup"));
        let (mut a, mut b, mut all) = (Trust::new(), Trust::new(), Trust::new());
        let seen = [
            (&s, Evidence::Agreed, 0, true),
            (&s, Evidence::Disagreed, 600_000, false),
            (&u, Evidence::Outage, 900_000, true),
            (&s, Evidence::Accepted, 1_200_000, false),
            (&s, Evidence::Rejected, 1_800_000, true),
        ];
        for (src, e, at, on_a) in seen {
            if on_a { &mut a } else { &mut b }.observe(src, e, at, &c);
            all.observe(src, e, at, &c);
        }
        let now = 3_600_000;
        let mut merged = a.clone();
        for (src, p) in b.sources() {
            merged.merge(src, p, &c);
        }
        for src in [&s, &u] {
            let (m, w) = (merged.posterior(src, now, &c), all.posterior(src, now, &c));
            for (x, y) in [
                (m.right, w.right),
                (m.wrong, w.wrong),
                (m.up, w.up),
                (m.down, w.down),
            ] {
                assert!(
                    (x - y).abs() < 1e-9,
                    "{src:?}: merged {m:?}, one store {w:?}"
                );
            }
        }
        assert!(merged.posterior(&s, now, &c).wrong > a.posterior(&s, now, &c).wrong);
    }
}
