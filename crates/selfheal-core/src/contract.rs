//! A tool's output contract: the fields its answers declare, and when its data was current.
//!
//! Why it exists: a tool's answer can parse and still be unusable — a declared field renamed
//! (schema drift), left null or empty, or data older than the caller accepts. Which fields a
//! tool answers with and which field carries its timestamp are the tool's documented interface
//! (a task file's `output` and `as_of`, a gateway's `[tools.NAME] output` and `as_of`), so
//! every front-end that knows the tool judges its answers by the same rules, here:
//! [`breach`] (a declared field missing, drifted or empty), [`map_renamed`] (the repair of a
//! drift: a renamed field mapped back when exactly one key is recognisably it) and [`stale`]
//! (the `as_of` stamp older than the allowed age). Pure: the caller hands in the value and the
//! time. [`ToolConfig`] is the `[tools.NAME]` table every front-end reads these declarations
//! from.

use serde::Deserialize;
use serde_json::Value;

use crate::classifier::Signal;

/// Reads `path` (`a.b[0].c`; `""` is the whole value) in `v`.
pub fn get_path<'v>(v: &'v Value, path: &str) -> Option<&'v Value> {
    let mut cur = v;
    for part in path.split('.').filter(|p| !p.is_empty()) {
        let (name, idx) = match part.split_once('[') {
            Some((n, rest)) => (n, rest.trim_end_matches(']').parse::<usize>().ok()),
            None => (part, None),
        };
        if !name.is_empty() {
            cur = cur.get(name)?;
        }
        if let Some(i) = idx {
            cur = cur.get(i)?;
        }
    }
    Some(cur)
}

/// The top-level key of a field path.
fn top(path: &str) -> &str {
    path.split(['.', '[']).next().unwrap_or(path)
}

/// A key with everything but ASCII letters and digits dropped, lower-cased: `city_v2` reads as
/// `cityv2`, which starts with `city`.
fn normalise(k: &str) -> String {
    k.chars()
        .filter(char::is_ascii_alphanumeric)
        .flat_map(|c| c.to_lowercase())
        .collect()
}

/// The keys of `o` that are recognisably `top` renamed (another key that starts with it, once
/// normalised).
fn renamings<'o>(o: &'o serde_json::Map<String, Value>, top: &str) -> Vec<&'o String> {
    let want = normalise(top);
    o.keys()
        .filter(|k| *k != top && normalise(k).starts_with(&want))
        .collect()
}

/// How an answer breaks its tool's output contract.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Breach {
    /// A declared field is absent (renamed past recognition, or dropped), or recognisably
    /// renamed: schema drift, which [`map_renamed`] may repair.
    Drifted {
        /// The declared field.
        field: String,
    },
    /// A declared field is there but null or an empty array.
    Empty {
        /// The declared field.
        field: String,
    },
}

impl Breach {
    /// The monitor's signal for this breach of `value`.
    pub fn signal(&self, value: &Value) -> Signal {
        match self {
            Breach::Drifted { field } => Signal::SchemaDrift {
                detail: format!("no `{field}` in {value}"),
            },
            Breach::Empty { .. } => Signal::EmptyOutput,
        }
    }

    /// The declared field.
    pub fn field(&self) -> &str {
        match self {
            Breach::Drifted { field } | Breach::Empty { field } => field,
        }
    }
}

/// The first declared field of `fields` that `value` lacks: absent or recognisably renamed (a
/// drift), or null or an empty array (empty). `None` when every field is there and filled, or
/// when no field is declared.
pub fn breach(value: &Value, fields: &[String]) -> Option<Breach> {
    for p in fields {
        let got = get_path(value, p);
        let missing = match got {
            None | Some(Value::Null) => true,
            Some(Value::Array(a)) => a.is_empty(),
            Some(_) => false,
        };
        if !missing {
            continue;
        }
        let drifted = value
            .as_object()
            .is_some_and(|o| !renamings(o, top(p)).is_empty());
        return Some(if drifted || got.is_none() {
            Breach::Drifted { field: p.clone() }
        } else {
            Breach::Empty { field: p.clone() }
        });
    }
    None
}

