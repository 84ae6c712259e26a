//! Tasks as data: tools with JSON Schemas, a plan of calls whose arguments reference earlier
//! outputs, and the expected answer.
//!
//! Why a second task type next to [`crate::catalogue`]: the catalogue is one hand-built world of
//! ten tool groups, and a benchmark whose tasks are all written by the author of the winner says
//! little. [`TaskSpec`] is what every strategy runs on; the built-in catalogue converts to it
//! ([`builtin`]) and so do JSONL files ([`load_jsonl`], format in `docs/bench/tasks.md`), among
//! them the NESTFUL executable set (`scripts/import-nestful.py`).
//!
//! A [`TaskSpec`] holds the expected answer; strategies never see a `TaskSpec`, only its
//! [`Plan`] through [`crate::exec::Episode::plan`].

use std::collections::BTreeMap;

use serde_json::{Map, Value, json};

use crate::catalogue::{self, Arg, Group};

/// The JSON type of a parameter or output field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldType {
    /// A string.
    String,
    /// A number.
    Number,
    /// An integer.
    Integer,
    /// `true` or `false`.
    Boolean,
    /// An array.
    Array,
    /// An object.
    Object,
}

impl FieldType {
    fn parse(s: &str) -> Option<FieldType> {
        match s {
            "string" => Some(FieldType::String),
            "number" => Some(FieldType::Number),
            "integer" => Some(FieldType::Integer),
            "boolean" => Some(FieldType::Boolean),
            "array" => Some(FieldType::Array),
            "object" => Some(FieldType::Object),
            _ => None,
        }
    }

    /// The JSON Schema name.
    pub fn as_str(self) -> &'static str {
        match self {
            FieldType::String => "string",
            FieldType::Number => "number",
            FieldType::Integer => "integer",
            FieldType::Boolean => "boolean",
            FieldType::Array => "array",
            FieldType::Object => "object",
        }
    }

    /// Whether a value has this type.
    pub fn accepts(self, v: &Value) -> bool {
        match self {
            FieldType::String => v.is_string(),
            FieldType::Number => v.is_number(),
            FieldType::Integer => v.is_i64() || v.is_u64(),
            FieldType::Boolean => v.is_boolean(),
            FieldType::Array => v.is_array(),
            FieldType::Object => v.is_object(),
        }
    }
}

/// One parameter of a tool.
#[derive(Debug, Clone, PartialEq)]
pub struct Param {
    /// Its name.
    pub name: String,
    /// Its type.
    pub ty: FieldType,
    /// Whether the schema requires it.
    pub required: bool,
}

/// How far an equivalent source's numbers sit from the primary's (see `docs/bench/faults.md`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Noise {
    /// Relative spread: the substitute reads `x·(1 + u·rel) + u'·abs`, `u, u'` in [-1, 1].
    pub rel: f64,
    /// Absolute spread.
    pub abs: f64,
    /// Share of queries on which the two sources disagree by `outlier` times the spread.
    pub outlier_share: f64,
    /// How many spreads an outlier is off.
    pub outlier: f64,
}

impl Noise {
    /// Two sources that always agree exactly.
    pub const EXACT: Noise = Noise {
        rel: 0.0,
        abs: 0.0,
        outlier_share: 0.0,
        outlier: 0.0,
    };
}

/// How close two numbers must be for the cross-check verifier to accept them:
/// `|a − b| ≤ rel·max(|a|, |b|) + abs`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tolerance {
    /// Relative part.
    pub rel: f64,
    /// Absolute part.
    pub abs: f64,
}

impl Tolerance {
    /// Whether `a` and `b` agree within the tolerance (strings and other values: exactly): the
    /// core's reading of one field ([`selfheal_core::Tolerance::agrees`]), which the gateway
    /// applies too.
    pub fn agrees(&self, a: &Value, b: &Value) -> bool {
        selfheal_core::Tolerance::from(*self).agrees(a, b)
    }
}

impl From<Tolerance> for selfheal_core::Tolerance {
    /// The same band, as the core's verifiers read it.
    fn from(t: Tolerance) -> Self {
        selfheal_core::Tolerance {
            rel: t.rel,
            abs: t.abs,
        }
    }
}

/// The tolerance the *scorer* applies to final answers: 2 % relative plus 0.05 absolute.
/// Equivalent sources differ by noise (see [`Noise`]); an answer within this band of the
/// expected one is correct, anything further is wrong.
pub const ANSWER_TOLERANCE: Tolerance = Tolerance {
    rel: 0.02,
    abs: 0.05,
};

/// How the simulated world computes a tool's output.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Behaviour {
    /// A tool of the built-in catalogue.
    Builtin(Group),
    /// The sibling of a built-in group's tool: same arguments, a value of the wrong kind
    /// ([`crate::catalogue::sibling_truth`]).
    Sibling(Group),
    /// Synthesised deterministically from the output spec and the arguments.
    Synth,
    /// Real semantics over the arguments (a file's `"semantics"`, or the built-in comparison).
    Semantic(Op),
}

