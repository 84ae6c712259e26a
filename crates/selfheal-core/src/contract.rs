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
//! time.

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
