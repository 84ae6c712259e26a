//! Verification of results and final answers.
//!
//! Runtime checks catch failures that announce themselves. The dangerous ones do not: a tool
//! returns a plausible but wrong number, or the model claims success while a step it needed
//! failed. The verifier is a first-class control-plane component (SPEC §3): its rejection is not
//! the end of the run but a recoverable [`FailureClass::VerificationFailure`](crate::classifier::FailureClass::VerificationFailure)
//! signal, and that is what drives silent failures to zero.
//!
//! Built-ins: [`SchemaVerifier`] (the output matches a JSON Schema) and [`EvidenceVerifier`]
//! (an answer that claims success must not sit on unresolved failures, and the values it reports
//! must appear in the tool evidence). Verifiers compose with [`AllOf`].

use serde::{Deserialize, Serialize};
use serde_json::Value;
use thiserror::Error;

/// A verifier's judgement.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "verdict", rename_all = "snake_case")]
pub enum Judgement {
    /// The result is acceptable.
    Accept,
    /// The result is wrong; recover.
    Reject {
        /// Why.
        reason: String,
    },
    /// The verifier cannot tell.
    Uncertain {
        /// Why not.
        reason: String,
    },
}

impl Judgement {
    /// Whether this is an acceptance.
    pub fn is_accept(&self) -> bool {
        matches!(self, Judgement::Accept)
    }
}

/// What a verifier looks at.
#[derive(Debug, Clone, Copy)]
pub struct Subject<'a> {
    /// The output or final answer.
    pub output: &'a Value,
    /// Whether the output presents itself as a complete, successful answer.
    pub claims_success: bool,
    /// Failures still unresolved in the run.
    pub unresolved_failures: usize,
    /// Tool results the answer should be grounded in.
    pub evidence: &'a [Value],
}

/// A check of a result or final answer.
pub trait Verifier {
    /// A short name for traces.
    fn name(&self) -> &str;
    /// Judges the subject.
    fn verify(&self, subject: &Subject<'_>) -> Judgement;
}

/// A schema for the verifier could not be compiled.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("invalid JSON Schema for the verifier: {0}")]
pub struct SchemaError(pub String);

/// Accepts outputs that match a JSON Schema; rejects others with the first errors.
pub struct SchemaVerifier {
    validator: jsonschema::Validator,
}

impl std::fmt::Debug for SchemaVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SchemaVerifier").finish_non_exhaustive()
    }
}

impl SchemaVerifier {
    /// Compiles `schema` (draft detected from `$schema`, 2020-12 by default).
    pub fn new(schema: &Value) -> Result<Self, SchemaError> {
        jsonschema::validator_for(schema)
            .map(|validator| SchemaVerifier { validator })
            .map_err(|e| SchemaError(e.to_string()))
    }
}

impl Verifier for SchemaVerifier {
    fn name(&self) -> &str {
        "schema"
    }

    fn verify(&self, subject: &Subject<'_>) -> Judgement {
        let errors: Vec<String> = self
            .validator
            .iter_errors(subject.output)
            .take(3)
            .map(|e| {
                let at = e.instance_path().to_string();
                let at = if at.is_empty() { "/".to_owned() } else { at };
                format!("at {at}: {e}")
            })
            .collect();
        if errors.is_empty() {
            Judgement::Accept
        } else {
            Judgement::Reject {
                reason: errors.join("; "),
            }
        }
    }
}

/// Rejects answers that claim success while failures are unresolved, and — when
/// `require_grounding` is set — answers whose scalar values appear in none of the evidence.
#[derive(Debug, Clone, Copy, Default)]
pub struct EvidenceVerifier {
    /// Also require every scalar leaf of the answer to appear somewhere in the evidence.
    pub require_grounding: bool,
}

impl Verifier for EvidenceVerifier {
    fn name(&self) -> &str {
        "evidence"
    }

    fn verify(&self, subject: &Subject<'_>) -> Judgement {
        if subject.claims_success && subject.unresolved_failures > 0 {
            return Judgement::Reject {
                reason: format!(
                    "the answer claims success but {} failure(s) are unresolved",
                    subject.unresolved_failures
                ),
            };
        }
        if !self.require_grounding {
            return Judgement::Accept;
        }
        if subject.evidence.is_empty() {
            return Judgement::Uncertain {
                reason: "no tool evidence to check the answer against".into(),
            };
        }
        let mut ungrounded = Vec::new();
        for_each_leaf(subject.output, &mut |leaf| {
            if !subject.evidence.iter().any(|e| contains_leaf(e, leaf)) {
                ungrounded.push(leaf.to_string());
            }
        });
        if ungrounded.is_empty() {
            Judgement::Accept
        } else {
            ungrounded.truncate(3);
            Judgement::Reject {
                reason: format!(
                    "value(s) {} appear in no tool result",
                    ungrounded.join(", ")
                ),
            }
        }
    }
}

