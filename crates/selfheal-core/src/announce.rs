//! Answers that announce a tool call instead of making it.
//!
//! Why: a small model asked to use tools often answers with the plan instead of the step —
//! "To get the capital of France, I need to call the `geo_capital` function." — or writes the
//! call as text in a form the front-end could not take as a call. Such a text has no value in
//! it; a front-end that passes it on as the run's final answer claims a task done that was never
//! started (issue 31: three of five wrong answers a real 1.5B model's runs claimed). The core
//! reads the answer once, here, for every front-end: [`announced_call`] says whether an answer
//! announces or writes a call of an offered tool, and [`crate::run::Run`] asks the model again
//! once, then flags the answer `partial`.
//!
//! The rule is read off the text alone, with the tools on offer, and errs on the side of not
//! flagging: a tool named in a sentence that reports what it gave ("According to
//! `get_weather`, Paris is 18 °C", "I called `geo_capital` and got Paris") is not an
//! announcement; neither is an offer to the user ("If you want it in Fahrenheit, I can call
//! `c_to_f`") or a question. What counts, per sentence or clause that names an offered tool:
//!
//! - an intent to call it: a call verb (`call`, `use`, `invoke`, `run`, `execute`, `query`) in
//!   its plain form after an intent marker within three words (`I need to call`, `I will use`,
//!   `Let me call`, `we should first invoke`, `I'm going to use`, `I am calling`);
//! - an instruction to call it: a clause that opens with the plain verb (`Call geo_capital with
//!   …`, `1. Use fx_rate to …`, `First, call …`, `To find it, use …`);
//! - a passive one: the tool named, then `needs to be called`, `should be used`, `will be
//!   invoked` and the like;
//! - a call written as text: JSON naming it (`"name": "geo_capital"`, also under `"tool"`,
//!   `"function"` or `"tool_name"`), a call tag (`<tool_call>`, `[TOOL_CALLS]`,
//!   `<|python_tag|>`) before its name, or its name followed by `(` (`geo_capital(country=
//!   "France")`).
//!
//! A sentence with `if`, or one that ends in `?`, is an offer or a question, not an
//! announcement (the call-as-text forms are judged in it all the same).

/// How an answer announces a call it did not make.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Form {
    /// It says it will, or that one must, call the tool ("I need to call `geo_capital`").
    Intent,
    /// It writes the call as text (JSON naming the tool, a call tag, `tool(…)`).
    Text,
}

/// An answer's announcement of a call of an offered tool ([`announced_call`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Announced {
    /// The tool it names.
    pub tool: String,
    /// How.
    pub form: Form,
}

impl Announced {
    /// Why an answer that announces this call is not a final answer, in words.
    pub fn reason(&self) -> String {
        match self.form {
            Form::Intent => format!(
                "the answer announces a call of `{}` instead of making it",
                self.tool
            ),
            Form::Text => format!(
                "the answer writes a call of `{}` as text instead of making it",
                self.tool
            ),
        }
    }

    /// What the model is told when it is asked again.
    pub fn guidance(&self) -> String {
        format!(
            "Your last reply described a call of `{}` but did not make it, so nothing was run. \
             Call the tool now with a structured tool call (tool_calls), or, if you already have \
             the value, answer with the value itself.",
            self.tool
        )
    }
}

/// Markers of an intent, each as the word(s) that come right before the call verb (up to
/// three words may sit between: "I need to first call", "let me now quickly use").
const INTENT: &[&[&str]] = &[
    &["need", "to"],
    &["needs", "to"],
    &["have", "to"],
    &["has", "to"],
    &["want", "to"],
    &["going", "to"],
    &["about", "to"],
    &["will"],
    &["i'll"],
    &["we'll"],
    &["let", "me"],
    &["let's"],
    &["let", "us"],
    &["should"],
    &["must"],
    &["shall"],
    &["can"],
    &["could"],
    &["would"],
    &["i'd"],
    &["we'd"],
    &["i", "am"],
    &["i'm"],
    &["we", "are"],
    &["we're"],
];

/// Call verbs in their plain form (and the progressive after "I am").
const VERBS: &[&str] = &[
    "call",
    "use",
    "invoke",
    "run",
    "execute",
    "query",
    "calling",
    "using",
    "invoking",
    "running",
    "executing",
    "querying",
];

/// Words that may open a clause before an instruction's verb ("First, call …", "1. Use …").
const OPENERS: &[&str] = &[
    "first", "next", "then", "now", "finally", "so", "and", "step", "please",
];

/// Passive announcements after the tool's name: "`geo_capital` needs to be called".
const PASSIVE: &[&str] = &[
    "needs to be",
    "need to be",
    "has to be",
    "have to be",
    "should be",
    "must be",
    "will be",
    "can be",
    "is to be",
];

