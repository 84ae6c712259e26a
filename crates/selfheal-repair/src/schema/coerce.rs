//! The coercion walk: safe fixes guided by the schema, before validation.
//!
//! Only changes that cannot alter what the model meant are made: a numeric string where a
//! number is required (never one with leading zeros: `"0789"` is an id, not 789), `"true"`
//! where a boolean is, a lone value where an array is, a number where a string is; and, when
//! the caller opts in, a declared default for a missing property or the removal of an
//! unknown property where `additionalProperties` is `false`. Anything else is left for
//! validation to report.
//!
//! A property is known when `properties` names it or a `patternProperties` regex matches it;
//! its value is coerced against every sub-schema that describes it. A pattern that cannot be
//! compiled or evaluated might match any property, so while one is present nothing is
//! dropped: data is never lost to a schema we cannot read.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};

use fancy_regex::Regex;
use serde_json::{Map, Value};

use super::normalise::{LISTS, MAPS, SINGLE};
use super::{Coercion, CoercionKind};

/// Deepest value nesting the walk follows (recursive `$ref`s stop here).
const MAX_WALK_DEPTH: usize = 256;
/// `$ref` hops followed in a row before giving up (a cycle).
const MAX_REF_HOPS: usize = 32;

/// Walks `value` along `schema`, coercing in place and recording each change.
pub(crate) struct Walker<'s> {
    pub(crate) root: &'s Value,
    pub(crate) patterns: &'s Patterns,
    pub(crate) coercions: Vec<Coercion>,
    /// Fill missing properties with their declared defaults.
    pub(crate) fill_defaults: bool,
    /// Remove properties `additionalProperties: false` forbids.
    pub(crate) drop_unknown: bool,
}

/// The `patternProperties` regexes of a schema, compiled once; `None` for a pattern that does
/// not compile.
///
/// Patterns are ECMA-262 regexes. They are compiled as written with `fancy-regex`, the engine
/// the validator uses (look-around and backreferences work), but without the validator's
/// translation of ECMA syntax: `\d`, `\w`, `\s` and `\b` are Unicode-aware here and
/// ASCII-only (`\s` aside) for the validator, so a key with non-ASCII letters or digits can
/// be judged differently by the two. ECMA-only syntax such as `\cA` does not compile here and
/// makes every property count as known.
#[derive(Debug)]
pub(crate) struct Patterns(HashMap<String, Option<Regex>>);

impl Patterns {
    /// Compiles the `patternProperties` keys of `schema` and of all its sub-schemas.
    pub(crate) fn collect(schema: &Value) -> Self {
        let mut compiled = HashMap::new();
        let mut todo = vec![schema];
        while let Some(s) = todo.pop() {
            let Value::Object(obj) = s else { continue };
            if let Some(Value::Object(pp)) = obj.get("patternProperties") {
                for pattern in pp.keys() {
                    compiled
                        .entry(pattern.clone())
                        .or_insert_with(|| Regex::new(pattern).ok());
                }
            }
            todo.extend(SINGLE.iter().filter_map(|kw| obj.get(*kw)));
            for kw in MAPS {
                if let Some(Value::Object(map)) = obj.get(kw) {
                    todo.extend(map.values());
                }
            }
            for kw in LISTS {
                if let Some(Value::Array(list)) = obj.get(kw) {
                    todo.extend(list.iter());
                }
            }
        }
        Self(compiled)
    }

    /// The regex for `pattern`; `None` when it does not compile. A pattern in a part of the
    /// schema [`Patterns::collect`] does not visit (reached through an unusual `$ref`) is
    /// compiled on the spot.
    fn get(&self, pattern: &str) -> Option<Cow<'_, Regex>> {
        match self.0.get(pattern) {
            Some(re) => re.as_ref().map(Cow::Borrowed),
            None => Regex::new(pattern).ok().map(Cow::Owned),
        }
    }
}

fn escape(segment: &str) -> String {
    segment.replace('~', "~0").replace('/', "~1")
}

/// The type names a schema allows, if it says.
fn types(schema: &Map<String, Value>) -> Option<Vec<&str>> {
    match schema.get("type")? {
        Value::String(s) => Some(vec![s.as_str()]),
        Value::Array(list) => Some(list.iter().filter_map(Value::as_str).collect()),
        _ => None,
    }
}