/// The repair of a schema drift: every declared field that is missing is mapped back from the
/// one key that is recognisably it renamed (`city_v2` → `city`). Refused (with why) when a
/// field has no such key or several: naming one would be a guess.
pub fn map_renamed(value: &Value, fields: &[String]) -> Result<Value, String> {
    let mut v = value.clone();
    for p in fields {
        if get_path(&v, p).is_some_and(|x| !x.is_null()) {
            continue;
        }
        let top = top(p).to_owned();
        let Some(o) = v.as_object_mut() else {
            return Err("the answer is not an object".into());
        };
        // A field missing inside a key that is there (`results[0].population` with `results`
        // present) is not a renamed key: mapping another key over it would discard `results`.
        if o.get(&top).is_some_and(|x| !x.is_null()) {
            return Err(format!("field `{p}` is missing inside `{top}`"));
        }
        let found: Vec<String> = renamings(o, &top).into_iter().cloned().collect();
        match found.as_slice() {
            [one] => {
                if let Some(x) = o.remove(one) {
                    o.insert(top.clone(), x);
                }
            }
            _ => return Err(format!("field `{top}` is missing and cannot be mapped")),
        }
    }
    Ok(v)
}

/// The value of the declared field `path` in `answer`, an equivalent source's answer that lacks
/// it, read through a schema drift — for a cross-check against that source, not to repair its
/// answer (see [`crate::cross_check_declared`]). `fields` are the tool's declared fields,
/// `stamp` the field that stamps when its data was current (not a value), and `like` the value
/// being checked, whose JSON kind the reading must have.
///
/// The key read is the one that is recognisably `path`'s key renamed (`price_v2`), as
/// [`map_renamed`] reads it; else, when `path`'s key is the one declared key `answer` lacks,
/// the one key of `answer` that no declared field (nor the stamp) names and that holds a value
/// of `like`'s kind — a rename past recognition (`f85`), found by elimination. `None` when the
/// key is there (the field is missing inside it), or no key or several qualify: naming one
/// would be a guess.
pub fn read_through_drift<'v>(
    answer: &'v Value,
    path: &str,
    fields: &[String],
    stamp: Option<&str>,
    like: &Value,
) -> Option<&'v Value> {
    let o = answer.as_object()?;
    let key = top(path);
    if o.contains_key(key) {
        return None;
    }
    let rest = &path[key.len()..];
    let read = |k: &String| get_path(&o[k.as_str()], rest);
    let recognised = renamings(o, key);
    let found = match recognised.as_slice() {
        [one] => Some(*one),
        [] => {
            let declared = |k: &str| fields.iter().any(|f| top(f) == k) || stamp == Some(k);
            let mut missing: Vec<&str> = fields
                .iter()
                .map(|f| top(f))
                .filter(|k| !o.contains_key(*k))
                .collect();
            missing.sort_unstable();
            missing.dedup();
            let candidates: Vec<&String> = o
                .keys()
                .filter(|k| !declared(k))
                .filter(|k| read(k).is_some_and(|v| same_kind(v, like)))
                .collect();
            match (missing.as_slice(), candidates.as_slice()) {
                ([m], [one]) if *m == key => Some(*one),
                _ => None,
            }
        }
        _ => None,
    }?;
    read(found)
}

/// Whether two values are of the same JSON kind (number, string, boolean, array, object).
fn same_kind(a: &Value, b: &Value) -> bool {
    matches!(
        (a, b),
        (Value::Number(_), Value::Number(_))
            | (Value::String(_), Value::String(_))
            | (Value::Bool(_), Value::Bool(_))
            | (Value::Array(_), Value::Array(_))
            | (Value::Object(_), Value::Object(_))
    )
}

/// The staleness of an answer whose `as_of_field` stamps when its data was current (a number,
/// milliseconds on the caller's clock): the signal when it is older than `max_age_ms` at
/// `now_ms`. An answer without the stamp is not judged.
pub fn stale(value: &Value, as_of_field: &str, now_ms: u64, max_age_ms: u64) -> Option<Signal> {
    let t = get_path(value, as_of_field)?.as_u64()?;
    let age_ms = now_ms.saturating_sub(t);
    (age_ms > max_age_ms).then_some(Signal::Stale { age_ms, max_age_ms })
}

