//! The task catalogue: deterministic local tools, a small world they read, and 100 tasks.
//!
//! The world is generated from a fixed seed that never changes with the run's seed, so the tasks
//! and their oracle answers are the same for every run; only the fault schedule varies. Tools come
//! in *groups* of equivalent sources (a primary and a substitute that return the same data), so
//! that substitution and cross-checking mean something, and some tools report an `as_of`
//! timestamp so that staleness can be detected. Two local calculators have no substitute.
//!
//! The simulated benchmark converts these tasks to [`crate::task::TaskSpec`] and runs them in
//! [`crate::exec`], whose substitutes are *not* identical to the primaries (documented noise per
//! group, see `docs/bench/faults.md`). [`truth`] is public for the live bench; strategies never
//! call it (a test checks their source).

use serde_json::{Value, json};

use selfheal_core::{Rng, SplitMix64};

/// A family of equivalent tools.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Group {
    /// Country → capital city.
    Capital,
    /// Country → currency code.
    Currency,
    /// City → current temperature (°C), with `as_of`.
    Weather,
    /// Currency pair → exchange rate, with `as_of`.
    Fx,
    /// Company → ticker symbol.
    Ticker,
    /// Ticker → share price (USD), with `as_of`.
    Price,
    /// Topic → document ids.
    Search,
    /// Document id → the figure it reports.
    Fetch,
    /// Unit conversion (local, no substitute).
    Convert,
    /// Multiplication (local, no substitute).
    Multiply,
}

impl Group {
    /// Every group.
    pub const ALL: [Group; 10] = [
        Group::Capital,
        Group::Currency,
        Group::Weather,
        Group::Fx,
        Group::Ticker,
        Group::Price,
        Group::Search,
        Group::Fetch,
        Group::Convert,
        Group::Multiply,
    ];

    /// The primary tool's name.
    pub fn primary(self) -> &'static str {
        match self {
            Group::Capital => "geo.capital",
            Group::Currency => "geo.currency",
            Group::Weather => "weather.current",
            Group::Fx => "fx.rate",
            Group::Ticker => "company.ticker",
            Group::Price => "stock.quote",
            Group::Search => "search.web",
            Group::Fetch => "docs.fetch",
            Group::Convert => "calc.convert",
            Group::Multiply => "calc.multiply",
        }
    }

    /// The equivalent substitute, if the group has one.
    pub fn substitute(self) -> Option<&'static str> {
        match self {
            Group::Capital => Some("atlas.capital"),
            Group::Currency => Some("atlas.currency"),
            Group::Weather => Some("weather.backup"),
            Group::Fx => Some("fx.mirror"),
            Group::Ticker => Some("finance.lookup"),
            Group::Price => Some("stock.alt"),
            Group::Search => Some("search.index"),
            Group::Fetch => Some("docs.mirror"),
            Group::Convert | Group::Multiply => None,
        }
    }

    /// Whether the tool reads external data (and so can be faulted on the tool side).
    pub fn is_external(self) -> bool {
        self.substitute().is_some()
    }

    /// Whether the output carries an `as_of` timestamp.
    pub fn has_freshness(self) -> bool {
        matches!(self, Group::Weather | Group::Fx | Group::Price)
    }

    /// The output field later steps read.
    pub fn field(self) -> &'static str {
        match self {
            Group::Capital => "city",
            Group::Currency => "currency",
            Group::Weather => "temp_c",
            Group::Fx => "rate",
            Group::Ticker => "ticker",
            Group::Price => "price",
            Group::Search => "results",
            Group::Fetch => "figure",
            Group::Convert | Group::Multiply => "value",
        }
    }

    /// The argument names, in order.
    pub fn params(self) -> &'static [&'static str] {
        match self {
            Group::Capital | Group::Currency => &["country"],
            Group::Weather => &["city"],
            Group::Fx => &["from", "to"],
            Group::Ticker => &["company"],
            Group::Price => &["ticker"],
            Group::Search => &["query"],
            Group::Fetch => &["id"],
            Group::Convert => &["value", "unit"],
            Group::Multiply => &["a", "b"],
        }
    }

    /// The tool's input JSON Schema.
    pub fn schema(self) -> Value {
        let props: serde_json::Map<String, Value> = self
            .params()
            .iter()
            .map(|p| {
                let ty = match (self, *p) {
                    (Group::Convert, "value") | (Group::Multiply, _) => "number",
                    _ => "string",
                };
                ((*p).to_owned(), json!({"type": ty}))
            })
            .collect();
        json!({"type": "object", "properties": props, "required": self.params(), "additionalProperties": false})
    }
}