/// What a tool with real semantics computes, into its first output field: arithmetic and
/// comparisons over its numeric parameters in declaration order (numeric strings read as
/// numbers), or a lookup of its first parameter in a seeded table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// `a + b`.
    Add,
    /// `a − b`.
    Subtract,
    /// `a · b`.
    Multiply,
    /// `a / b` (`b = 0` is refused).
    Divide,
    /// `a > b`.
    Greater,
    /// `a < b`.
    Less,
    /// The larger.
    Max,
    /// The smaller.
    Min,
    /// The first argument's entry in a table seeded by the tool's name: the same key, the same
    /// value, whatever the other arguments.
    Lookup,
}

impl Op {
    fn parse(s: &str) -> Option<Op> {
        Some(match s {
            "add" => Op::Add,
            "subtract" => Op::Subtract,
            "multiply" => Op::Multiply,
            "divide" => Op::Divide,
            "greater" => Op::Greater,
            "less" => Op::Less,
            "max" => Op::Max,
            "min" => Op::Min,
            "lookup" => Op::Lookup,
            _ => return None,
        })
    }
}

/// A tool as the agent knows it (name, description, schema) plus the simulation facts.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolSpec {
    /// The tool's name.
    pub name: String,
    /// What it does.
    pub description: String,
    /// Its parameters.
    pub params: Vec<Param>,
    /// The output fields, as paths (`a`, `a.b`, `a[0].b`) with their types.
    pub output: Vec<(String, FieldType)>,
    /// Whether it reads external data (and so can be faulted on the tool side).
    pub external: bool,
    /// Whether its output carries an `as_of` timestamp.
    pub freshness: bool,
    /// The name of an equivalent tool, if there is one.
    pub substitute: Option<String>,
    /// A real tool of the wrong kind that takes the same arguments (for wrong-tool faults).
    pub sibling: Option<String>,
    /// How far the substitute's numbers sit from this tool's.
    pub noise: Noise,
    /// The cross-check verifier's tolerance for this tool.
    pub tolerance: Tolerance,
    /// How the world computes the output.
    pub behaviour: Behaviour,
}

impl ToolSpec {
    /// The input JSON Schema.
    pub fn schema(&self) -> Value {
        let props: Map<String, Value> = self
            .params
            .iter()
            .map(|p| (p.name.clone(), json!({"type": p.ty.as_str()})))
            .collect();
        let required: Vec<&str> = self
            .params
            .iter()
            .filter(|p| p.required)
            .map(|p| p.name.as_str())
            .collect();
        json!({"type": "object", "properties": props, "required": required})
    }

    /// The names of the required parameters.
    pub fn required(&self) -> Vec<String> {
        self.params
            .iter()
            .filter(|p| p.required)
            .map(|p| p.name.clone())
            .collect()
    }
}

/// Where an argument's value comes from.
#[derive(Debug, Clone, PartialEq)]
pub enum ArgSrc {
    /// A literal.
    Lit(Value),
    /// A path into an earlier step's output (`""`: the whole output).
    Ref {
        /// The step.
        step: usize,
        /// The path (`a.b[0].c`).
        path: String,
    },
    /// A string with embedded references, rendered as text (`"5 * $var1.rate$"`).
    Template(Vec<Piece>),
}

/// A piece of a [`ArgSrc::Template`].
#[derive(Debug, Clone, PartialEq)]
pub enum Piece {
    /// Literal text.
    Text(String),
    /// A reference, rendered as its JSON text (strings without quotes).
    Ref {
        /// The step.
        step: usize,
        /// The path.
        path: String,
    },
}

/// One call of a plan.
#[derive(Debug, Clone, PartialEq)]
pub struct PlanStep {
    /// The tool the plan calls.
    pub tool: String,
    /// Arguments by name.
    pub args: Vec<(String, ArgSrc)>,
}

/// What the task's answer is made of.
#[derive(Debug, Clone, PartialEq)]
pub enum AnswerSpec {
    /// One value.
    One(ArgSrc),
    /// An object of values (NESTFUL's `var_result`).
    Object(Vec<(String, ArgSrc)>),
}

/// A plan: what a client may know about a task.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// The user's message(s): the request as the user wrote it. With the tools' results, this
    /// is all a client knows of the task's values (the grounding check's evidence).
    pub prompt: Vec<String>,
    /// The tools on offer.
    pub tools: Vec<ToolSpec>,
    /// The calls, in order.
    pub steps: Vec<PlanStep>,
    /// How the answer is assembled from the outputs.
    pub answer: AnswerSpec,
}

impl Plan {
    /// The spec of a tool on offer by name (primaries only).
    pub fn tool(&self, name: &str) -> Option<&ToolSpec> {
        self.tools.iter().find(|t| t.name == name)
    }

    /// The spec of the tool step `s` calls.
    pub fn step_tool(&self, s: usize) -> Option<&ToolSpec> {
        self.steps.get(s).and_then(|st| self.tool(&st.tool))
    }

    /// The user's messages as evidence values (what a client holds before any tool ran).
    pub fn prompt_evidence(&self) -> Vec<Value> {
        self.prompt.iter().cloned().map(Value::String).collect()
    }

