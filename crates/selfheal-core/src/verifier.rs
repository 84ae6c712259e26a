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
//! must appear in the tool evidence).

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

    /// Whether two readings of one field agree: numbers within the band, arrays element by
    /// element, objects key by key (the same keys), anything else exactly. The reading
    /// [`cross_check_declared`] applies to each declared field.
    pub fn agrees(&self, a: &Value, b: &Value) -> bool {
        match (a, b) {
            (Value::Number(x), Value::Number(y)) => match (x.as_f64(), y.as_f64()) {
                (Some(x), Some(y)) => self.numbers_agree(x, y),
                _ => x == y,
            },
            (Value::Array(x), Value::Array(y)) => {
                x.len() == y.len() && x.iter().zip(y).all(|(p, q)| self.agrees(p, q))
            }
            (Value::Object(x), Value::Object(y)) => {
                x.len() == y.len()
                    && x.iter()
                        .all(|(k, p)| y.get(k).is_some_and(|q| self.agrees(p, q)))
            }
            _ => a == b,
        }
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

/// The cross-check on a tool's declared fields: judges `value` (one source's answer) against
/// `other` (the answer of the source named `other_name` to the same arguments) on each of
/// `fields`, with `agrees` (the tool's tolerance) deciding whether two readings agree. Rejects at
/// the first field the two answer differently; is uncertain when a field could not be compared
/// on both sides; accepts when every field agrees.
///
/// An equivalent source whose API drifted (a field renamed, as a provider's fields are renamed
/// for every tool it serves) lacks the field by name. It is read through the drift
/// ([`crate::contract::read_through_drift`]: the key recognisably renamed, or the one key no
/// declared field names, by elimination), and a reading so found that **agrees** counts as
/// agreement: two independent sources gave the same value, and only the key it sits under was
/// inferred. One that disagrees is no evidence either way — the inferred key may be the wrong
/// one — and leaves the field uncompared (uncertain), as before. Without this, a value
/// recovered by substituting for a tool whose fields drifted could never be checked against
/// it, and was held in doubt although both sources agree (issue 33).
pub fn cross_check_declared(
    value: &Value,
    other: &Value,
    fields: &[String],
    stamp: Option<&str>,
    other_name: &str,
    agrees: impl Fn(&Value, &Value) -> bool,
) -> Judgement {
    let mut verdict = Judgement::Accept;
    for p in fields {
        let a = crate::contract::get_path(value, p);
        match (a, crate::contract::get_path(other, p)) {
            (Some(a), Some(b)) if agrees(a, b) => {}
            (Some(a), Some(b)) => {
                return Judgement::Reject {
                    reason: format!("`{p}`: {a} here, {b} from {other_name}"),
                };
            }
            (Some(a), None) => {
                match crate::contract::read_through_drift(other, p, fields, stamp, a) {
                    Some(b) if agrees(a, b) => {}
                    Some(_) => {
                        verdict = Judgement::Uncertain {
                            reason: format!(
                                "{other_name} has no `{p}`, and read through its renamed key \
                                 it does not agree (no evidence: the key was inferred)"
                            ),
                        };
                    }
                    None => {
                        verdict = Judgement::Uncertain {
                            reason: format!("{other_name} has no `{p}`"),
                        };
                    }
                }
            }
            (None, _) => {
                verdict = Judgement::Uncertain {
                    reason: format!("{other_name} has no `{p}`"),
                };
            }
        }
    }
    verdict
}

/// What a second reading of a value says ([`judge_second_reading`]).
#[derive(Debug, Clone, PartialEq)]
pub enum SecondReading {
    /// The verifier's judgement of the value.
    Judged(Judgement),
    /// The value has a hole the second source filled — a field empty here and not there: the
    /// first answer was an empty output (a failure of its tool), not a value to judge.
    Hole(crate::classifier::Signal),
}

/// How a second source's answer is read against the value ([`judge_second_reading`]).
#[derive(Debug, Clone, Copy)]
pub struct SecondSource<'a> {
    /// The second source, as a reason names it (`` `tool` ``, "a second read of `tool`").
    pub name: &'a str,
    /// The fields the tool declares as its value (dot paths); empty when it declares none.
    pub fields: &'a [String],
    /// The field holding the answer's `as_of` stamp, if the tool sends one: it names no value.
    pub stamp: Option<&'a str>,
    /// Within what two readings agree.
    pub tolerance: Tolerance,
}