fn matches_type(v: &Value, t: &str) -> bool {
    match t {
        "null" => v.is_null(),
        "boolean" => v.is_boolean(),
        "string" => v.is_string(),
        "array" => v.is_array(),
        "object" => v.is_object(),
        "number" => v.is_number(),
        "integer" => v.is_i64() || v.is_u64() || v.as_f64().is_some_and(|f| f.fract() == 0.0),
        _ => true,
    }
}

fn accepts(schema: &Value, v: &Value) -> bool {
    match schema.as_object().and_then(types) {
        Some(ts) => ts.iter().any(|t| matches_type(v, t)),
        None => true,
    }
}

/// Whether numeric text has a leading zero followed by another digit (`007`, `-01.5`).
fn has_leading_zero(t: &str) -> bool {
    let digits = t.trim_start_matches(['-', '+']).as_bytes();
    digits.len() > 1 && digits[0] == b'0' && digits[1].is_ascii_digit()
}

/// `"5"` → 5, `"-3"` → -3, `"5.0"` → 5 (integers only). Never text with leading zeros.
fn parse_integer(s: &str) -> Option<Value> {
    let t = s.trim();
    if has_leading_zero(t) {
        return None;
    }
    if let Ok(n) = t.parse::<i64>() {
        return Some(Value::from(n));
    }
    if let Ok(n) = t.parse::<u64>() {
        return Some(Value::from(n));
    }
    let f: f64 = t.parse().ok()?;
    // Only decimal text with a zero fraction; `inf`/`nan` and huge values are refused.
    let plain = t
        .bytes()
        .all(|c| c.is_ascii_digit() || matches!(c, b'-' | b'+' | b'.'));
    if plain && f.is_finite() && f.fract() == 0.0 && f.abs() < 9.0e15 {
        // The range check above makes the cast exact.
        #[allow(clippy::cast_possible_truncation)]
        return Some(Value::from(f as i64));
    }
    None
}

/// `"2.5"` → 2.5; integer text stays an integer.
fn parse_number(s: &str) -> Option<Value> {
    let t = s.trim();
    if has_leading_zero(t) {
        return None;
    }
    if let Some(v) = parse_integer(t) {
        return Some(v);
    }
    let looks_numeric = !t.is_empty()
        && t.bytes()
            .all(|c| c.is_ascii_digit() || matches!(c, b'-' | b'+' | b'.' | b'e' | b'E'));
    if !looks_numeric {
        return None;
    }
    let f: f64 = t.parse().ok()?;
    serde_json::Number::from_f64(f).map(Value::Number)
}

impl<'s> Walker<'s> {
    fn note(&mut self, pointer: &str, kind: CoercionKind) {
        self.coercions.push(Coercion {
            pointer: pointer.to_owned(),
            kind,
        });
    }