    /// Every literal argument of the plan's calls, and the literal text of its templates, by
    /// argument name: the plan's values. The benchmark's client never reads them (its grounding
    /// evidence is [`Plan::prompt`]); a task file without a `prompt` or `query` states them as
    /// its message, and the gateway arm's agent writes them into its prompt.
    pub fn inputs(&self) -> Vec<(String, Value)> {
        let mut out: Vec<(String, Value)> = Vec::new();
        for st in &self.steps {
            for (name, src) in &st.args {
                let found = match src {
                    ArgSrc::Lit(v) => vec![v.clone()],
                    ArgSrc::Ref { .. } => Vec::new(),
                    ArgSrc::Template(pieces) => pieces
                        .iter()
                        .filter_map(|p| match p {
                            Piece::Text(t) if !t.trim().is_empty() => {
                                Some(Value::String(t.clone()))
                            }
                            Piece::Text(_) | Piece::Ref { .. } => None,
                        })
                        .collect(),
                };
                for v in found {
                    if !out.iter().any(|(n, x)| n == name && *x == v) {
                        out.push((name.clone(), v));
                    }
                }
            }
        }
        out
    }

    /// The paths of step `s`'s output that later steps or the answer read.
    pub fn read_paths(&self, s: usize) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        let mut see = |src: &ArgSrc| {
            let mut push = |step: usize, path: &str| {
                if step == s && !out.iter().any(|p| p == path) {
                    out.push(path.to_owned());
                }
            };
            match src {
                ArgSrc::Lit(_) => {}
                ArgSrc::Ref { step, path } => push(*step, path),
                ArgSrc::Template(pieces) => {
                    for p in pieces {
                        if let Piece::Ref { step, path } = p {
                            push(*step, path);
                        }
                    }
                }
            }
        };
        for st in &self.steps {
            for (_, a) in &st.args {
                see(a);
            }
        }
        match &self.answer {
            AnswerSpec::One(a) => see(a),
            AnswerSpec::Object(xs) => {
                for (_, a) in xs {
                    see(a);
                }
            }
        }
        out
    }
}

/// A task: a plan and its expected answer.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskSpec {
    /// 0-based index in its set.
    pub id: usize,
    /// A name (the template or the file's id).
    pub name: String,
    /// The plan.
    pub plan: Plan,
    /// The expected answer (scoring only; never shown to a strategy).
    pub expected: Value,
    /// The values the prompt names (inputs and other entities): where the simulated model
    /// draws a wrong value from the context, besides earlier results. Never shown to a strategy.
    pub mentions: Vec<Value>,
}

/// The parts of `path` (`a.b[0].c`): each a field name (empty for a bare index) and an optional
/// index. `""` has none: it is the whole value.
pub(crate) fn path_parts(path: &str) -> impl Iterator<Item = (&str, Option<usize>)> {
    path.split('.')
        .filter(|_| !path.is_empty())
        .map(|part| match part.split_once('[') {
            Some((n, rest)) => (n, rest.trim_end_matches(']').parse::<usize>().ok()),
            None => (part, None),
        })
}

/// Reads `path` (`a.b[0].c`; `""` is the whole value) in `v`.
pub fn get_path<'v>(v: &'v Value, path: &str) -> Option<&'v Value> {
    let mut cur = v;
    for (name, idx) in path_parts(path) {
        if !name.is_empty() {
            cur = cur.get(name)?;
        }
        if let Some(i) = idx {
            cur = cur.get(i)?;
        }
    }
    Some(cur)
}

/// Why a reference could not be resolved.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResolveError {
    /// The step it reads has not produced a value.
    #[error("missing input `{arg}`: step {step} produced nothing")]
    Missing {
        /// The argument.
        arg: String,
        /// The step read.
        step: usize,
    },
    /// The path is not in the step's output.
    #[error("KeyError: `{path}` not in the output of step {step}")]
    NoPath {
        /// The step read.
        step: usize,
        /// The path.
        path: String,
    },
}

/// Resolves one argument source against the outputs produced so far.
pub(crate) fn resolve_src(
    arg: &str,
    src: &ArgSrc,
    outputs: &[Option<Value>],
) -> Result<Value, ResolveError> {
    let read =
        |step: usize, path: &str| -> Result<Value, ResolveError> {
            let out = outputs.get(step).and_then(Option::as_ref).ok_or_else(|| {
                ResolveError::Missing {
                    arg: arg.to_owned(),
                    step,
                }
            })?;
            get_path(out, path)
                .filter(|v| !v.is_null())
                .cloned()
                .ok_or_else(|| ResolveError::NoPath {
                    step,
                    path: path.to_owned(),
                })
        };
    match src {
        ArgSrc::Lit(v) => Ok(v.clone()),
        ArgSrc::Ref { step, path } => read(*step, path),
        ArgSrc::Template(pieces) => {
            let mut s = String::new();
            for p in pieces {
                match p {
                    Piece::Text(t) => s.push_str(t),
                    Piece::Ref { step, path } => match read(*step, path)? {
                        Value::String(x) => s.push_str(&x),
                        other => s.push_str(&other.to_string()),
                    },
                }
            }
            Ok(Value::String(s))
        }
    }
}