/// Where an argument's value comes from.
#[derive(Debug, Clone, PartialEq)]
pub enum Arg {
    /// A literal from the task.
    Lit(Value),
    /// The output field of an earlier step.
    Ref(usize),
}

/// One step of a plan.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    /// The tool group.
    pub group: Group,
    /// Arguments, in the order of [`Group::params`].
    pub args: Vec<Arg>,
}

/// A task: a plan and its oracle answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Task {
    /// 0-based id.
    pub id: usize,
    /// The template it came from.
    pub template: &'static str,
    /// The plan.
    pub steps: Vec<Step>,
    /// The correct final answer.
    pub oracle: Value,
    /// The user's request: states every input the plan's calls take, and names one more entity
    /// of the same kind (a second country, company or topic), as real requests do.
    pub prompt: String,
    /// The values the request names: the task's inputs and the other entity. The simulated model
    /// draws a wrong value from the context among these and earlier results.
    pub mentions: Vec<Value>,
}

const COUNTRIES: [&str; 20] = [
    "France", "Japan", "Brazil", "Kenya", "Canada", "India", "Norway", "Chile", "Egypt", "Vietnam",
    "Mexico", "Poland", "Ghana", "Peru", "Spain", "Korea", "Turkey", "Nepal", "Chad", "Fiji",
];
pub(crate) const COMPANIES: [&str; 12] = [
    "Acme",
    "Globex",
    "Initech",
    "Umbrella",
    "Hooli",
    "Vandelay",
    "Stark",
    "Wayne",
    "Tyrell",
    "Cyberdyne",
    "Soylent",
    "Wonka",
];
const TOPICS: [&str; 10] = [
    "rail length",
    "river flow",
    "bridge span",
    "road network",
    "coastline",
    "tunnel depth",
    "cable run",
    "pipeline",
    "canal reach",
    "trail length",
];

fn h(parts: &[&str]) -> u64 {
    // FNV-1a: stable across platforms and Rust versions, so the world never changes.
    let mut x: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for b in p.bytes().chain(std::iter::once(0xff)) {
            x ^= u64::from(b);
            x = x.wrapping_mul(0x0100_0000_01b3);
        }
    }
    x
}

fn round(x: f64, places: i32) -> f64 {
    let m = 10f64.powi(places);
    (x * m).round() / m
}