/// How much of an answer is read for an announced call: an announcement is a sentence or a
/// short plan, at the start or the end of an answer.
pub(crate) const MAX_JUDGED: usize = 16 * 1024;

/// `text`, or for a longer one its first and last `MAX_JUDGED / 2` bytes (cut on char
/// boundaries) joined by a sentence break.
fn judged_part(text: &str) -> std::borrow::Cow<'_, str> {
    if text.len() <= MAX_JUDGED {
        return std::borrow::Cow::Borrowed(text);
    }
    let half = MAX_JUDGED / 2;
    let mut head = half;
    while !text.is_char_boundary(head) {
        head -= 1;
    }
    let mut tail = text.len() - half;
    while !text.is_char_boundary(tail) {
        tail += 1;
    }
    std::borrow::Cow::Owned(format!("{}.\n{}", &text[..head], &text[tail..]))
}

/// Participles of a passive announcement.
const PARTICIPLES: &[&str] = &["called", "used", "invoked", "run", "executed", "queried"];

/// Markers of a call written as text, before the tool's name.
const TAGS: &[&str] = &["<tool_call>", "[tool_calls]", "<|python_tag|>"];

/// JSON keys that name the tool of a call written as text.
const NAME_KEYS: &[&str] = &["name", "tool", "function", "tool_name"];

/// Whether `text`, a final answer, announces a call of one of the `offered` tools instead of
/// making it, or writes one as text (see the module documentation for the rule). The first
/// such call, in order of appearance; `None` for an answer that names no offered tool, or
/// names one only to report what it gave. Pure; a text longer than 16 KiB (`MAX_JUDGED`) is
/// judged on its first and last 8 KiB, so a runaway answer costs a bounded time.
pub fn announced_call(text: &str, offered: &[&str]) -> Option<Announced> {
    let offered: Vec<&str> = offered.iter().copied().filter(|n| !n.is_empty()).collect();
    if offered.is_empty() {
        return None;
    }
    let lower = judged_part(text).to_lowercase();
    if let Some(tool) = written_as_text(&lower, &offered) {
        return Some(Announced {
            tool,
            form: Form::Text,
        });
    }
    for sentence in sentences(&lower) {
        let trimmed = sentence.trim();
        if trimmed.ends_with('?') || words(trimmed).any(|w| w == "if") {
            continue;
        }
        for clause in trimmed.split([',', ';', ':']) {
            if let Some(tool) = intent_in(clause, &offered) {
                return Some(Announced {
                    tool,
                    form: Form::Intent,
                });
            }
        }
    }
    None
}

/// The offered tool a call written as text in `lower` names, if any.
fn written_as_text(lower: &str, offered: &[&str]) -> Option<String> {
    let mut first: Option<(usize, &str)> = None;
    for &tool in offered {
        let name = tool.to_lowercase();
        for (at, _) in lower.match_indices(name.as_str()) {
            if !bounded(lower, at, name.len()) {
                continue;
            }
            let before = &lower[..at];
            let after = &lower[at + name.len()..];
            let quoted_value = before.ends_with('"') || before.ends_with('\'');
            let key = quoted_value
                && before[..before.len() - 1]
                    .trim_end()
                    .strip_suffix(':')
                    .map(str::trim_end)
                    .is_some_and(|b| {
                        NAME_KEYS.iter().any(|k| {
                            b.ends_with(&format!("\"{k}\"")) || b.ends_with(&format!("'{k}'"))
                        })
                    });
            let tagged = TAGS.iter().any(|t| before.contains(t));
            let applied = after
                .strip_prefix('(')
                .is_some_and(|rest| rest.contains(')'));
            if (key || tagged || applied) && first.is_none_or(|(f, _)| at < f) {
                first = Some((at, tool));
            }
        }
    }
    first.map(|(_, t)| t.to_owned())
}

/// Whether `lower[at..at + len]` stands as a word: no letter, digit or `_` touches it.
fn bounded(lower: &str, at: usize, len: usize) -> bool {
    let wordy = |c: char| c.is_alphanumeric() || c == '_';
    !lower[..at].chars().next_back().is_some_and(wordy)
        && !lower[at + len..].chars().next().is_some_and(wordy)
}