/// Resolves step `s`'s arguments into a JSON object.
pub fn resolve_args(
    plan: &Plan,
    s: usize,
    outputs: &[Option<Value>],
) -> Result<Value, ResolveError> {
    let mut obj = Map::new();
    if let Some(st) = plan.steps.get(s) {
        for (name, src) in &st.args {
            obj.insert(name.clone(), resolve_src(name, src, outputs)?);
        }
    }
    Ok(Value::Object(obj))
}

/// Assembles the answer from the outputs.
pub fn resolve_answer(plan: &Plan, outputs: &[Option<Value>]) -> Result<Value, ResolveError> {
    match &plan.answer {
        AnswerSpec::One(src) => resolve_src("answer", src, outputs),
        AnswerSpec::Object(xs) => {
            let mut obj = Map::new();
            for (k, src) in xs {
                obj.insert(k.clone(), resolve_src(k, src, outputs)?);
            }
            Ok(Value::Object(obj))
        }
    }
}

fn noise_of(group: Group) -> (Noise, Tolerance) {
    // Documented in docs/bench/faults.md ("Equivalent sources").
    let exact = Tolerance { rel: 0.0, abs: 0.0 };
    match group {
        // Lookups of facts: two atlases agree exactly.
        Group::Capital | Group::Currency | Group::Ticker | Group::Search | Group::Fetch => {
            (Noise::EXACT, exact)
        }
        // Two weather stations: ±0.3 °C, and one city in 25 reads a degree and a half apart.
        Group::Weather => (
            Noise {
                rel: 0.0,
                abs: 0.3,
                outlier_share: 0.04,
                outlier: 5.0,
            },
            Tolerance { rel: 0.0, abs: 0.8 },
        ),
        // Two FX feeds: ±0.2 %, one pair in 30 a full percent apart.
        Group::Fx => (
            Noise {
                rel: 0.002,
                abs: 0.0,
                outlier_share: 0.033,
                outlier: 5.0,
            },
            Tolerance {
                rel: 0.006,
                abs: 0.0,
            },
        ),
        // Two quote vendors: ±0.25 %, one ticker in 30 further apart (a late print).
        Group::Price => (
            Noise {
                rel: 0.0025,
                abs: 0.0,
                outlier_share: 0.033,
                outlier: 4.0,
            },
            Tolerance {
                rel: 0.007,
                abs: 0.0,
            },
        ),
        Group::Convert | Group::Multiply => (Noise::EXACT, exact),
    }
}

/// The spec of a built-in group's primary tool.
pub(crate) fn builtin_tool(group: Group) -> ToolSpec {
    let (noise, tolerance) = noise_of(group);
    let field_ty = match group {
        Group::Capital | Group::Currency | Group::Ticker => FieldType::String,
        Group::Search => FieldType::Array,
        Group::Weather
        | Group::Fx
        | Group::Price
        | Group::Fetch
        | Group::Convert
        | Group::Multiply => FieldType::Number,
    };
    ToolSpec {
        name: group.primary().to_owned(),
        description: group.primary().to_owned(),
        params: group
            .params()
            .iter()
            .map(|p| Param {
                name: (*p).to_owned(),
                ty: match (group, *p) {
                    (Group::Convert, "value") | (Group::Multiply, _) => FieldType::Number,
                    _ => FieldType::String,
                },
                required: true,
            })
            .collect(),
        output: vec![(group.field().to_owned(), field_ty)],
        external: group.is_external(),
        freshness: group.has_freshness(),
        substitute: group.substitute().map(str::to_owned),
        sibling: Some(sibling(group).to_owned()),
        noise,
        tolerance,
        behaviour: Behaviour::Builtin(group),
    }
}

/// The spec of a built-in group's sibling: a real tool with the primary's arguments and output
/// field that answers with a value of the wrong kind (the largest city, yesterday's rate, a
/// rounded product). No substitute, no sibling of its own.
pub(crate) fn builtin_sibling(group: Group) -> ToolSpec {
    let primary = builtin_tool(group);
    ToolSpec {
        name: sibling(group).to_owned(),
        description: sibling(group).to_owned(),
        substitute: None,
        sibling: None,
        noise: Noise::EXACT,
        behaviour: Behaviour::Sibling(group),
        ..primary
    }
}

/// The built-in comparison: whether `a` is greater than `b` (real semantics, local).
pub(crate) fn compare_tool() -> ToolSpec {
    ToolSpec {
        name: "calc.compare".into(),
        description: "Whether a is greater than b.".into(),
        params: ["a", "b"]
            .iter()
            .map(|p| Param {
                name: (*p).to_owned(),
                ty: FieldType::Number,
                required: true,
            })
            .collect(),
        output: vec![("greater".into(), FieldType::Boolean)],
        external: false,
        freshness: false,
        substitute: None,
        sibling: None,
        noise: Noise::EXACT,
        tolerance: Tolerance { rel: 0.0, abs: 0.0 },
        behaviour: Behaviour::Semantic(Op::Greater),
    }
}