/// The cross-check, decided once for every front-end: judges `value` by `other`, the second
/// source's answer to the same arguments.
///
/// The whole answers are compared (without the stamp): a field empty in `value` and filled in
/// `other` is a [`SecondReading::Hole`], else [`cross_check`]. When `other` lacks a declared
/// field (its API drifted, a field renamed), only the declared fields are judged: a declared one
/// empty here and filled there is a hole, else [`cross_check_declared`] reads the renamed field
/// through the drift.
pub fn judge_second_reading(
    value: &Value,
    other: &Value,
    source: &SecondSource<'_>,
) -> SecondReading {
    use crate::contract::get_path;
    let tol = source.tolerance;
    // Compared whole whenever the other answer has every declared field: a value the agent may
    // read from an undeclared field is checked too (fewer fields compared would let a wrong one
    // through unseen). Only an answer whose API drifted is read on the declared fields alone.
    if source.fields.iter().any(|p| get_path(other, p).is_none()) {
        let hole = source.fields.iter().any(|p| {
            matches!((get_path(value, p), get_path(other, p)),
                (Some(a), Some(b)) if is_void(a) && !is_void(b))
        });
        if hole {
            return SecondReading::Hole(crate::classifier::Signal::EmptyOutput);
        }
        return SecondReading::Judged(cross_check_declared(
            value,
            other,
            source.fields,
            source.stamp,
            source.name,
            |a, b| tol.agrees(a, b),
        ));
    }
    let strip = |v: &Value| match source.stamp {
        Some(field) => crate::contract::without_stamp(v, field),
        None => v.clone(),
    };
    let (value, other) = (strip(value), strip(other));
    match holes(&value, &other) {
        Some(()) => SecondReading::Hole(crate::classifier::Signal::EmptyOutput),
        None => SecondReading::Judged(cross_check(&value, &other, tol)),
    }
}

/// A field (at any depth) empty in `value` and filled in `other`.
fn holes(value: &Value, other: &Value) -> Option<()> {
    let (Value::Object(a), Value::Object(b)) = (value, other) else {
        return None;
    };
    b.iter().find_map(|(k, theirs)| {
        let ours = a.get(k)?;
        if is_void(ours) && !is_void(theirs) {
            Some(())
        } else {
            holes(ours, theirs)
        }
    })
}