/// The world's ground truth: what each tool returns when nothing is wrong.
pub(crate) fn truth(group: Group, args: &[Value]) -> Result<Value, String> {
    let s = |i: usize| args.get(i).and_then(Value::as_str).unwrap_or("");
    let n = |i: usize| args.get(i).and_then(Value::as_f64);
    let v = match group {
        Group::Capital => {
            let c = s(0);
            if !COUNTRIES.contains(&c) {
                return Err(format!("unknown country {c:?}"));
            }
            json!({"city": format!("{c} City")})
        }
        Group::Currency => {
            let c = s(0);
            if !COUNTRIES.contains(&c) {
                return Err(format!("unknown country {c:?}"));
            }
            let code: String = c.chars().take(2).collect::<String>().to_uppercase() + "D";
            json!({"currency": code})
        }
        Group::Weather => {
            let city = s(0);
            if !city.ends_with(" City") {
                return Err(format!("unknown city {city:?}"));
            }
            let t = (h(&["temp", city]) % 400) as f64 / 10.0 - 5.0;
            json!({"temp_c": round(t, 1)})
        }
        Group::Fx => {
            let (a, b) = (s(0), s(1));
            if a.len() != 3 || b.len() != 3 {
                return Err(format!("unknown currency pair {a:?}/{b:?}"));
            }
            let rate = if a == b {
                1.0
            } else {
                0.2 + (h(&["fx", a, b]) % 30_000) as f64 / 10_000.0
            };
            json!({"rate": round(rate, 4)})
        }
        Group::Ticker => {
            let c = s(0);
            if !COMPANIES.contains(&c) {
                return Err(format!("unknown company {c:?}"));
            }
            json!({"ticker": c.chars().take(4).collect::<String>().to_uppercase()})
        }
        Group::Price => {
            let t = s(0);
            if t.is_empty() || t.len() > 4 {
                return Err(format!("unknown ticker {t:?}"));
            }
            json!({"price": round(10.0 + (h(&["px", t]) % 90_000) as f64 / 100.0, 2)})
        }
        Group::Search => {
            let q = s(0);
            if !TOPICS.contains(&q) {
                return Err(format!("no index for {q:?}"));
            }
            json!({"results": [format!("doc-{}", h(&["doc", q]) % 1000)]})
        }
        Group::Fetch => {
            let id = s(0);
            if !id.starts_with("doc-") {
                return Err(format!("no document {id:?}"));
            }
            json!({"figure": round((h(&["fig", id]) % 50_000) as f64 / 10.0, 1)})
        }
        Group::Convert => {
            let (Some(x), unit) = (n(0), s(1)) else {
                return Err("value must be a number".into());
            };
            let y = match unit {
                "c_to_f" => x * 9.0 / 5.0 + 32.0,
                "km_to_mi" => x * 0.621_371,
                other => return Err(format!("unknown unit {other:?}")),
            };
            json!({"value": round(y, 3)})
        }
        Group::Multiply => {
            let (Some(a), Some(b)) = (n(0), n(1)) else {
                return Err("a and b must be numbers".into());
            };
            json!({"value": round(a * b, 3)})
        }
    };
    Ok(v)
}

/// What a group's sibling tool returns (`crate::task::sibling` names it): a real answer to a
/// different question, of the same shape — the largest city rather than the capital, the old
/// currency code, tomorrow's forecast, yesterday's rate, the parent company's ticker, the
/// opening price, a news hit, a summary's rounded figure, a rule-of-thumb conversion, a product
/// of rounded factors. Refuses what the primary refuses.
pub(crate) fn sibling_truth(group: Group, args: &[Value]) -> Result<Value, String> {
    let base = truth(group, args)?;
    let s = |i: usize| args.get(i).and_then(Value::as_str).unwrap_or("");
    let n = |i: usize| args.get(i).and_then(Value::as_f64).unwrap_or(0.0);
    let num = |f: &str| base.get(f).and_then(Value::as_f64).unwrap_or(0.0);
    // A signed offset in ±[lo, hi] of the value, fixed per call.
    let off = |tag: &str, lo: f64, hi: f64| {
        let h = h(&[tag, &args.iter().map(Value::to_string).collect::<String>()]);
        let mag = lo + (hi - lo) * ((h % 1000) as f64 / 1000.0);
        if h & 1024 == 0 { mag } else { -mag }
    };
    let v = match group {
        Group::Capital => json!({"city": format!("Port {} City", s(0))}),
        Group::Currency => {
            json!({"currency": s(0).chars().take(3).collect::<String>().to_uppercase()})
        }
        Group::Weather => json!({"temp_c": round(num("temp_c") + off("fc", 1.5, 6.0), 1)}),
        Group::Fx => json!({"rate": round(num("rate") * (1.0 + off("fy", 0.02, 0.08)), 4)}),
        Group::Ticker => {
            json!({"ticker": format!("P{}", s(0).chars().take(3).collect::<String>().to_uppercase())})
        }
        Group::Price => json!({"price": round(num("price") * (1.0 + off("op", 0.03, 0.09)), 2)}),
        Group::Search => json!({"results": [format!("doc-{}", h(&["news", s(0)]) % 1000)]}),
        Group::Fetch => json!({"figure": round(num("figure") * (1.0 + off("sm", 0.05, 0.2)), 0)}),
        Group::Convert => {
            let y = match s(1) {
                "c_to_f" => n(0) * 2.0 + 30.0,
                _ => n(0) * 0.6,
            };
            json!({"value": round(y, 0)})
        }
        Group::Multiply => json!({"value": n(0).round() * n(1).round()}),
    };
    Ok(v)
}