/// The `j`-th built-in comparison task: is one company's share price above another's? A DAG —
/// two chains (ticker → quote) joined by the comparison — whose answer is a real comparison.
fn compare_task(id: usize, j: usize) -> TaskSpec {
    let names = catalogue::COMPANIES;
    let a = names[(j * 5) % names.len()];
    let b = names[(j * 5 + 1 + j % 7) % names.len()];
    let mut tools = vec![
        builtin_tool(Group::Ticker),
        builtin_sibling(Group::Ticker),
        builtin_tool(Group::Price),
        builtin_sibling(Group::Price),
        compare_tool(),
    ];
    let unused = [Group::Fx, Group::Convert, Group::Capital, Group::Fetch];
    tools.push(builtin_tool(unused[j % unused.len()]));
    let lit = |s: &str| ArgSrc::Lit(Value::String(s.to_owned()));
    let at = |step: usize, path: &str| ArgSrc::Ref {
        step,
        path: path.to_owned(),
    };
    let step = |tool: &str, args: Vec<(&str, ArgSrc)>| PlanStep {
        tool: tool.to_owned(),
        args: args.into_iter().map(|(k, v)| (k.to_owned(), v)).collect(),
    };
    let steps = vec![
        step("company.ticker", vec![("company", lit(a))]),
        step("stock.quote", vec![("ticker", at(0, "ticker"))]),
        step("company.ticker", vec![("company", lit(b))]),
        step("stock.quote", vec![("ticker", at(2, "ticker"))]),
        step(
            "calc.compare",
            vec![("a", at(1, "price")), ("b", at(3, "price"))],
        ),
    ];
    let plan = Plan {
        prompt: vec![format!(
            "Is {a}'s share price higher than {b}'s right now? Answer yes or no."
        )],
        tools,
        steps,
        answer: AnswerSpec::One(at(4, "greater")),
    };
    let expected = crate::exec::clean_answer(&plan).unwrap_or(Value::Null);
    TaskSpec {
        id,
        name: "compare-share-prices".into(),
        plan,
        expected,
        mentions: vec![json!(a), json!(b)],
    }
}

/// The built-in tasks: every sixth (index 5, 11, …) a comparison of two share prices
/// ([`compare_task`], a DAG with fan-in), the others the catalogue's tasks in order. Each offers
/// more tools than its plan uses: every step's tool, that tool's sibling, and tools of groups
/// the plan does not use.
pub fn builtin(n: usize) -> Vec<TaskSpec> {
    let catalogue = catalogue_tasks(n);
    let mut cat = catalogue.into_iter();
    (0..n)
        .map_while(|i| {
            if i % 6 == 5 {
                Some(compare_task(i, i / 6))
            } else {
                cat.next().map(|mut t| {
                    t.id = i;
                    t
                })
            }
        })
        .collect()
}

/// The catalogue's tasks as [`TaskSpec`]s (at most `n`).
fn catalogue_tasks(n: usize) -> Vec<TaskSpec> {
    catalogue::tasks()
        .into_iter()
        .take(n)
        .map(|t| {
            let mut tools: Vec<ToolSpec> = Vec::new();
            for s in &t.steps {
                if !tools.iter().any(|x| x.name == s.group.primary()) {
                    tools.push(builtin_tool(s.group));
                    tools.push(builtin_sibling(s.group));
                }
            }
            let unused: Vec<Group> = Group::ALL
                .into_iter()
                .filter(|g| !t.steps.iter().any(|s| s.group == *g))
                .collect();
            for k in 0..2.min(unused.len()) {
                let g = unused[(t.id + 3 * k) % unused.len()];
                if !tools.iter().any(|x| x.name == g.primary()) {
                    tools.push(builtin_tool(g));
                }
            }
            let steps: Vec<PlanStep> = t
                .steps
                .iter()
                .map(|s| PlanStep {
                    tool: s.group.primary().to_owned(),
                    args: s
                        .group
                        .params()
                        .iter()
                        .zip(&s.args)
                        .map(|(p, a)| {
                            let src = match a {
                                Arg::Lit(v) => ArgSrc::Lit(v.clone()),
                                Arg::Ref(i) => ArgSrc::Ref {
                                    step: *i,
                                    path: builtin_path(t.steps[*i].group),
                                },
                            };
                            ((*p).to_owned(), src)
                        })
                        .collect(),
                })
                .collect();
            let last = t.steps.len().saturating_sub(1);
            let answer = AnswerSpec::One(ArgSrc::Ref {
                step: last,
                path: t
                    .steps
                    .last()
                    .map(|s| builtin_path(s.group))
                    .unwrap_or_default(),
            });
            TaskSpec {
                id: t.id,
                name: t.template.to_owned(),
                plan: Plan {
                    prompt: vec![t.prompt],
                    tools,
                    steps,
                    answer,
                },
                expected: t.oracle,
                mentions: t.mentions,
            }
        })
        .collect()
}

fn builtin_path(group: Group) -> String {
    match group {
        Group::Search => format!("{}[0]", group.field()),
        _ => group.field().to_owned(),
    }
}

/// Why a tasks file was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {message}")]
pub struct TaskFileError {
    /// 1-based line.
    pub line: usize,
    /// What is wrong.
    pub message: String,
}