fn for_each_leaf<'a>(v: &'a Value, f: &mut dyn FnMut(&'a Value)) {
    let mut stack = vec![v];
    while let Some(v) = stack.pop() {
        match v {
            Value::Array(a) => stack.extend(a.iter()),
            Value::Object(o) => stack.extend(o.values()),
            Value::Null | Value::Bool(_) => {}
            Value::Number(_) | Value::String(_) => f(v),
        }
    }
}

fn contains_leaf(haystack: &Value, leaf: &Value) -> bool {
    let mut stack = vec![haystack];
    while let Some(v) = stack.pop() {
        match v {
            Value::Array(a) => stack.extend(a.iter()),
            Value::Object(o) => stack.extend(o.values()),
            Value::Number(n) => {
                if let (Some(a), Some(b)) = (n.as_f64(), leaf.as_f64())
                    && (a - b).abs() <= 1e-9 * a.abs().max(1.0)
                {
                    return true;
                }
            }
            Value::String(s) => {
                if let Some(l) = leaf.as_str()
                    && s.contains(l)
                {
                    return true;
                }
            }
            Value::Null | Value::Bool(_) => {}
        }
    }
    false
}

/// All of several verifiers: the first rejection wins, then the first uncertainty.
pub struct AllOf(pub Vec<Box<dyn Verifier + Send + Sync>>);

impl std::fmt::Debug for AllOf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.0.iter().map(|v| v.name()))
            .finish()
    }
}

impl Verifier for AllOf {
    fn name(&self) -> &str {
        "all_of"
    }

    fn verify(&self, subject: &Subject<'_>) -> Judgement {
        let mut uncertain = None;
        for v in &self.0 {
            match v.verify(subject) {
                Judgement::Accept => {}
                Judgement::Reject { reason } => {
                    return Judgement::Reject {
                        reason: format!("{}: {reason}", v.name()),
                    };
                }
                Judgement::Uncertain { reason } => {
                    uncertain.get_or_insert(Judgement::Uncertain {
                        reason: format!("{}: {reason}", v.name()),
                    });
                }
            }
        }
        uncertain.unwrap_or(Judgement::Accept)
    }
}

/// How close two numbers from equivalent sources must be to agree:
/// `|a − b| ≤ rel·max(|a|, |b|) + abs`. Equivalent sources differ by noise (rounding, a few
/// seconds between readings); the band is the tool owner's statement of how much.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Tolerance {
    /// Relative part.
    pub rel: f64,
    /// Absolute part.
    pub abs: f64,
}

impl Default for Tolerance {
    /// 2 % relative plus 0.05 absolute.
    fn default() -> Self {
        Tolerance {
            rel: 0.02,
            abs: 0.05,
        }
    }
}

impl Tolerance {
    fn numbers_agree(&self, x: f64, y: f64) -> bool {
        (x - y).abs() <= self.rel * x.abs().max(y.abs()) + self.abs
    }
}

/// The cross-check: judges `value` (one source's answer) against `other` (an equivalent
/// source's answer to the same arguments), field by field. Every leaf of `value` that `other`
/// also has is compared — numbers within `tol`, other scalars exactly; leaves only one side has,
/// and values of different shapes (an object against a text), are not evidence either way. Rejects at the first disagreement (naming it), is uncertain when
/// the two share no leaf (nothing was checked), accepts otherwise.
///
/// Pure: whoever asked the second source (the benchmark's client, the gateway through the
/// agent's own tool loop) hands both answers in.
pub fn cross_check(value: &Value, other: &Value, tol: Tolerance) -> Judgement {
    let mut compared = 0u32;
    match first_disagreement(value, other, tol, &mut String::new(), &mut compared) {
        Some(reason) => Judgement::Reject { reason },
        None if compared == 0 => Judgement::Uncertain {
            reason: "the two answers share no field to compare".into(),
        },
        None => Judgement::Accept,
    }
}