/// `value` without its `as_of_field` (the stamp is when the data was read, not a value two
/// sources should agree on).
pub fn without_stamp(value: &Value, as_of_field: &str) -> Value {
    let mut v = value.clone();
    if let Some(o) = v.as_object_mut() {
        o.remove(as_of_field);
    }
    v
}

/// What the operator knows about one of the agents' tools: a `[tools.NAME]` table, read by
/// every front-end that carries out tool contracts (the gateway's `selfheal.toml`, the MCP
/// proxy's `selfheal mcp --config`), so one table means one thing wherever it is written. The
/// rules that judge answers by it are this module's; what a front-end can carry out of it is
/// its own to say (a key it cannot honour is refused, not ignored).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolConfig {
    /// An equivalent tool that answers the same question with the same arguments: the
    /// policy's `substitute` when this one fails, and the second source of its cross-check.
    pub substitute: Option<String>,
    /// Whether this tool's answers (and its substitute's) are cross-checked before they are
    /// used (default `false`): against the other source when the tool has a `substitute`, and
    /// otherwise against a second read of the tool itself with the same arguments (a source
    /// whose answer changes between two reads of one call did not give a settled one; the
    /// benchmark's in-process client checks a tool with no equivalent the same way).
    #[serde(default)]
    pub cross_check: bool,
    /// How far the two sources' numbers may differ and still agree.
    #[serde(default)]
    pub tolerance: crate::verifier::Tolerance,
    /// Whether this tool's arguments are copied from the conversation — the user's request or
    /// an earlier tool result — and never invented (default `false`). A call whose identifiers
    /// or numbers appear nowhere in the conversation is then the model's mistake, re-asked
    /// along the `argument_invalid` ladder ([`crate::verifier::ungrounded_arguments`] is the
    /// rule).
    #[serde(default)]
    pub grounded: bool,
    /// The fields this tool's answers declare (its output contract: top-level names or paths
    /// such as `a.b[0]`; default none). An answer without one of them — renamed past
    /// recognition, dropped — is schema drift, repaired by mapping back the one key that is
    /// recognisably the field renamed (`city_v2` → `city`, [`map_renamed`]) and otherwise
    /// fetched again along the `malformed_output` ladder; one with a declared field null or
    /// empty is an empty output ([`breach`]). The benchmark's in-process client applies the
    /// same rules to the task file's declared outputs.
    #[serde(default)]
    pub output: Vec<String>,
    /// The field in which this tool stamps when its data was current, as Unix time in
    /// milliseconds (default none: no freshness check). An answer older than `max_age_ms` by
    /// the front-end's wall clock is stale context ([`stale`]), which the policy refreshes
    /// (when `refresh` is declared) or substitutes.
    #[serde(default)]
    pub as_of: Option<String>,
    /// The oldest an `as_of` stamp may be, in milliseconds (default one hour).
    #[serde(default = "default_max_age_ms")]
    pub max_age_ms: u64,
    /// The boolean argument that makes this tool bypass its cache (default none: the tool
    /// cannot be refreshed). With it, the policy's `refresh` — of stale data, or of a value its
    /// second source contradicts — is the same call again with this argument set to `true`.
    #[serde(default)]
    pub refresh: Option<String>,
    /// Whether this tool's values are read once more before they are relied on after a
    /// recovery (default `false`): the core's read before answering
    /// ([`crate::policy::Policy::reread_after_recovery`]), for a tool no second source can
    /// confirm.
    #[serde(default)]
    pub reread: bool,
    /// Whether calling this tool again with the same arguments right after its answer is how
    /// it is used (default `false`): a tool polled until a job is done, a clock, a queue read.
    /// Otherwise such a call repeats one whose result the conversation already has (the
    /// control loop's repetition), and the gateway re-asks it rather than forwarding it.
    #[serde(default)]
    pub repeatable: bool,
}

fn default_max_age_ms() -> u64 {
    3_600_000
}

impl Default for ToolConfig {
    /// Nothing known: no substitute, no cross-check, no grounding, no contract, no freshness.
    fn default() -> Self {
        ToolConfig {
            substitute: None,
            cross_check: false,
            tolerance: crate::verifier::Tolerance::default(),
            grounded: false,
            output: Vec::new(),
            as_of: None,
            max_age_ms: default_max_age_ms(),
            refresh: None,
            reread: false,
            repeatable: false,
        }
    }
}