fn parse_src(v: &Value, labels: &BTreeMap<String, usize>, here: usize) -> Result<ArgSrc, String> {
    let Value::String(s) = v else {
        return Ok(ArgSrc::Lit(v.clone()));
    };
    if !s.contains('$') {
        return Ok(ArgSrc::Lit(v.clone()));
    }
    let reference = |inner: &str| -> Result<(usize, String), String> {
        let (label, path) = match inner.split_once('.') {
            Some((l, p)) => (l, p.to_owned()),
            None => match inner.split_once('[') {
                Some((l, rest)) => (l, format!("[{rest}")),
                None => (inner, String::new()),
            },
        };
        let step = *labels
            .get(label)
            .ok_or_else(|| format!("reference to unknown label `{label}` in {s:?}"))?;
        if step >= here {
            return Err(format!("`{label}` is referenced before it runs in {s:?}"));
        }
        Ok((step, path))
    };
    // The whole string is one reference: keep the value's type.
    if s.len() >= 2
        && s.starts_with('$')
        && s.ends_with('$')
        && s[1..s.len() - 1].find('$').is_none()
    {
        let (step, path) = reference(&s[1..s.len() - 1])?;
        return Ok(ArgSrc::Ref { step, path });
    }
    let mut pieces = Vec::new();
    let mut rest = s.as_str();
    while let Some(a) = rest.find('$') {
        let after = &rest[a + 1..];
        let Some(b) = after.find('$') else {
            return Err(format!("unclosed `$` reference in {s:?}"));
        };
        if a > 0 {
            pieces.push(Piece::Text(rest[..a].to_owned()));
        }
        let (step, path) = reference(&after[..b])?;
        pieces.push(Piece::Ref { step, path });
        rest = &after[b + 1..];
    }
    if !rest.is_empty() {
        pieces.push(Piece::Text(rest.to_owned()));
    }
    Ok(ArgSrc::Template(pieces))
}

fn f64_field(v: &Value, key: &str, default: f64) -> Result<f64, String> {
    match v.get(key) {
        None => Ok(default),
        Some(x) => x
            .as_f64()
            .filter(|x| x.is_finite() && *x >= 0.0)
            .ok_or_else(|| format!("`{key}` must be a number ≥ 0")),
    }
}

fn parse_tool(v: &Value) -> Result<ToolSpec, String> {
    let name = v
        .get("name")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .ok_or("a tool needs a non-empty `name`")?
        .to_owned();
    let schema = v.get("parameters").cloned().unwrap_or(json!({}));
    let required: Vec<&str> = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let mut params = Vec::new();
    if let Some(props) = schema.get("properties").and_then(Value::as_object) {
        for (p, ps) in props {
            let ty = ps
                .get("type")
                .and_then(Value::as_str)
                .map_or(Some(FieldType::String), FieldType::parse)
                .ok_or_else(|| format!("tool `{name}`: parameter `{p}` has an unknown type"))?;
            params.push(Param {
                name: p.clone(),
                ty,
                required: required.contains(&p.as_str()),
            });
        }
    }
    let mut output = Vec::new();
    if let Some(o) = v.get("output").and_then(Value::as_object) {
        for (path, ty) in o {
            let ty = ty
                .as_str()
                .and_then(FieldType::parse)
                .ok_or_else(|| format!("tool `{name}`: output `{path}` has an unknown type"))?;
            output.push((path.clone(), ty));
        }
    }
    let noise = match v.get("noise") {
        None => Noise::EXACT,
        Some(n) => Noise {
            rel: f64_field(n, "rel", 0.0)?,
            abs: f64_field(n, "abs", 0.0)?,
            outlier_share: f64_field(n, "outlier_share", 0.0)?,
            outlier: f64_field(n, "outlier", 0.0)?,
        },
    };
    let tolerance = match v.get("tolerance") {
        None => Tolerance { rel: 0.0, abs: 0.0 },
        Some(t) => Tolerance {
            rel: f64_field(t, "rel", 0.0)?,
            abs: f64_field(t, "abs", 0.0)?,
        },
    };
    let external = v.get("external").and_then(Value::as_bool).unwrap_or(true);
    Ok(ToolSpec {
        description: v
            .get("description")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned(),
        params,
        output,
        external,
        freshness: v.get("freshness").and_then(Value::as_bool).unwrap_or(false),
        substitute: v
            .get("substitute")
            .and_then(Value::as_str)
            .map(str::to_owned),
        sibling: v.get("sibling").and_then(Value::as_str).map(str::to_owned),
        noise,
        tolerance,
        behaviour: match v.get("semantics") {
            None => Behaviour::Synth,
            Some(x) => Behaviour::Semantic(x.as_str().and_then(Op::parse).ok_or_else(|| {
                format!(
                    "tool `{name}`: `semantics` must be one of add, subtract, multiply, divide, \
                     greater, less, max, min, lookup"
                )
            })?),
        },
        name,
    })
}