    /// Resolves a local `$ref` (`#/$defs/x`, `#/definitions/x`, `#`).
    fn resolve(&self, reference: &str) -> Option<&'s Value> {
        let fragment = reference.strip_prefix('#')?;
        if fragment.is_empty() {
            return Some(self.root);
        }
        self.root.pointer(fragment)
    }

    pub(crate) fn walk(
        &mut self,
        v: &mut Value,
        schema: &'s Value,
        pointer: &mut String,
        depth: usize,
    ) {
        if depth > MAX_WALK_DEPTH {
            return;
        }
        let mut schema = schema;
        let mut hops = 0;
        // Follow a chain of pure `$ref`s; siblings of a `$ref` are walked below as well.
        while let Some(r) = schema.get("$ref").and_then(Value::as_str) {
            let Some(target) = self.resolve(r) else { break };
            hops += 1;
            if hops > MAX_REF_HOPS {
                return;
            }
            self.walk_here(v, schema, pointer, depth, true);
            schema = target;
        }
        self.walk_here(v, schema, pointer, depth, false);
    }

    fn walk_here(
        &mut self,
        v: &mut Value,
        schema: &'s Value,
        pointer: &mut String,
        depth: usize,
        ref_sibling: bool,
    ) {
        let Some(obj) = schema.as_object() else {
            return;
        };
        if ref_sibling && obj.len() == 1 {
            return;
        }
        if let Some(ts) = types(obj) {
            self.coerce_type(v, &ts, pointer);
        }
        if let Some(Value::Array(options)) = obj.get("enum") {
            self.coerce_enum(v, options, pointer);
        }
        if let Some(Value::Array(all)) = obj.get("allOf") {
            for sub in all {
                self.walk(v, sub, pointer, depth + 1);
            }
        }
        for kw in ["anyOf", "oneOf"] {
            if let Some(Value::Array(branches)) = obj.get(kw) {
                self.walk_union(v, branches, pointer, depth);
            }
        }
        match v {
            Value::Object(map) => self.walk_object(map, obj, pointer, depth),
            Value::Array(items) => self.walk_array(items, obj, pointer, depth),
            _ => {}
        }
    }

    /// `anyOf`/`oneOf`: follow the first branch that takes the value as it is, else the first
    /// branch whose coercion makes it fit.
    fn walk_union(
        &mut self,
        v: &mut Value,
        branches: &'s [Value],
        pointer: &mut String,
        depth: usize,
    ) {
        if let Some(branch) = branches.iter().find(|b| accepts(b, v)) {
            self.walk(v, branch, pointer, depth + 1);
            return;
        }
        for branch in branches {
            let mut trial = v.clone();
            let mut sub = Walker {
                root: self.root,
                patterns: self.patterns,
                coercions: Vec::new(),
                fill_defaults: self.fill_defaults,
                drop_unknown: self.drop_unknown,
            };
            sub.walk(&mut trial, branch, pointer, depth + 1);
            if accepts(branch, &trial) {
                *v = trial;
                self.coercions.append(&mut sub.coercions);
                return;
            }
        }
    }

    fn coerce_type(&mut self, v: &mut Value, ts: &[&str], pointer: &str) {
        if ts.iter().any(|t| matches_type(v, t)) {
            return;
        }
        let has = |t: &str| ts.contains(&t);
        let (new, kind) = match &*v {
            Value::String(s) => {
                if let Some(n) = has("integer").then(|| parse_integer(s)).flatten() {
                    (n, CoercionKind::StringToInteger)
                } else if let Some(n) = has("number").then(|| parse_number(s)).flatten() {
                    (n, CoercionKind::StringToNumber)
                } else if has("boolean") && s.trim().eq_ignore_ascii_case("true") {
                    (Value::Bool(true), CoercionKind::StringToBoolean)
                } else if has("boolean") && s.trim().eq_ignore_ascii_case("false") {
                    (Value::Bool(false), CoercionKind::StringToBoolean)
                } else if has("null") && s.trim() == "null" {
                    (Value::Null, CoercionKind::StringToNull)
                } else if let Some(parsed) = (has("object") || has("array"))
                    .then(|| parse_embedded(s, ts))
                    .flatten()
                {
                    (parsed, CoercionKind::ParsedJsonString)
                } else if has("array") {
                    (Value::Array(vec![v.clone()]), CoercionKind::WrappedInArray)
                } else {
                    return;
                }
            }
            Value::Number(n) => {
                // Only an integer reads back as the digits written: `1.10` parsed is `1.1`.
                if has("string") && (n.is_i64() || n.is_u64()) {
                    (Value::String(n.to_string()), CoercionKind::NumberToString)
                } else if has("array") {
                    (Value::Array(vec![v.clone()]), CoercionKind::WrappedInArray)
                } else {
                    return;
                }
            }
            Value::Bool(_) | Value::Object(_) if has("array") => {
                (Value::Array(vec![v.clone()]), CoercionKind::WrappedInArray)
            }
            _ => return,
        };
        *v = new;
        self.note(pointer, kind);
    }

    fn coerce_enum(&mut self, v: &mut Value, options: &[Value], pointer: &str) {
        if options.contains(v) {
            return;
        }
        let found = match &*v {
            Value::String(s) => {
                let t = s.trim();
                let mut hits = options.iter().filter(|o| match o {
                    Value::String(o) => o.eq_ignore_ascii_case(t),
                    Value::Number(_) | Value::Bool(_) | Value::Null => {
                        serde_json::from_str::<Value>(t).is_ok_and(|x| x == **o)
                    }
                    _ => false,
                });
                match (hits.next(), hits.next()) {
                    (Some(one), None) => Some(one.clone()),
                    _ => None,
                }
            }
            Value::Number(n) => {
                let text = n.to_string();
                options.iter().find(|o| o.as_str() == Some(&text)).cloned()
            }
            _ => None,
        };
        if let Some(new) = found {
            *v = new;
            self.note(pointer, CoercionKind::EnumMatch);
        }
    }

    fn walk_object(
        &mut self,
        map: &mut Map<String, Value>,
        schema: &'s Map<String, Value>,
        pointer: &mut String,
        depth: usize,
    ) {
        let len = pointer.len();
        let props = schema.get("properties").and_then(Value::as_object);
        if let Some(props) = props {
            for (name, sub) in props {
                pointer.push('/');
                pointer.push_str(&escape(name));
                match map.get_mut(name) {
                    Some(child) => self.walk(child, sub, pointer, depth + 1),
                    None => {
                        if let Some(default) = sub
                            .get("default")
                            .filter(|d| self.fill_defaults && accepts(sub, d) && fits_enum(sub, d))
                        {
                            map.insert(name.clone(), default.clone());
                            self.note(pointer, CoercionKind::FilledDefault);
                        }
                    }
                }
                pointer.truncate(len);
            }
        }
        // Keys a pattern matches, or that a pattern could not be evaluated on.
        let mut matched: HashSet<String> = HashSet::new();
        // A pattern that does not compile might match any key.
        let mut unreadable = false;
        if let Some(pattern_props) = schema.get("patternProperties").and_then(Value::as_object) {
            let patterns: &'s Patterns = self.patterns;
            for (pattern, sub) in pattern_props {
                let Some(re) = patterns.get(pattern) else {
                    unreadable = true;
                    continue;
                };
                for (k, child) in map.iter_mut() {
                    match re.is_match(k) {
                        Ok(true) => {
                            matched.insert(k.clone());
                            pointer.push('/');
                            pointer.push_str(&escape(k));
                            self.walk(child, sub, pointer, depth + 1);
                            pointer.truncate(len);
                        }
                        Ok(false) => {}
                        // Backtracking limit hit: it may match; keep the value as it is.
                        Err(_) => {
                            matched.insert(k.clone());
                        }
                    }
                }
            }
        }
        let known =
            |k: &str| unreadable || props.is_some_and(|p| p.contains_key(k)) || matched.contains(k);
        match schema.get("additionalProperties") {
            Some(Value::Bool(false)) if self.drop_unknown => {
                let unknown: Vec<String> = map.keys().filter(|k| !known(k)).cloned().collect();
                for k in unknown {
                    map.remove(&k);
                    pointer.push('/');
                    pointer.push_str(&escape(&k));
                    self.note(pointer, CoercionKind::DroppedUnknownProperty);
                    pointer.truncate(len);
                }
            }
            Some(sub @ Value::Object(_)) => {
                for (k, child) in map.iter_mut() {
                    if !known(k) {
                        pointer.push('/');
                        pointer.push_str(&escape(k));
                        self.walk(child, sub, pointer, depth + 1);
                        pointer.truncate(len);
                    }
                }
            }
            _ => {}
        }
    }

    fn walk_array(
        &mut self,
        items: &mut [Value],
        schema: &'s Map<String, Value>,
        pointer: &mut String,
        depth: usize,
    ) {
        let len = pointer.len();
        // 2020-12 `prefixItems` + `items`; draft 7 `items: [...]` + `additionalItems`.
        let (prefix, rest) = match (schema.get("prefixItems"), schema.get("items")) {
            (Some(Value::Array(p)), rest) => (p.as_slice(), rest),
            (None, Some(Value::Array(p))) => (p.as_slice(), schema.get("additionalItems")),
            (_, rest) => (&[][..], rest),
        };
        for (i, item) in items.iter_mut().enumerate() {
            let sub = match prefix.get(i) {
                Some(s) => s,
                None => match rest {
                    Some(s @ Value::Object(_)) => s,
                    _ => continue,
                },
            };
            pointer.push('/');
            pointer.push_str(&i.to_string());
            self.walk(item, sub, pointer, depth + 1);
            pointer.truncate(len);
        }
    }
}

/// Whether `v` is one of the schema's `enum` members, when it lists them.
fn fits_enum(schema: &Value, v: &Value) -> bool {
    match schema.get("enum") {
        Some(Value::Array(options)) => options.contains(v),
        _ => true,
    }
}

/// A string holding a JSON object or array, where one is required.
fn parse_embedded(s: &str, ts: &[&str]) -> Option<Value> {
    let t = s.trim();
    if !(t.starts_with('{') || t.starts_with('[')) {
        return None;
    }
    let repaired = crate::repair(t).ok()?;
    let clean = !repaired.repairs.iter().any(|r| {
        matches!(
            r.kind,
            crate::RepairKind::ExtractedFromProse
                | crate::RepairKind::TrailingGarbage
                | crate::RepairKind::LeadingGarbage
        )
    });
    (clean && ts.iter().any(|ty| matches_type(&repaired.value, ty))).then_some(repaired.value)
}