fn first_disagreement(
    a: &Value,
    b: &Value,
    tol: Tolerance,
    path: &mut String,
    compared: &mut u32,
) -> Option<String> {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            for (k, p) in x {
                let Some(q) = y.get(k) else { continue };
                let len = path.len();
                if !path.is_empty() {
                    path.push('.');
                }
                path.push_str(k);
                let found = first_disagreement(p, q, tol, path, compared);
                path.truncate(len);
                if found.is_some() {
                    return found;
                }
            }
            None
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            for (i, (p, q)) in x.iter().zip(y).enumerate() {
                let len = path.len();
                path.push_str(&format!("[{i}]"));
                let found = first_disagreement(p, q, tol, path, compared);
                path.truncate(len);
                if found.is_some() {
                    return found;
                }
            }
            None
        }
        (Value::Number(x), Value::Number(y)) => {
            *compared += 1;
            let (x, y) = (
                x.as_f64().unwrap_or(f64::NAN),
                y.as_f64().unwrap_or(f64::NAN),
            );
            (!tol.numbers_agree(x, y))
                .then(|| format!("`{path}`: {a} here, {b} from the other source"))
        }
        // Shapes that differ (an object against a text, arrays of different lengths) are not
        // comparable: no evidence either way.
        (Value::Object(_) | Value::Array(_), _) | (_, Value::Object(_) | Value::Array(_)) => None,
        _ => {
            *compared += 1;
            (a != b).then(|| format!("`{path}`: {a} here, {b} from the other source"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn subject<'a>(output: &'a Value, evidence: &'a [Value]) -> Subject<'a> {
        Subject {
            output,
            claims_success: true,
            unresolved_failures: 0,
            evidence,
        }
    }

    #[test]
    fn schema_verifier_accepts_and_rejects_with_pointer() {
        let v = SchemaVerifier::new(&json!({
            "type": "object",
            "properties": {"unit": {"enum": ["c", "f"]}},
            "required": ["unit"]
        }));
        let Ok(v) = v else {
            panic!("schema must compile")
        };
        assert!(v.verify(&subject(&json!({"unit": "c"}), &[])).is_accept());
        match v.verify(&subject(&json!({"unit": "celsius"}), &[])) {
            Judgement::Reject { reason } => assert!(reason.contains("/unit"), "{reason}"),
            other => panic!("expected reject, got {other:?}"),
        }
        assert!(SchemaVerifier::new(&json!({"type": 12})).is_err());
    }

    #[test]
    fn evidence_verifier_rejects_success_claims_over_failures() {
        let out = json!("42");
        let mut s = subject(&out, &[]);
        s.unresolved_failures = 1;
        assert!(matches!(
            EvidenceVerifier::default().verify(&s),
            Judgement::Reject { .. }
        ));
        s.claims_success = false;
        assert!(EvidenceVerifier::default().verify(&s).is_accept());
    }

    #[test]
    fn grounding_checks_values_against_evidence() {
        let ev = [json!({"temp": 21.5, "city": "Paris"})];
        let g = EvidenceVerifier {
            require_grounding: true,
        };
        assert!(g.verify(&subject(&json!({"t": 21.5}), &ev)).is_accept());
        assert!(matches!(
            g.verify(&subject(&json!({"t": 99}), &ev)),
            Judgement::Reject { .. }
        ));
        assert!(matches!(
            g.verify(&subject(&json!(1), &[])),
            Judgement::Uncertain { .. }
        ));
    }

    #[test]
    fn all_of_reports_first_rejection() {
        let Ok(schema) = SchemaVerifier::new(&json!({"type": "number"})) else {
            panic!("schema must compile")
        };
        let all = AllOf(vec![
            Box::new(EvidenceVerifier::default()),
            Box::new(schema),
        ]);
        match all.verify(&subject(&json!("x"), &[])) {
            Judgement::Reject { reason } => assert!(reason.starts_with("schema:"), "{reason}"),
            other => panic!("expected reject, got {other:?}"),
        }
    }

    #[test]
    fn the_cross_check_compares_shared_fields_within_the_tolerance() {
        let tol = Tolerance::default();
        let a = json!({"temp": 20.0, "city": "Paris", "as_of": 5, "extra": [1, 2]});
        let near = json!({"temp": 20.3, "city": "Paris", "as_of": 5});
        assert_eq!(cross_check(&a, &near, tol), Judgement::Accept);
        let far = json!({"temp": 25.0, "city": "Paris"});
        assert!(matches!(cross_check(&a, &far, tol),
            Judgement::Reject { reason } if reason.contains("`temp`")));
        let other_city = json!({"city": "Lyon"});
        assert!(matches!(
            cross_check(&a, &other_city, tol),
            Judgement::Reject { .. }
        ));
        let nothing = json!({"unrelated": 1});
        assert!(matches!(
            cross_check(&a, &nothing, tol),
            Judgement::Uncertain { .. }
        ));
        assert!(matches!(
            cross_check(&a, &json!("Error: down"), tol),
            Judgement::Uncertain { .. }
        ));
        let nested = json!({"quote": {"price": 100.0}});
        let off = json!({"quote": {"price": 110.0}});
        assert!(matches!(cross_check(&nested, &off, tol),
            Judgement::Reject { reason } if reason.contains("`quote.price`")));
    }
}