/// The sentences of `lower`: split at `.`, `!` or `?` followed by a space or the end (so
/// `18.5` and `fx.rate` stay whole), and at line breaks. A sentence keeps its `?`.
fn sentences(lower: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut start = 0;
    let bytes = lower.as_bytes();
    for (i, &b) in bytes.iter().enumerate() {
        let end = match b {
            b'\n' => Some(i),
            b'.' | b'!' | b'?' if bytes.get(i + 1).is_none_or(u8::is_ascii_whitespace) => {
                Some(i + 1)
            }
            _ => None,
        };
        if let Some(end) = end {
            if end > start {
                out.push(&lower[start..end]);
            }
            start = i + 1;
        }
    }
    if start < lower.len() {
        out.push(&lower[start..]);
    }
    out
}

/// The words of a clause: runs of letters, digits, `_`, `'` and `.` inside a name (`fx.rate`),
/// with the backticks and quotes of a quoted name left out.
fn words(clause: &str) -> impl Iterator<Item = &str> {
    clause
        .split(|c: char| !(c.is_alphanumeric() || matches!(c, '_' | '\'' | '’' | '.' | '-')))
        .map(|w| w.trim_matches(|c: char| matches!(c, '\'' | '’' | '.' | '-')))
        .filter(|w| !w.is_empty())
}