/// `null` or an empty array: no value.
fn is_void(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Array(x) => x.is_empty(),
        Value::Object(_) | Value::Bool(_) | Value::Number(_) | Value::String(_) => false,
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

/// The arguments of a tool call that appear nowhere in the evidence the caller had when the
/// model wrote it: the task's own words and the tool results so far.
///
/// Why: a model that copies an identifier or a number from an earlier result into the next call
/// can copy it wrong (`Mexicos` for `Mexico`, `11.538` for `1.1538`), and the tool then answers a
/// question nobody asked — schema-valid, plausible, and silently wrong. For a tool whose
/// arguments are meant to be copied, never invented (the operator says so), an argument that
/// appears nowhere is a mistake of the model's to re-ask, before the call runs.
///
/// What counts as appearing, per scalar leaf of the arguments:
/// - a number: a number of the evidence within 1e-9 relative, or a number written in its text;
/// - a string with no whitespace (an identifier, a code, a name): a string of the evidence, or a
///   whole word of its text (`Mexicos` is not in "capital of Mexico");
/// - an empty string, free text (with whitespace), a boolean or null: not judged here (the
///   empty-input check and the tool itself judge those).
///
/// Returns one line per ungrounded argument (`` `a` = 11.538 ``), by top-level name, in order.
/// Pure and bounded by its inputs: whoever holds the conversation hands the evidence in.
pub fn ungrounded_arguments(args: &Value, evidence: &[Value]) -> Vec<String> {
    let Value::Object(args) = args else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for (name, v) in args {
        let mut missing = None;
        for_each_leaf(v, &mut |leaf| {
            if missing.is_none() && judged(leaf) && !grounded(leaf, evidence) {
                missing = Some(leaf.to_string());
            }
        });
        if let Some(leaf) = missing {
            out.push(format!("`{name}` = {leaf}"));
        }
    }
    out
}

/// Whether a leaf is one [`ungrounded_arguments`] judges.
fn judged(leaf: &Value) -> bool {
    match leaf {
        Value::Number(_) => true,
        Value::String(s) => !s.is_empty() && !s.chars().any(char::is_whitespace),
        Value::Null | Value::Bool(_) | Value::Array(_) | Value::Object(_) => false,
    }
}

/// Whether a judged leaf appears in the evidence: whole, or (a string made of several words,
/// such as `MXN/USD` or `1.1538*90`) every word of it.
fn grounded(leaf: &Value, evidence: &[Value]) -> bool {
    if evidence.iter().any(|e| grounds(e, leaf)) {
        return true;
    }
    let Some(text) = leaf.as_str() else {
        return false;
    };
    let all_grounded = |parts: &[&str]| {
        parts.len() > 1
            && parts.iter().all(|w| {
                let w = Value::String((*w).to_owned());
                evidence.iter().any(|e| grounds(e, &w))
            })
    };
    let parts: Vec<&str> = words(text).filter(|w| !w.is_empty()).collect();
    if all_grounded(&parts) {
        return true;
    }
    // Identifiers joined with `-` (`US-MX` from `US` and `MX`): each part is a word of the
    // evidence. Only parts with a letter: numbers joined so (a date, `2024-01-05`) are a value
    // of their own, and digits found somewhere else do not make one up.
    let joined: Vec<&str> = text.split('-').collect();
    joined.iter().all(|p| p.chars().any(char::is_alphabetic)) && all_grounded(&joined)
}

/// The words of a text: runs of letters, digits and the characters identifiers and numbers are
/// written with, a trailing full stop or colon left out.
fn words(text: &str) -> impl Iterator<Item = &str> {
    text.split(|c: char| !(c.is_alphanumeric() || matches!(c, '.' | '_' | '-' | '+' | ':')))
        .map(|w| w.trim_end_matches(['.', ':']))
}

/// Whether `evidence` holds `leaf`: as a leaf, or as a word (or number) of one of its texts.
fn grounds(evidence: &Value, leaf: &Value) -> bool {
    let number = match leaf {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => s.parse::<f64>().ok(),
        Value::Null | Value::Bool(_) | Value::Array(_) | Value::Object(_) => None,
    };
    let same = |a: f64, b: f64| (a - b).abs() <= 1e-9 * a.abs().max(1.0);
    let mut stack = vec![evidence];
    while let Some(v) = stack.pop() {
        match v {
            Value::Array(a) => stack.extend(a.iter()),
            Value::Object(o) => stack.extend(o.values()),
            Value::Number(n) => {
                if let (Some(a), Some(b)) = (n.as_f64(), number)
                    && same(a, b)
                {
                    return true;
                }
            }
            Value::String(text) => {
                if leaf.as_str() == Some(text.as_str()) {
                    return true;
                }
                let word = |w: &&str| {
                    leaf.as_str() == Some(*w)
                        || number.is_some_and(|b| w.parse::<f64>().is_ok_and(|a| same(a, b)))
                };
                if words(text).any(|w| word(&w)) {
                    return true;
                }
            }
            Value::Null | Value::Bool(_) => {}
        }
    }
    false
}

/// The smallest number an answer's text is judged on: integers up to this are counting words
/// ("3 results", "step 2", a list's index), not values read from somewhere, and are left out of
/// [`ungrounded_numbers`].
pub(crate) const SMALL_COUNT: u64 = 10;

/// The numbers of a final answer's `text` that appear in none of the `evidence` — the task's own
/// words (its user and system messages) and the run's tool results — as written in the answer.
///
/// Why: a model that computes in its head, or reads a number wrong, states it as confidently as
/// one it copied; an answer that carries a number nothing in the run holds is a claim the run
/// cannot stand behind, and is not `complete` (`answer_grounding` says why, the core's
/// [`crate::run::Run`] flags the answer `partial`). The check is the answer-side twin of
/// [`ungrounded_arguments`].
///
/// The rule, per number of the answer text:
/// - a number is a run of digits with an optional leading `-`, thousands separators (`1,234`,
///   `1 234` with a thin space, `1_234`) and one decimal part; one that touches a letter or `_`
///   (`Qwen2`, `c_to_f`, `A4`, `3rd`) is part of a word, not a value, and is not judged;
/// - integers from 0 to `SMALL_COUNT` (10) are not judged (counting words; a made-up answer that
///   small slips through — the price of not flagging every "2 results");
/// - years are judged like any number: the run cannot tell "1945" known by the model from one
///   invented, and refusing to claim is the safe side;
/// - it is grounded when an evidence number (a number leaf, or a number written in an evidence
///   text, separators read the same way) equals it, or rounds to it at the answer's precision
///   (`1234.5678` grounds `1,234.57`, `1235` and `1234.6`; trailing zeros do not count as
///   precision: `18.50` is `18.5`). A sign must match.
///
/// Returns each ungrounded number once, as written, in order of appearance. Pure and bounded by
/// its inputs.
pub fn ungrounded_numbers(text: &str, evidence: &[Value]) -> Vec<String> {
    let mut known: Vec<f64> = Vec::new();
    for e in evidence {
        let mut stack = vec![e];
        while let Some(v) = stack.pop() {
            match v {
                Value::Array(a) => stack.extend(a.iter()),
                Value::Object(o) => stack.extend(o.values()),
                Value::Number(n) => known.extend(n.as_f64()),
                Value::String(s) => known.extend(numbers_in(s).into_iter().map(|n| n.value)),
                Value::Null | Value::Bool(_) => {}
            }
        }
    }
    let mut out: Vec<String> = Vec::new();
    for n in numbers_in(text) {
        let small = n.decimals == 0 && n.value >= 0.0 && n.value <= SMALL_COUNT as f64;
        if small || out.contains(&n.written) {
            continue;
        }
        if !known.iter().any(|&k| grounds_number(k, &n)) {
            out.push(n.written);
        }
    }
    out
}

/// Why a final answer's text cannot be claimed `complete` by the grounding rule
/// ([`ungrounded_numbers`]), if it cannot: the first few ungrounded numbers named.
pub(crate) fn answer_grounding(text: &str, evidence: &[Value]) -> Option<String> {
    let mut missing = ungrounded_numbers(text, evidence);
    if missing.is_empty() {
        return None;
    }
    let more = missing.len().saturating_sub(3);
    missing.truncate(3);
    let more = if more > 0 {
        format!(" (and {more} more)")
    } else {
        String::new()
    };
    Some(format!(
        "the answer states {}{more}, found in no input or tool result of the run",
        missing.join(", ")
    ))
}

/// A number as written in a text.
#[derive(Debug, Clone, PartialEq)]
struct Written {
    /// The text of it, as written.
    written: String,
    /// Its value.
    value: f64,
    /// Digits after the decimal point, trailing zeros left out.
    decimals: u32,
}

/// Whether evidence number `k` grounds `n`: equal, or `k` rounded to `n`'s decimals is `n`.
fn grounds_number(k: f64, n: &Written) -> bool {
    let same = |a: f64, b: f64| (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0);
    if same(k, n.value) {
        return true;
    }
    if n.decimals > 12 {
        return false;
    }
    let scale = 10f64.powi(n.decimals as i32);
    same((k * scale).round() / scale, n.value)
}

/// The numbers written in `text` (see [`ungrounded_numbers`] for what counts as one).
fn numbers_in(text: &str) -> Vec<Written> {
    let chars: Vec<char> = text.chars().collect();
    let wordy = |c: char| c.is_alphabetic() || c == '_';
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        if !chars[i].is_ascii_digit() {
            i += 1;
            continue;
        }
        let start = i;
        let mut int = String::new();
        let mut frac = String::new();
        while i < chars.len() {
            let c = chars[i];
            if c.is_ascii_digit() {
                int.push(c);
                i += 1;
            } else if matches!(c, ',' | '_' | '\u{202f}' | '\u{2009}')
                && chars
                    .get(i + 1..i + 4)
                    .is_some_and(|g| g.iter().all(char::is_ascii_digit))
                && !chars.get(i + 4).is_some_and(char::is_ascii_digit)
            {
                // A thousands separator: exactly three digits follow.
                i += 1;
            } else {
                break;
            }
        }
        if chars.get(i) == Some(&'.') && chars.get(i + 1).is_some_and(char::is_ascii_digit) {
            i += 1;
            while let Some(&c) = chars.get(i).filter(|c| c.is_ascii_digit()) {
                frac.push(c);
                i += 1;
            }
        }
        let before = start.checked_sub(1).and_then(|j| chars.get(j)).copied();
        let after = chars.get(i).copied();
        if before.is_some_and(wordy) || after.is_some_and(wordy) {
            continue;
        }
        let negative = before == Some('-')
            && start
                .checked_sub(2)
                .and_then(|j| chars.get(j))
                .is_none_or(|c| !c.is_alphanumeric());
        let trimmed = frac.trim_end_matches('0');
        let literal = if trimmed.is_empty() {
            int.clone()
        } else {
            format!("{int}.{trimmed}")
        };
        let Ok(mut value) = literal.parse::<f64>() else {
            continue;
        };
        let mut written: String = chars[start..i].iter().collect();
        if negative {
            value = -value;
            written.insert(0, '-');
        }
        out.push(Written {
            written,
            value,
            decimals: trimmed.len() as u32,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn declared(f: &[&str]) -> Vec<String> {
        f.iter().map(|s| (*s).to_owned()).collect()
    }

    fn within_2pc(a: &Value, b: &Value) -> bool {
        match (a.as_f64(), b.as_f64()) {
            (Some(x), Some(y)) => (x - y).abs() <= 0.02 * x.abs().max(y.abs()),
            _ => a == b,
        }
    }

    /// The one rule for a second reading: the whole answers without their stamps (an undeclared
    /// field that differs rejects; a field empty here and filled there is a hole); an answer
    /// lacking a declared field is judged on the declared fields, a renamed one read through
    /// the drift.
    #[test]
    fn a_second_reading_judges_the_whole_answer_or_through_a_drift() {
        fn with<'a>(fields: &'a [String], stamp: Option<&'a str>) -> SecondSource<'a> {
            SecondSource {
                name: "`q`",
                fields,
                stamp,
                tolerance: Tolerance::default(),
            }
        }
        let fields = &declared(&["price"])[..];
        let a = json!({"price": 100.0, "source": "east", "as_of": 1});
        let b = json!({"price": 100.5, "source": "west", "as_of": 2});
        let judged = |a: &Value, b: &Value, s: &SecondSource<'_>| judge_second_reading(a, b, s);
        // Every declared field there: the whole answers are compared, `source` too.
        assert!(matches!(
            judged(&a, &b, &with(fields, Some("as_of"))),
            SecondReading::Judged(Judgement::Reject { .. })
        ));
        let same = json!({"price": 100.5, "source": "east", "as_of": 9});
        assert_eq!(
            judged(&a, &same, &with(fields, Some("as_of"))),
            SecondReading::Judged(Judgement::Accept)
        );
        let far = json!({"price": 130.0, "source": "east"});
        assert!(matches!(
            judged(&a, &far, &with(fields, None)),
            SecondReading::Judged(Judgement::Reject { .. })
        ));
        let empty = json!({"price": null, "source": "east"});
        assert_eq!(
            judged(&empty, &a, &with(fields, None)),
            SecondReading::Hole(crate::classifier::Signal::EmptyOutput)
        );
        let drifted = json!({"price_v2": 100.2});
        assert_eq!(
            judged(&a, &drifted, &with(fields, None)),
            SecondReading::Judged(Judgement::Accept)
        );
        // Nothing declared: the whole answers, stamps aside; `source` differs.
        assert!(matches!(
            judged(&a, &b, &with(&[], Some("as_of"))),
            SecondReading::Judged(Judgement::Reject { .. })
        ));
        assert_eq!(
            judged(&a, &same, &with(&[], Some("as_of"))),
            SecondReading::Judged(Judgement::Accept)
        );
        let hole = json!({"price": 100.0, "items": []});
        let filled = json!({"price": 100.0, "items": [1]});
        assert_eq!(
            judged(&hole, &filled, &with(&[], None)),
            SecondReading::Hole(crate::classifier::Signal::EmptyOutput)
        );
    }

    #[test]
    fn a_value_checked_against_a_source_whose_fields_drifted_is_read_through_the_drift() {
        let f = declared(&["price"]);
        let sub = json!({"price": 566.0, "as_of": 1});
        // Renamed past recognition; the stamp names no value and is not a candidate.
        let primary = json!({"as_of": 2, "f85": 566.38});
        let j = cross_check_declared(&sub, &primary, &f, Some("as_of"), "`q`", within_2pc);
        assert_eq!(j, Judgement::Accept);
        // Recognisably renamed.
        let primary = json!({"price_v2": 566.38});
        let j = cross_check_declared(&sub, &primary, &f, Some("as_of"), "`q`", within_2pc);
        assert_eq!(j, Judgement::Accept);
        // A nested field under a renamed key.
        let f = declared(&["results[0].population"]);
        let a = json!({"results": [{"population": 100}]});
        let b = json!({"results_v2": [{"population": 101}]});
        let j = cross_check_declared(&a, &b, &f, None, "`q`", within_2pc);
        assert_eq!(j, Judgement::Accept);
    }

    #[test]
    fn a_reading_through_a_drift_that_disagrees_or_is_ambiguous_is_no_evidence() {
        let f = declared(&["price"]);
        let sub = json!({"price": 566.0});
        // Disagrees through an inferred key: not a rejection, the key may be the wrong one.
        let primary = json!({"f85": 900.0});
        let j = cross_check_declared(&sub, &primary, &f, None, "`q`", within_2pc);
        assert!(matches!(j, Judgement::Uncertain { .. }), "{j:?}");
        // Two keys could be it: naming one would be a guess.
        let primary = json!({"f85": 566.0, "f12": 3.0});
        let j = cross_check_declared(&sub, &primary, &f, None, "`q`", within_2pc);
        assert!(matches!(j, Judgement::Uncertain { .. }), "{j:?}");
        // Without the stamp named, `as_of` is a second candidate.
        let primary = json!({"as_of": 2, "f85": 566.0});
        let j = cross_check_declared(&sub, &primary, &f, None, "`q`", within_2pc);
        assert!(matches!(j, Judgement::Uncertain { .. }), "{j:?}");
        // A candidate of another kind is not the field.
        let primary = json!({"f85": "566"});
        let j = cross_check_declared(&sub, &primary, &f, None, "`q`", within_2pc);
        assert!(matches!(j, Judgement::Uncertain { .. }), "{j:?}");
        // Two declared fields missing: elimination cannot say which key is which.
        let f2 = declared(&["price", "volume"]);
        let sub2 = json!({"price": 566.0, "volume": 10.0});
        let primary = json!({"f85": 566.0, "f12": 10.0});
        let j = cross_check_declared(&sub2, &primary, &f2, None, "`q`", within_2pc);
        assert!(matches!(j, Judgement::Uncertain { .. }), "{j:?}");
    }

    #[test]
    fn a_field_read_by_name_still_decides_as_before() {
        let f = declared(&["price", "volume"]);
        let a = json!({"price": 566.0, "volume": 10.0});
        let b = json!({"price": 600.0, "volume": 10.0});
        let j = cross_check_declared(&a, &b, &f, None, "`q`", within_2pc);
        assert_eq!(
            j,
            Judgement::Reject {
                reason: "`price`: 566.0 here, 600.0 from `q`".into()
            }
        );
        // A direct disagreement rejects even after a field that could not be compared.
        let b = json!({"volume": 99.0, "other": "x"});
        let j = cross_check_declared(&a, &b, &f, None, "`q`", within_2pc);
        assert!(matches!(j, Judgement::Reject { .. }), "{j:?}");
        let j = cross_check_declared(&a, &a, &f, None, "`q`", within_2pc);
        assert_eq!(j, Judgement::Accept);
    }

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
    fn identifiers_joined_with_a_dash_are_grounded_by_their_parts_but_dates_are_not() {
        let evidence = [json!("rates for US and MX on day 5 of 2024, month 1")];
        assert!(ungrounded_arguments(&json!({"pair": "US-MX"}), &evidence).is_empty());
        assert_eq!(
            ungrounded_arguments(&json!({"pair": "US-CA"}), &evidence),
            vec!["`pair` = \"US-CA\"".to_string()]
        );
        assert_eq!(
            ungrounded_arguments(&json!({"day": "2024-01-05"}), &evidence),
            vec!["`day` = \"2024-01-05\"".to_string()]
        );
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

    #[test]
    fn two_readings_agree_within_the_band_and_with_the_same_shape() {
        let tol = Tolerance::default();
        assert!(tol.agrees(&json!(20.0), &json!(20.3)));
        assert!(!tol.agrees(&json!(20.0), &json!(25.0)));
        assert!(tol.agrees(&json!([1.0, 2.0]), &json!([1.01, 2.0])));
        assert!(!tol.agrees(&json!([1.0, 2.0]), &json!([1.0])));
        assert!(tol.agrees(&json!({"p": 1.0}), &json!({"p": 1.01})));
        assert!(!tol.agrees(&json!({"p": 1.0}), &json!({"p": 1.0, "q": 2})));
        assert!(!tol.agrees(&json!("Paris"), &json!("Lyon")));
        assert!(
            !tol.agrees(&json!(20.0), &json!("20.0")),
            "a number is not its text"
        );
    }
    #[test]
    fn arguments_copied_wrong_are_ungrounded() {
        let evidence = [
            json!("Task 36: the price of 90 units in USD. Inputs: {\"country\": \"Mexico\"}"),
            json!({"currency": "MXN", "rate": 1.1538}),
        ];
        // Copied right: a word of the task, a number of the task's text, a result's values.
        let right = json!({"country": "Mexico", "a": 1.1538, "b": 90, "from": "MXN"});
        assert!(ungrounded_arguments(&right, &evidence).is_empty());
        // Copied wrong: a word that is longer than the one written, a number shifted.
        let wrong = json!({"country": "Mexicos", "a": 11.538, "b": 90});
        assert_eq!(
            ungrounded_arguments(&wrong, &evidence),
            vec![
                "`a` = 11.538".to_owned(),
                "`country` = \"Mexicos\"".to_owned()
            ]
        );
        // Free text, empty strings and booleans are not judged here.
        let free = json!({"q": "news about Mexicos", "e": "", "f": true});
        assert!(ungrounded_arguments(&free, &evidence).is_empty());
        // A string made of grounded words is grounded; one word wrong is not.
        assert!(ungrounded_arguments(&json!({"pair": "MXN/1.1538"}), &evidence).is_empty());
        assert_eq!(
            ungrounded_arguments(&json!({"pair": "MXN/EUR"}), &evidence).len(),
            1
        );
        // No evidence: every judged argument is ungrounded.
        assert_eq!(ungrounded_arguments(&json!({"x": 1}), &[]).len(), 1);
    }

    #[test]
    fn answer_numbers_must_come_from_the_run() {
        let evidence = [
            json!("How many USD are 250 units of the currency of Mexico?"),
            json!({"rate": 0.0587, "price": 1234.5678}),
            json!("{\"population\": \"12,345,678\"}"),
        ];
        // Copied, rounded to the answer's precision, or written with separators: grounded.
        for ok in [
            "It is 0.0587 per unit.",
            "1,234.57 USD",
            "about 1235",
            "1234.6",
            "12345678 people",
            "12,345,678",
            "250.00 units",
        ] {
            assert!(ungrounded_numbers(ok, &evidence).is_empty(), "{ok}");
        }
        // Counting words and numbers inside words are not judged.
        assert!(ungrounded_numbers("Step 2 of 3: done with c_to_f on Qwen2", &evidence).is_empty());
        // Computed in the head (250 × 0.0587), not by a tool: no result holds it.
        assert_eq!(ungrounded_numbers("14.675", &evidence), vec!["14.675"]);
        // Made up: flagged, as written, once.
        assert_eq!(
            ungrounded_numbers("The answer is 187.3 (187.3 USD), from 1,999.", &evidence),
            vec!["187.3".to_owned(), "1,999".to_owned()]
        );
        // A rounding that does not match, and a sign that does not.
        assert_eq!(ungrounded_numbers("1234.56", &evidence), vec!["1234.56"]);
        assert_eq!(ungrounded_numbers("it fell -250", &evidence), vec!["-250"]);
        // Years are judged like any number.
        assert_eq!(ungrounded_numbers("in 1945", &evidence), vec!["1945"]);
        // No evidence at all: every judged number is ungrounded.
        assert_eq!(ungrounded_numbers("42 and 7", &[]), vec!["42"]);
    }

    #[test]
    fn answer_grounding_names_what_is_missing() {
        assert_eq!(
            answer_grounding("It is 18.5 °C.", &[json!({"temp": 18.5})]),
            None
        );
        let why = answer_grounding("It is 21 °C, 70 °F, 294 K, 12 m/s.", &[json!({"t": 18})]);
        let Some(why) = why else {
            panic!("ungrounded numbers must be named")
        };
        assert!(why.contains("21, 70, 294 (and 1 more)"), "{why}");
    }
}