impl ToolConfig {
    /// Checks the table of tool `name`: a tool is not its own substitute, the fields it names
    /// are not blank, and a freshness check allows some age. The problem, as the operator
    /// reads it, when there is one.
    pub fn validate(&self, name: &str) -> Result<(), String> {
        if self.substitute.as_deref() == Some(name) {
            return Err(format!(
                "[tools.{name}]: a tool cannot be its own substitute"
            ));
        }
        let blank = [self.as_of.as_deref(), self.refresh.as_deref()]
            .into_iter()
            .flatten()
            .chain(self.output.iter().map(String::as_str))
            .any(|f| f.trim().is_empty());
        if blank {
            return Err(format!(
                "[tools.{name}]: output, as_of and refresh name fields, and a name is not blank"
            ));
        }
        if self.as_of.is_some() && self.max_age_ms == 0 {
            return Err(format!("[tools.{name}]: max_age_ms must be positive"));
        }
        Ok(())
    }

    /// How `value`, an answer of this tool, breaks what the table declares, judged at
    /// `wall_ms` (Unix time in milliseconds): a declared field drifted or empty ([`breach`])
    /// first, else an `as_of` stamp older than `max_age_ms` ([`stale`]). The signal the
    /// classifier reads, and the breach when it is one of the declared fields (a drift is
    /// what [`map_renamed`] may repair).
    pub fn judge(&self, value: &Value, wall_ms: u64) -> Option<(Signal, Option<Breach>)> {
        if let Some(b) = breach(value, &self.output) {
            return Some((b.signal(value), Some(b)));
        }
        let as_of = self.as_of.as_deref()?;
        stale(value, as_of, wall_ms, self.max_age_ms).map(|s| (s, None))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    fn fields(f: &[&str]) -> Vec<String> {
        f.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn breaches_are_told_apart() {
        let f = fields(&["city"]);
        assert_eq!(breach(&json!({"city": "Paris"}), &f), None);
        assert_eq!(
            breach(&json!({"city_v2": "Paris"}), &f),
            Some(Breach::Drifted {
                field: "city".into()
            })
        );
        assert_eq!(
            breach(&json!({"f12": "Paris"}), &f),
            Some(Breach::Drifted {
                field: "city".into()
            })
        );
        assert_eq!(
            breach(&json!({"city": null}), &f),
            Some(Breach::Empty {
                field: "city".into()
            })
        );
        assert_eq!(breach(&json!({"f12": "Paris"}), &[]), None);
        assert!(matches!(
            Breach::Empty { field: "x".into() }.signal(&json!({})),
            Signal::EmptyOutput
        ));
    }

    #[test]
    fn only_a_recognisable_rename_is_mapped() {
        let f = fields(&["city"]);
        let v = map_renamed(&json!({"city_v2": "Paris", "as_of": 5}), &f).unwrap();
        assert_eq!(v, json!({"city": "Paris", "as_of": 5}));
        assert!(map_renamed(&json!({"f12": "Paris"}), &f).is_err());
        assert!(map_renamed(&json!({"city_a": 1, "city_b": 2}), &f).is_err());
        // A nested field missing under a key that is there is refused, not mapped over it.
        let nested = ["results[0].population".to_owned()];
        let v = json!({"results": [{"pop": 5}], "results_v2": [{"population": 7}]});
        assert!(map_renamed(&v, &nested).is_err());
    }

    #[test]
    fn staleness_reads_the_declared_stamp() {
        let v = json!({"rate": 1.1, "as_of": 1_000});
        assert_eq!(stale(&v, "as_of", 2_000, 5_000), None);
        assert_eq!(
            stale(&v, "as_of", 10_000, 5_000),
            Some(Signal::Stale {
                age_ms: 9_000,
                max_age_ms: 5_000
            })
        );
        assert_eq!(stale(&v, "fetched_at", 10_000, 5_000), None);
        assert_eq!(without_stamp(&v, "as_of"), json!({"rate": 1.1}));
    }
}