fn parse_task(id: usize, v: &Value) -> Result<TaskSpec, String> {
    let name = match v.get("id") {
        Some(Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
        None => format!("task-{id}"),
    };
    let tools: Vec<ToolSpec> = v
        .get("tools")
        .and_then(Value::as_array)
        .ok_or("`tools` must be an array")?
        .iter()
        .map(parse_tool)
        .collect::<Result<_, _>>()?;
    let raw_plan = v
        .get("plan")
        .and_then(Value::as_array)
        .filter(|a| !a.is_empty())
        .ok_or("`plan` must be a non-empty array")?;
    let mut labels = BTreeMap::new();
    let mut steps = Vec::new();
    for (i, c) in raw_plan.iter().enumerate() {
        let tool = c
            .get("tool")
            .and_then(Value::as_str)
            .ok_or_else(|| format!("plan step {i} has no `tool`"))?;
        if !tools.iter().any(|t| t.name == tool) {
            return Err(format!(
                "plan step {i} calls `{tool}`, which is not in `tools`"
            ));
        }
        let mut args = Vec::new();
        if let Some(a) = c.get("args").and_then(Value::as_object) {
            for (k, x) in a {
                args.push((k.clone(), parse_src(x, &labels, i)?));
            }
        }
        steps.push(PlanStep {
            tool: tool.to_owned(),
            args,
        });
        if let Some(l) = c.get("label").and_then(Value::as_str) {
            labels.insert(l.to_owned(), i);
        }
    }
    let n = steps.len();
    let answer = match v.get("answer") {
        None => {
            let path = tools
                .iter()
                .find(|t| Some(&t.name) == steps.last().map(|s| &s.tool))
                .and_then(|t| t.output.first())
                .map(|(p, _)| p.clone())
                .unwrap_or_default();
            AnswerSpec::One(ArgSrc::Ref { step: n - 1, path })
        }
        Some(Value::Object(o)) => AnswerSpec::Object(
            o.iter()
                .map(|(k, x)| Ok((k.clone(), parse_src(x, &labels, n)?)))
                .collect::<Result<_, String>>()?,
        ),
        Some(x) => AnswerSpec::One(parse_src(x, &labels, n)?),
    };
    let mut plan = Plan {
        prompt: Vec::new(),
        tools,
        steps,
        answer,
    };
    let literals: Vec<Value> = plan.inputs().into_iter().map(|(_, x)| x).collect();
    // The user's message(s): `prompt` (a string or an array of strings) as written; else the
    // `query` (NESTFUL's), followed, when the plan takes values the query does not spell as
    // they are sent (a date written out, a code), by a message stating them; else a message
    // stating the task's inputs. See `docs/bench/tasks.md`.
    plan.prompt = match (v.get("prompt"), v.get("query").and_then(Value::as_str)) {
        (Some(Value::String(p)), _) => vec![p.clone()],
        (Some(Value::Array(ps)), _) => ps
            .iter()
            .map(|p| {
                p.as_str()
                    .map(str::to_owned)
                    .ok_or("`prompt` must be a string or an array of strings")
            })
            .collect::<Result<_, _>>()?,
        (Some(_), _) => return Err("`prompt` must be a string or an array of strings".into()),
        (None, Some(q)) => {
            let said = vec![Value::String(q.to_owned())];
            let unsaid: Vec<String> = literals
                .iter()
                .filter(|x| {
                    !selfheal_core::ungrounded_arguments(&json!({ "x": x }), &said).is_empty()
                })
                .map(plain)
                .collect();
            if unsaid.is_empty() {
                vec![q.to_owned()]
            } else {
                vec![
                    q.to_owned(),
                    format!("Use these values: {}.", unsaid.join(", ")),
                ]
            }
        }
        (None, None) => {
            let stated: Vec<String> = plan
                .inputs()
                .iter()
                .map(|(n, x)| format!("{n} = {}", plain(x)))
                .collect();
            vec![format!("Task {name}. Inputs: {}.", stated.join(", "))]
        }
    };
    let mut mentions = literals;
    if let Some(Value::Array(xs)) = v.get("mentions") {
        mentions.extend(xs.iter().cloned());
    }
    Ok(TaskSpec {
        id,
        name,
        plan,
        // Filled by the world's clean run unless the file gives it.
        expected: v.get("expected").cloned().unwrap_or(Value::Null),
        mentions,
    })
}

/// A value as a user writes it: a string without quotes, anything else as JSON.
fn plain(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Reads a JSONL tasks file (format in `docs/bench/tasks.md`). Tasks without `expected` get the
/// answer of a fault-free run of the simulated world; tasks whose clean run fails are refused.
pub fn load_jsonl(text: &str) -> Result<Vec<TaskSpec>, TaskFileError> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line_no = i + 1;
        let t = line.trim();
        if t.is_empty() || t.starts_with("//") {
            continue;
        }
        let err = |message: String| TaskFileError {
            line: line_no,
            message,
        };
        let v: Value = serde_json::from_str(t).map_err(|e| err(format!("not JSON: {e}")))?;
        let mut task = parse_task(out.len(), &v).map_err(err)?;
        let clean = crate::exec::clean_answer(&task.plan)
            .map_err(|e| err(format!("the plan fails without faults: {e}")))?;
        if task.expected.is_null() {
            task.expected = clean;
        } else if !ANSWER_TOLERANCE.agrees(&task.expected, &clean) {
            return Err(err(format!(
                "`expected` {} differs from the simulated world's answer {clean}",
                task.expected
            )));
        }
        out.push(task);
    }
    if out.is_empty() {
        return Err(TaskFileError {
            line: 0,
            message: "the file holds no task".into(),
        });
    }
    add_distractors(&mut out);
    Ok(out)
}