/// The value a step passes on: its output field, or the first search result.
pub(crate) fn extract(group: Group, output: &Value) -> Result<Value, String> {
    let field = group.field();
    match output.get(field) {
        Some(Value::Array(a)) => a
            .first()
            .cloned()
            .ok_or_else(|| format!("IndexError: `{field}` is empty")),
        Some(Value::Null) | None => Err(format!("KeyError: missing field `{field}`")),
        Some(v) => Ok(v.clone()),
    }
}

fn lit(s: &str) -> Arg {
    Arg::Lit(Value::String(s.to_owned()))
}

/// The 100 tasks, built from five templates over a fixed world.
pub fn tasks() -> Vec<Task> {
    let mut rng = SplitMix64::new(0x5E1F_4EA1);
    let mut out = Vec::with_capacity(100);
    for id in 0..100 {
        let country = COUNTRIES[rng.below(COUNTRIES.len() as u64) as usize];
        let company = COMPANIES[rng.below(COMPANIES.len() as u64) as usize];
        let topic = TOPICS[rng.below(TOPICS.len() as u64) as usize];
        let n = json!(10 + rng.below(990));
        let amount = Arg::Lit(n.clone());
        let step = |group, args| Step { group, args };
        let (template, steps) = match id % 5 {
            // Temperature in a country's capital, in Fahrenheit.
            0 => (
                "capital-weather-f",
                vec![
                    step(Group::Capital, vec![lit(country)]),
                    step(Group::Weather, vec![Arg::Ref(0)]),
                    step(Group::Convert, vec![Arg::Ref(1), lit("c_to_f")]),
                ],
            ),
            // An amount of a country's currency in USD.
            1 => (
                "currency-to-usd",
                vec![
                    step(Group::Currency, vec![lit(country)]),
                    step(Group::Fx, vec![Arg::Ref(0), lit("USD")]),
                    step(Group::Multiply, vec![Arg::Ref(1), amount]),
                ],
            ),
            // A company's share price in a country's currency.
            2 => (
                "share-price-local",
                vec![
                    step(Group::Currency, vec![lit(country)]),
                    step(Group::Ticker, vec![lit(company)]),
                    step(Group::Price, vec![Arg::Ref(1)]),
                    step(Group::Fx, vec![lit("USD"), Arg::Ref(0)]),
                    step(Group::Multiply, vec![Arg::Ref(2), Arg::Ref(3)]),
                ],
            ),
            // A figure from a document, converted to miles and scaled.
            3 => (
                "document-figure",
                vec![
                    step(Group::Search, vec![lit(topic)]),
                    step(Group::Fetch, vec![Arg::Ref(0)]),
                    step(Group::Convert, vec![Arg::Ref(1), lit("km_to_mi")]),
                    step(Group::Multiply, vec![Arg::Ref(2), amount]),
                ],
            ),
            // A temperature-indexed price: six steps over four sources.
            _ => (
                "weather-indexed-price",
                vec![
                    step(Group::Capital, vec![lit(country)]),
                    step(Group::Weather, vec![Arg::Ref(0)]),
                    step(Group::Ticker, vec![lit(company)]),
                    step(Group::Price, vec![Arg::Ref(2)]),
                    step(Group::Convert, vec![Arg::Ref(1), lit("c_to_f")]),
                    step(Group::Multiply, vec![Arg::Ref(3), Arg::Ref(4)]),
                ],
            ),
        };
        let oracle = run_clean(&steps).unwrap_or(Value::Null);
        // The other entity is picked without the generator, so the tasks stay as they were.
        let other_country =
            COUNTRIES[(index_of(&COUNTRIES, country) + 1 + id % 7) % COUNTRIES.len()];
        let other_company =
            COMPANIES[(index_of(&COMPANIES, company) + 1 + id % 5) % COMPANIES.len()];
        let other_topic = TOPICS[(index_of(&TOPICS, topic) + 1 + id % 3) % TOPICS.len()];
        let (prompt, mentions) = match id % 5 {
            0 => (
                format!(
                    "What is the temperature in the capital of {country} right now, in Fahrenheit \
                     (unit c_to_f)? I am calling from {other_country}."
                ),
                vec![json!(country), json!(other_country), json!("c_to_f")],
            ),
            1 => (
                format!(
                    "How much are {n} units of {country}'s currency worth in USD? I usually pay \
                     in {other_country}'s."
                ),
                vec![
                    json!(country),
                    json!(other_country),
                    json!("USD"),
                    n.clone(),
                ],
            ),
            2 => (
                format!(
                    "What is {company}'s share price (quoted in USD) in {country}'s currency? \
                     Not {other_company}'s."
                ),
                vec![
                    json!(country),
                    json!(company),
                    json!(other_company),
                    json!("USD"),
                ],
            ),
            3 => (
                format!(
                    "Search for the {topic} document, take its figure in km, convert it \
                     km_to_mi and multiply by {n}. (The {other_topic} one is not it.)"
                ),
                vec![
                    json!(topic),
                    json!(other_topic),
                    json!("km_to_mi"),
                    n.clone(),
                ],
            ),
            _ => (
                format!(
                    "Multiply {company}'s share price by the Fahrenheit (c_to_f) temperature in \
                     the capital of {country}; I hold {other_company} too, but not for this."
                ),
                vec![
                    json!(country),
                    json!(company),
                    json!(other_company),
                    json!("c_to_f"),
                ],
            ),
        };
        out.push(Task {
            id,
            template,
            steps,
            oracle,
            prompt,
            mentions,
        });
    }
    out
}