/// The offered tool `clause` announces a call of (intent, instruction or passive), if any.
fn intent_in(clause: &str, offered: &[&str]) -> Option<String> {
    let ws: Vec<String> = words(clause).map(|w| w.replace('’', "'")).collect();
    let tools: Vec<(usize, &str)> = ws
        .iter()
        .enumerate()
        .filter_map(|(i, w)| {
            offered
                .iter()
                .find(|t| t.to_lowercase() == *w)
                .map(|t| (i, *t))
        })
        .collect();
    if tools.is_empty() {
        return None;
    }
    // Passive: the tool named, then "needs to be called".
    for &(i, tool) in &tools {
        let rest = ws[i + 1..].join(" ");
        let rest = rest
            .strip_prefix("tool ")
            .or_else(|| rest.strip_prefix("function "))
            .unwrap_or(&rest);
        let passive = PASSIVE.iter().any(|p| {
            rest.strip_prefix(p)
                .and_then(|r| r.split_whitespace().next())
                .is_some_and(|v| PARTICIPLES.contains(&v))
        });
        if passive {
            return Some(tool.to_owned());
        }
    }
    for (v, verb) in ws.iter().enumerate() {
        if !VERBS.contains(&verb.as_str()) {
            continue;
        }
        // The tool comes after the verb in the clause.
        let Some(&(_, tool)) = tools.iter().find(|(i, _)| *i > v) else {
            continue;
        };
        let progressive = verb.ends_with("ing");
        // An instruction: the clause opens with the verb (after opener words or a number).
        let opens = !progressive
            && ws[..v]
                .iter()
                .all(|w| OPENERS.contains(&w.as_str()) || w.chars().all(|c| c.is_ascii_digit()));
        // An intent: a marker ending at most three words before the verb; the progressive
        // only after "I am" / "we are".
        let intent = INTENT.iter().any(|m| {
            (0..v).any(|s| {
                let e = s + m.len();
                e <= v
                    && v - e <= 3
                    && ws[s..e].iter().zip(m.iter()).all(|(a, b)| a == b)
                    && (!progressive || ["i", "i'm", "we", "we're"].contains(&m[0]))
            })
        });
        if opens || intent {
            return Some(tool.to_owned());
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A runaway answer is read on its two ends only: an announcement at its end is still
    /// found (the part read is cut on char boundaries, multi-byte text included), one buried
    /// in its middle is not (the documented bound).
    #[test]
    fn a_runaway_answer_is_read_on_its_ends() {
        let filler = "é geo_capital ".repeat(4_000);
        let at_end = format!("{filler}I need to call `geo_capital`.");
        assert!(at_end.len() > MAX_JUDGED);
        assert_eq!(
            announced_call(&at_end, OFFERED).map(|a| a.tool),
            Some("geo_capital".to_owned())
        );
        let middle = format!("{filler}I need to call `geo_capital`.{filler}");
        assert_eq!(announced_call(&middle, OFFERED), None);
    }

    const OFFERED: &[&str] = &[
        "geo_capital",
        "weather_current",
        "get_weather",
        "calc_multiply",
        "calc_convert",
        "fx_rate",
        "c_to_f",
        "send_email",
        "run",
    ];

    /// Answers that announce or write a call instead of making it, with the tool and form. The
    /// first is a real answer of Qwen2.5-Coder-1.5B in `selfheal bench --live`
    /// (docs/benchmark/live.md); the `Text` ones are the bodies of the recorded fixtures in
    /// crates/selfheal-gateway/tests/fixtures/live (`fenced_call`, `after_result`,
    /// `repeat_after_result`, `soft_error` with its tool on offer).
    const POSITIVE: &[(&str, &str, Form)] = &[
        (
            "To get the capital of France, I need to call the `geo_capital` function.",
            "geo_capital",
            Form::Intent,
        ),
        (
            "```json\n{\n  \"name\": \"get_weather\",\n  \"arguments\": {\n    \"city\": \"Paris\"\n  }\n}\n```",
            "get_weather",
            Form::Text,
        ),
        (
            "{\"name\": \"calc_multiply\", \"arguments\": {\"a\": 250, \"b\": 1.0843}}",
            "calc_multiply",
            Form::Text,
        ),
        (
            "{{\"name\": \"fx_rate\", \"arguments\": {\"from\": \"EUR\", \"to\": \"USD\"}, \"result\": {\"rate\": 1.0843}}}",
            "fx_rate",
            Form::Text,
        ),
        (
            "Let me use the get_weather tool to find the temperature in Paris.",
            "get_weather",
            Form::Intent,
        ),
        (
            "I will call calc_multiply with a=3 and b=4.",
            "calc_multiply",
            Form::Intent,
        ),
        ("I'll use fx_rate next.", "fx_rate", Form::Intent),
        (
            "I’m going to use `weather_current` for Paris.",
            "weather_current",
            Form::Intent,
        ),
        (
            "We should first invoke geo_capital with the country.",
            "geo_capital",
            Form::Intent,
        ),
        ("I am calling get_weather now.", "get_weather", Form::Intent),
        (
            "1. Call geo_capital with country France.\n2. Call weather_current with the capital.\n3. Convert with c_to_f.",
            "geo_capital",
            Form::Intent,
        ),
        (
            "First, use fx_rate to get the rate from JPY to USD.",
            "fx_rate",
            Form::Intent,
        ),
        (
            "To find the temperature, call `get_weather` with the city.",
            "get_weather",
            Form::Intent,
        ),
        (
            "The `geo_capital` function needs to be called first.",
            "geo_capital",
            Form::Intent,
        ),
        ("geo_capital(country=\"France\")", "geo_capital", Form::Text),
        (
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>",
            "get_weather",
            Form::Text,
        ),
        (
            "[TOOL_CALLS] [{\"name\": \"fx_rate\", \"arguments\": {}}]",
            "fx_rate",
            Form::Text,
        ),
        (
            "The answer: we need to run calc_convert on 18 with unit c_to_f.",
            "calc_convert",
            Form::Intent,
        ),
    ];

    /// Answers that name no offered tool, or name one only to report what it gave, offer a
    /// call to the user, or ask.
    const NEGATIVE: &[&str] = &[
        "271.075",
        "According to get_weather, Paris is 18°C.",
        "I called geo_capital and got Paris; its weather is 18 °C.",
        "Using get_weather, I found that Paris is 18 °C.",
        "The get_weather tool says it is 18 °C in Paris.",
        "geo_capital returned Paris.",
        "Paris is 18 °C. If you want it in Fahrenheit, I can call c_to_f.",
        "Would you like me to call send_email?",
        "Shall I use fx_rate for today's rate?",
        "I used fx_rate and calc_multiply: 250 JPY is 1.67 USD.",
        "The capital of France is Paris. I need to check nothing else.",
        "I will call you back later.",
        "Use the metric system: it is 18 °C.",
        "The result of calc_multiply was 74.5.",
        "After calling geo_capital, the capital is Paris.",
        "The capital is Paris (from geo_capital).",
        "The text quotes {\"name\": \"Alice\"} as an example.",
        "I had to use fx_rate twice; the rate is 1.0843.",
        "",
    ];

    #[test]
    fn announcements_are_read_and_reports_are_not() {
        for (text, tool, form) in POSITIVE {
            assert_eq!(
                announced_call(text, OFFERED),
                Some(Announced {
                    tool: (*tool).to_owned(),
                    form: *form
                }),
                "{text}"
            );
        }
        for text in NEGATIVE {
            assert_eq!(announced_call(text, OFFERED), None, "{text}");
        }
    }

    #[test]
    fn only_offered_tools_count() {
        let text = "To get the capital of France, I need to call the `geo_capital` function.";
        assert_eq!(announced_call(text, &["get_weather"]), None);
        assert_eq!(announced_call(text, &[]), None);
        assert_eq!(
            announced_call("{\"name\": \"say_hello\", \"arguments\": {}}", OFFERED),
            None
        );
    }

    #[test]
    fn the_reason_and_guidance_name_the_tool() {
        let a = announced_call("I need to call geo_capital.", OFFERED).unwrap();
        assert!(a.reason().contains("`geo_capital`"));
        assert!(a.guidance().contains("`geo_capital`"));
        assert!(a.guidance().contains("tool_calls"));
    }
}