/// Every file task offers more tools than its plan uses: for each tool a step calls, its
/// sibling (the file's `sibling` name, else `<name>_legacy`): the same parameters and output
/// fields, synthesised under its own name, so its values are of the wrong kind; and two tools
/// the task does not offer that the next tasks in the file call (the catalogue's other tools).
/// The plan and its answer are unchanged.
fn add_distractors(tasks: &mut [TaskSpec]) {
    let n = tasks.len();
    // For task `i`: the first two tools, in file order from the next task on (wrapping round),
    // that some step of another task calls and task `i` does not offer. (Taking only the next
    // two tasks' first tools left 52 of NESTFUL's 85 tasks with none: neighbouring tasks call
    // the same API.)
    let foreign: Vec<Vec<ToolSpec>> = (0..n)
        .map(|i| {
            let own = &tasks[i].plan;
            let mut picked: Vec<ToolSpec> = Vec::new();
            for k in 1..n {
                let other = &tasks[(i + k) % n].plan;
                for s in 0..other.steps.len() {
                    let Some(t) = other.step_tool(s) else {
                        continue;
                    };
                    let taken = own.tool(&t.name).is_some()
                        || own.tools.iter().any(|x| {
                            x.substitute.as_deref() == Some(t.name.as_str())
                                || x.sibling.as_deref() == Some(t.name.as_str())
                        })
                        || picked.iter().any(|x| x.name == t.name);
                    if !taken && picked.len() < 2 {
                        picked.push(t.clone());
                    }
                }
                if picked.len() == 2 {
                    break;
                }
            }
            picked
        })
        .collect();
    for (task, foreign) in tasks.iter_mut().zip(foreign) {
        let plan = &mut task.plan;
        let used: Vec<String> = plan.steps.iter().map(|s| s.tool.clone()).collect();
        let mut extra: Vec<ToolSpec> = Vec::new();
        for t in plan.tools.iter_mut().filter(|t| used.contains(&t.name)) {
            let name = t
                .sibling
                .get_or_insert_with(|| format!("{}_legacy", t.name))
                .clone();
            extra.push(ToolSpec {
                name: name.clone(),
                description: format!("{name}: {}", t.description),
                substitute: None,
                sibling: None,
                noise: Noise::EXACT,
                ..t.clone()
            });
        }
        for t in extra.into_iter().chain(foreign) {
            let clash = plan
                .tools
                .iter()
                .any(|x| x.name == t.name || x.substitute.as_deref() == Some(t.name.as_str()));
            if !clash {
                plan.tools.push(t);
            }
        }
    }
}

/// A real tool of the wrong kind that accepts the same arguments (the implicit wrong tool).
pub(crate) fn sibling(group: Group) -> &'static str {
    match group {
        Group::Capital => "geo.largest_city",
        Group::Currency => "geo.old_currency",
        Group::Weather => "weather.forecast",
        Group::Fx => "fx.rate_yesterday",
        Group::Ticker => "company.parent_ticker",
        Group::Price => "stock.open_price",
        Group::Search => "search.news",
        Group::Fetch => "docs.summary",
        Group::Convert => "calc.convert_approx",
        Group::Multiply => "calc.multiply_rounded",
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn builtin_tasks_keep_their_expected_answers() {
        let ts = builtin(100);
        assert_eq!(ts.len(), 100);
        for t in &ts {
            let clean = crate::exec::clean_answer(&t.plan).unwrap();
            assert!(
                ANSWER_TOLERANCE.agrees(&clean, &t.expected),
                "task {}",
                t.id
            );
        }
    }

    #[test]
    fn references_parse_like_nestful() {
        let line = r#"{"id":"x","tools":[{"name":"a","parameters":{"type":"object","properties":{"q":{"type":"string"}},"required":["q"]},"output":{"loc.id":"string","n":"number"}},{"name":"b","parameters":{"type":"object","properties":{"id":{"type":"string"},"t":{"type":"string"}},"required":["id"]},"output":{"v":"number"}}],"plan":[{"tool":"a","args":{"q":"x"},"label":"var1"},{"tool":"b","args":{"id":"$var1.loc.id$","t":"2 * $var1.n$"},"label":"var2"}],"answer":{"r":"$var2.v$"}}"#;
        let ts = load_jsonl(line).unwrap();
        assert_eq!(
            ts[0].plan.steps[1].args[0].1,
            ArgSrc::Ref {
                step: 0,
                path: "loc.id".into()
            }
        );
        assert!(matches!(ts[0].plan.steps[1].args[1].1, ArgSrc::Template(_)));
        assert!(ts[0].expected.get("r").is_some_and(Value::is_number));
        let bad = line.replace("$var1.loc.id$", "$var9.x$");
        assert!(load_jsonl(&bad).is_err_and(|e| e.message.contains("var9")));
    }
}