fn index_of(xs: &[&str], x: &str) -> usize {
    xs.iter().position(|y| *y == x).unwrap_or(0)
}

/// Runs a plan with no faults and returns the final value.
pub(crate) fn run_clean(steps: &[Step]) -> Result<Value, String> {
    let mut values: Vec<Option<Value>> = Vec::with_capacity(steps.len());
    for s in steps {
        let args = resolve_present(s, &values)?;
        let out = truth(s.group, &args)?;
        values.push(Some(extract(s.group, &out)?));
    }
    values
        .last()
        .cloned()
        .flatten()
        .ok_or_else(|| "empty plan".into())
}

/// Resolves a step's arguments against the values produced so far (some may be missing).
pub(crate) fn resolve_present(step: &Step, values: &[Option<Value>]) -> Result<Vec<Value>, String> {
    step.args
        .iter()
        .zip(step.group.params())
        .map(|(a, p)| match a {
            Arg::Lit(v) => Ok(v.clone()),
            Arg::Ref(i) => values
                .get(*i)
                .cloned()
                .flatten()
                .ok_or_else(|| format!("missing input `{p}`: no step produced it")),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_task_has_an_oracle_and_3_to_6_steps() {
        let ts = tasks();
        assert_eq!(ts.len(), 100);
        for t in &ts {
            assert!((3..=6).contains(&t.steps.len()), "task {}", t.id);
            assert!(!t.oracle.is_null(), "task {} has no oracle", t.id);
        }
        // The catalogue is fixed: building it twice gives the same tasks.
        assert_eq!(ts, tasks());
    }

    #[test]
    fn extract_reports_missing_fields() {
        assert!(extract(Group::Weather, &json!({"temp": 1})).is_err());
        assert!(extract(Group::Search, &json!({"results": []})).is_err());
        assert_eq!(
            extract(Group::Search, &json!({"results": ["doc-1"]})),
            Ok(json!("doc-1"))
        );
    }
}
