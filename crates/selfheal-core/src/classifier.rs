//! Root-cause classification: observable signals in, one failure class out.
//!
//! Recovery only works when the action addresses the cause. A timeout wants a retry; a permanently
//! unavailable tool wants a substitute, and retrying it just burns budget. This module turns what
//! the data plane *observed* (a [`Signal`]) into what the control plane *believes happened* (a
//! [`FailureClass`] plus the coarse [`ErrorType`] of SPEC §2). It is a pure function of the signal
//! and a little run context, with no wildcard arms: adding a signal or a class is a compile error
//! everywhere a decision depends on it.
//!
//! # Why eleven classes
//! The paper names nine classes. We split two more out because they need different recoveries:
//! [`FailureClass::ToolUnavailable`] (persistent: substitute, do not retry) is separated from
//! [`FailureClass::ToolTimeout`] (transient: wait and retry), and [`FailureClass::EmptyOutput`]
//! (a soft failure: the call "worked" but returned nothing useful) from
//! [`FailureClass::MalformedOutput`] (the output cannot be parsed at all: repair it).
//! `ToolTimeout` also covers the other transient runtime errors (rate limits, 5xx, connection
//! resets), because all of them call for the same recovery: back off and retry.

use serde::{Deserialize, Serialize};

/// The inferred root cause of a failed step. Exhaustive by design: policy tables and matches list
/// every variant.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    strum::EnumCount,
)]
#[serde(rename_all = "snake_case")]
pub enum FailureClass {
    /// A tool or model call timed out or failed transiently (timeout, rate limit, HTTP 5xx,
    /// connection reset). Expected to clear on its own: retry with backoff.
    ToolTimeout,
    /// A tool (or upstream) is persistently unavailable: it keeps failing or says so explicitly.
    /// Retrying wastes budget; substitute an equivalent tool or source.
    ToolUnavailable,
    /// The call's arguments (or the request's shape) are invalid: they fail the tool's schema, a
    /// required argument is empty, or the request is too long for the model's context.
    ArgumentInvalid,
    /// The output could not be parsed or does not match the tool's declared output shape
    /// (malformed JSON, truncated output, schema drift).
    MalformedOutput,
    /// The call returned normally but uselessly: null, an empty list, an `error` field,
    /// `isError: true`. A soft failure.
    EmptyOutput,
    /// The model chose a tool that does not exist or does not fit the step.
    WrongTool,
    /// The data used is out of date and must be fetched again.
    StaleContext,
    /// Two sources disagree; one of them must be checked against a third.
    ContradictoryEvidence,
    /// The plan itself is wrong: a step is missing, or the model refused to proceed.
    PlanningFailure,
    /// The verifier rejected a result that raised no error: a wrong-but-plausible output.
    VerificationFailure,
    /// The agent is going round in circles: repeated identical calls, A/B alternation, the same
    /// error again and again, no progress.
    ControlLoop,
}

// A class added to the enum and not to `ALL` fails to compile here.
const _: () = assert!(FailureClass::ALL.len() == <FailureClass as strum::EnumCount>::COUNT);

impl FailureClass {
    /// Every class, in declaration order.
    pub const ALL: [FailureClass; 11] = [
        FailureClass::ToolTimeout,
        FailureClass::ToolUnavailable,
        FailureClass::ArgumentInvalid,
        FailureClass::MalformedOutput,
        FailureClass::EmptyOutput,
        FailureClass::WrongTool,
        FailureClass::StaleContext,
        FailureClass::ContradictoryEvidence,
        FailureClass::PlanningFailure,
        FailureClass::VerificationFailure,
        FailureClass::ControlLoop,
    ];

    /// The snake_case name used in traces, TOML and JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            FailureClass::ToolTimeout => "tool_timeout",
            FailureClass::ToolUnavailable => "tool_unavailable",
            FailureClass::ArgumentInvalid => "argument_invalid",
            FailureClass::MalformedOutput => "malformed_output",
            FailureClass::EmptyOutput => "empty_output",
            FailureClass::WrongTool => "wrong_tool",
            FailureClass::StaleContext => "stale_context",
            FailureClass::ContradictoryEvidence => "contradictory_evidence",
            FailureClass::PlanningFailure => "planning_failure",
            FailureClass::VerificationFailure => "verification_failure",
            FailureClass::ControlLoop => "control_loop",
        }
    }

    /// Whether the class is the model's own mistake (a bad call, the wrong tool, a broken plan,
    /// a loop): its recovery rewrites the model's call rather than repeating the tool's.
    pub fn is_model_side(self) -> bool {
        match self {
            FailureClass::ArgumentInvalid
            | FailureClass::WrongTool
            | FailureClass::PlanningFailure
            | FailureClass::ControlLoop => true,
            FailureClass::ToolTimeout
            | FailureClass::ToolUnavailable
            | FailureClass::MalformedOutput
            | FailureClass::EmptyOutput
            | FailureClass::StaleContext
            | FailureClass::ContradictoryEvidence
            | FailureClass::VerificationFailure => false,
        }
    }

    /// The coarse error type of SPEC §2 that this class falls under when nothing more specific
    /// is known.
    pub fn default_error_type(self) -> ErrorType {
        match self {
            FailureClass::ToolTimeout => ErrorType::Transient,
            FailureClass::ToolUnavailable => ErrorType::Unrecoverable,
            FailureClass::ArgumentInvalid
            | FailureClass::MalformedOutput
            | FailureClass::EmptyOutput
            | FailureClass::StaleContext
            | FailureClass::ContradictoryEvidence
            | FailureClass::VerificationFailure => ErrorType::Structural,
            FailureClass::WrongTool | FailureClass::PlanningFailure | FailureClass::ControlLoop => {
                ErrorType::ModelError
            }
        }
    }
}

impl std::fmt::Display for FailureClass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The four coarse error types of the self-healing skill (SPEC §2), each with a default strategy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorType {
    /// Will likely clear by itself: retry with exponential backoff and jitter.
    Transient,
    /// The shape is wrong: repair it, or re-ask with the precise error.
    Structural,
    /// The model misbehaved (refusal, hallucinated tool or field): fall back along a model chain.
    ModelError,
    /// Cannot be fixed here: degrade gracefully with a partial result and an error report.
    Unrecoverable,
}

/// What the data plane observed about a failed (or suspicious) step. Signals are facts; the
/// class is an inference.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "signal", rename_all = "snake_case")]
pub enum Signal {
    /// The call did not finish within its timeout.
    Timeout,
    /// The call raised or returned a transport error with a message.
    Exception {
        /// The error text as reported.
        message: String,
    },
    /// An HTTP-style status from a tool or model provider.
    HttpStatus {
        /// The status code.
        status: u16,
        /// `Retry-After`, in milliseconds, when the server sent one.
        retry_after_ms: Option<u64>,
        /// The response body or error message, if any.
        message: String,
    },
    /// The tool or provider said it is unavailable (or has failed this many times in a row).
    Unavailable {
        /// Consecutive failures of this tool so far, including this one.
        consecutive: u32,
    },
    /// The arguments failed the tool's schema.
    InvalidArguments {
        /// Precise validation errors ("at /unit: expected one of ...").
        errors: Vec<String>,
    },
    /// A required argument was empty, null or a placeholder.
    EmptyInput {
        /// The argument names that were empty.
        arguments: Vec<String>,
    },
    /// The model called a tool that is not offered.
    UnknownTool {
        /// The name the model used.
        name: String,
    },
    /// The request exceeded the model's context window.
    ContextLength,
    /// The model refused to do the task.
    Refusal,
    /// The model answered with nothing at all (no content, no tool call).
    EmptyResponse,
    /// The output could not be parsed.
    MalformedOutput {
        /// Why it could not be parsed.
        detail: String,
    },
    /// The output was cut off before it ended.
    TruncatedOutput,
    /// The output parsed but its shape differs from the declared output schema.
    SchemaDrift {
        /// What differs.
        detail: String,
    },
    /// The output was null, empty or an error object (a soft failure).
    EmptyOutput,
    /// The tool ran and reported that it failed (MCP `isError: true`), with its text. Unless the
    /// text says the failure is transient, the same call gets the same answer.
    ToolError {
        /// What the tool said.
        message: String,
    },
    /// The data is older than allowed.
    Stale {
        /// Age of the data in milliseconds.
        age_ms: u64,
        /// Maximum allowed age in milliseconds.
        max_age_ms: u64,
    },
    /// Two sources gave different answers to the same question.
    Contradiction {
        /// What disagreed.
        detail: String,
    },
    /// The plan lacks a step that a later step needs (a dependency is unresolved).
    MissingStep {
        /// What is missing.
        detail: String,
    },
    /// The tool used does not fit the step (the monitor or a verifier found it out).
    ToolMismatch {
        /// The tool that was used.
        tool: String,
    },
    /// The monitor detected repetition or a loop.
    Repetition,
    /// A verifier rejected the result.
    VerifierRejected {
        /// The verifier's reason.
        reason: String,
    },
}

impl Signal {
    /// A short snake_case name for traces and metrics.
    pub fn name(&self) -> &'static str {
        match self {
            Signal::Timeout => "timeout",
            Signal::Exception { .. } => "exception",
            Signal::HttpStatus { .. } => "http_status",
            Signal::Unavailable { .. } => "unavailable",
            Signal::InvalidArguments { .. } => "invalid_arguments",
            Signal::EmptyInput { .. } => "empty_input",
            Signal::UnknownTool { .. } => "unknown_tool",
            Signal::ContextLength => "context_length",
            Signal::Refusal => "refusal",
            Signal::EmptyResponse => "empty_response",
            Signal::MalformedOutput { .. } => "malformed_output",
            Signal::TruncatedOutput => "truncated_output",
            Signal::SchemaDrift { .. } => "schema_drift",
            Signal::EmptyOutput => "empty_output",
            Signal::ToolError { .. } => "tool_error",
            Signal::Stale { .. } => "stale",
            Signal::Contradiction { .. } => "contradiction",
            Signal::MissingStep { .. } => "missing_step",
            Signal::ToolMismatch { .. } => "tool_mismatch",
            Signal::Repetition => "repetition",
            Signal::VerifierRejected { .. } => "verifier_rejected",
        }
    }
}

/// Thresholds the classifier uses to tell transient from persistent failures.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClassifierConfig {
    /// After this many consecutive runtime failures of one tool, a timeout or 5xx is taken as
    /// persistent unavailability rather than a transient blip.
    pub unavailable_after: u32,
}

impl Default for ClassifierConfig {
    fn default() -> Self {
        ClassifierConfig {
            unavailable_after: 3,
        }
    }
}

/// The classifier's conclusion about one signal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Classification {
    /// The inferred failure class.
    pub class: FailureClass,
    /// The coarse error type (SPEC §2).
    pub error_type: ErrorType,
    /// A server-provided wait before retrying, when one was given (`Retry-After`).
    pub retry_after_ms: Option<u64>,
}

/// The run context a classification may depend on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClassifyContext {
    /// Consecutive runtime failures of the same tool, including this one.
    pub consecutive_failures: u32,
}

/// Turns signals into failure classes. Pure and deterministic.
#[derive(Debug, Clone, Default)]
pub struct Classifier {
    config: ClassifierConfig,
}

impl Classifier {
    /// A classifier with the given thresholds.
    pub fn new(config: ClassifierConfig) -> Self {
        Classifier { config }
    }

    /// The thresholds in use.
    pub fn config(&self) -> &ClassifierConfig {
        &self.config
    }

    /// Classifies one signal in its context.
    pub fn classify(&self, signal: &Signal, ctx: ClassifyContext) -> Classification {
        let persistent = ctx.consecutive_failures >= self.config.unavailable_after;
        let runtime = |retry_after_ms| {
            if persistent {
                Classification {
                    class: FailureClass::ToolUnavailable,
                    error_type: ErrorType::Unrecoverable,
                    retry_after_ms,
                }
            } else {
                Classification {
                    class: FailureClass::ToolTimeout,
                    error_type: ErrorType::Transient,
                    retry_after_ms,
                }
            }
        };
        let of = |class: FailureClass, error_type: ErrorType| Classification {
            class,
            error_type,
            retry_after_ms: None,
        };
        match signal {
            Signal::Timeout => runtime(None),
            Signal::Exception { message } => match classify_message(message) {
                MessageHint::Transient => runtime(None),
                MessageHint::Unavailable => {
                    of(FailureClass::ToolUnavailable, ErrorType::Unrecoverable)
                }
                MessageHint::Arguments => of(FailureClass::ArgumentInvalid, ErrorType::Structural),
                MessageHint::ContextLength => {
                    of(FailureClass::ArgumentInvalid, ErrorType::Structural)
                }
                MessageHint::WrongTool => of(FailureClass::WrongTool, ErrorType::ModelError),
                MessageHint::NoResults => of(FailureClass::EmptyOutput, ErrorType::Structural),
                MessageHint::Unknown => runtime(None),
            },
            Signal::HttpStatus {
                status,
                retry_after_ms,
                message,
            } => self.classify_status(*status, *retry_after_ms, message, persistent),
            Signal::Unavailable { .. } => {
                of(FailureClass::ToolUnavailable, ErrorType::Unrecoverable)
            }
            Signal::InvalidArguments { .. } | Signal::EmptyInput { .. } => {
                of(FailureClass::ArgumentInvalid, ErrorType::Structural)
            }
            Signal::ContextLength => of(FailureClass::ArgumentInvalid, ErrorType::Structural),
            Signal::UnknownTool { .. } | Signal::ToolMismatch { .. } => {
                of(FailureClass::WrongTool, ErrorType::ModelError)
            }
            Signal::Refusal => of(FailureClass::PlanningFailure, ErrorType::ModelError),
            Signal::EmptyResponse => of(FailureClass::MalformedOutput, ErrorType::ModelError),
            Signal::MalformedOutput { .. }
            | Signal::TruncatedOutput
            | Signal::SchemaDrift { .. } => {
                of(FailureClass::MalformedOutput, ErrorType::Structural)
            }
            Signal::EmptyOutput => of(FailureClass::EmptyOutput, ErrorType::Structural),
            Signal::ToolError { message } => match classify_message(message) {
                MessageHint::Transient => runtime(None),
                MessageHint::Unavailable => {
                    of(FailureClass::ToolUnavailable, ErrorType::Unrecoverable)
                }
                MessageHint::Arguments | MessageHint::ContextLength => {
                    of(FailureClass::ArgumentInvalid, ErrorType::Structural)
                }
                MessageHint::WrongTool => of(FailureClass::WrongTool, ErrorType::ModelError),
                MessageHint::NoResults | MessageHint::Unknown => {
                    of(FailureClass::EmptyOutput, ErrorType::Structural)
                }
            },
            Signal::Stale { .. } => of(FailureClass::StaleContext, ErrorType::Structural),
            Signal::Contradiction { .. } => {
                of(FailureClass::ContradictoryEvidence, ErrorType::Structural)
            }
            Signal::MissingStep { .. } => of(FailureClass::PlanningFailure, ErrorType::ModelError),
            Signal::Repetition => of(FailureClass::ControlLoop, ErrorType::ModelError),
            Signal::VerifierRejected { .. } => {
                of(FailureClass::VerificationFailure, ErrorType::Structural)
            }
        }
    }

    fn classify_status(
        &self,
        status: u16,
        retry_after_ms: Option<u64>,
        message: &str,
        persistent: bool,
    ) -> Classification {
        let of = |class: FailureClass, error_type: ErrorType| Classification {
            class,
            error_type,
            retry_after_ms,
        };
        match status {
            // Rate limits always clear with time, however often they repeat.
            429 => of(FailureClass::ToolTimeout, ErrorType::Transient),
            408 | 500 | 502 | 503 | 504 => {
                // Some OpenAI-compatible servers answer 500 to a request shape they reject
                // (`content: null` beside `tool_calls`); that is structural, not transient.
                if status == 500 && classify_message(message) == MessageHint::Arguments {
                    of(FailureClass::ArgumentInvalid, ErrorType::Structural)
                } else if persistent {
                    of(FailureClass::ToolUnavailable, ErrorType::Unrecoverable)
                } else {
                    of(FailureClass::ToolTimeout, ErrorType::Transient)
                }
            }
            400 | 422 => match classify_message(message) {
                MessageHint::ContextLength => {
                    of(FailureClass::ArgumentInvalid, ErrorType::Structural)
                }
                MessageHint::Arguments
                | MessageHint::Transient
                | MessageHint::Unavailable
                | MessageHint::WrongTool
                | MessageHint::NoResults
                | MessageHint::Unknown => of(FailureClass::ArgumentInvalid, ErrorType::Structural),
            },
            404 => of(FailureClass::WrongTool, ErrorType::ModelError),
            401 | 403 => of(FailureClass::ToolUnavailable, ErrorType::Unrecoverable),
            413 => of(FailureClass::ArgumentInvalid, ErrorType::Structural),
            _ if status >= 500 => {
                if persistent {
                    of(FailureClass::ToolUnavailable, ErrorType::Unrecoverable)
                } else {
                    of(FailureClass::ToolTimeout, ErrorType::Transient)
                }
            }
            _ => of(FailureClass::ArgumentInvalid, ErrorType::Structural),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum MessageHint {
    /// A timeout, a rate limit, a reset connection, an overloaded server: the same call may
    /// work later.
    Transient,
    /// The tool or its backend is down, or refuses this caller: use another tool.
    Unavailable,
    /// The arguments are wrong (a validation error, a value the tool does not take, a file that
    /// is not there): the call must change.
    Arguments,
    /// The request is over the model's context window.
    ContextLength,
    /// The tool does not do this (unknown tool, not relevant, an operation it lacks): use
    /// another tool.
    WrongTool,
    /// The tool ran and found nothing: try a different query.
    NoResults,
    /// Nothing in the text says which.
    Unknown,
}

/// Whether an error text reads as a transient failure (a timeout, a rate limit, a reset
/// connection, an overloaded server): one that sending the same call again may clear.
pub(crate) fn transient_text(message: &str) -> bool {
    classify_message(message) == MessageHint::Transient
}

/// A coarse reading of free-text error messages, in the order a person reads them: the most
/// specific cause first (the context window, a tool that does not do this, nothing found), then
/// what time may clear, then an outage, then wrong arguments. Used only to refine a signal
/// that carries no structured cause; structured signals always win. The corpus in
/// `tests/corpus/tool_errors.jsonl` measures it (`tests/error_texts.rs`).
/// Whether an error text says what kind of failure it is (transient, an outage, wrong
/// arguments, the wrong tool, nothing found). A tool's error body whose text says nothing
/// more than that it failed is read as an empty output, as before it had a text.
pub(crate) fn message_is_telling(message: &str) -> bool {
    classify_message(message) != MessageHint::Unknown
}

fn classify_message(message: &str) -> MessageHint {
    let m = message.to_ascii_lowercase();
    let has = |needles: &[&str]| needles.iter().any(|n| m.contains(n));
    let trimmed = m.trim();
    if has(&[
        "context length",
        "context_length",
        "maximum context",
        "too many tokens",
        "context window",
    ]) {
        MessageHint::ContextLength
    } else if has(&[
        "unknown tool",
        "no such tool",
        "not relevant",
        "method not found",
        "unsupported operation",
        "operation not supported",
        "not supported by this tool",
        "only supports",
        "cannot answer",
        "use another tool",
        "use a different tool",
    ]) || (m.contains("tool") && has(&["not found", "does not exist"]))
    {
        MessageHint::WrongTool
    } else if has(&[
        "no results",
        "0 results",
        "found 0",
        "nothing found",
        "no data",
        "no matching",
        "did not match any",
        "\"results\": []",
    ]) || trimmed == "[]"
        || trimmed == "{}"
    {
        MessageHint::NoResults
    } else if has(&[
        "timeout",
        "timed out",
        "rate limit",
        "rate_limit",
        "too many requests",
        "connection reset",
        "econnreset",
        "etimedout",
        "hang up",
        "temporar",
        "try again",
        "overloaded",
        "bad gateway",
        "gateway timeout",
        "503 service unavailable",
        "max retries exceeded",
    ]) {
        MessageHint::Transient
    } else if has(&[
        "unavailable",
        "permission denied",
        "forbidden",
        "unauthorized",
        "credentials",
        "api key",
        "expired",
        "suspended",
        "quota",
        "gone",
        "deprecated",
        "disabled",
        "econnrefused",
        "connection refused",
        "maintenance",
    ]) {
        MessageHint::Unavailable
    } else if has(&[
        "invalid",
        "validation",
        "valueerror",
        "typeerror",
        "keyerror",
        "syntaxerror",
        "unexpected token",
        "required",
        "missing",
        "must be",
        "must not",
        "expected",
        "malformed",
        "bad request",
        "unprocessable",
        "not a valid",
        "unsupported",
        "out of range",
        "cannot parse",
        "could not parse",
        "no such file",
        "enoent",
        "eisdir",
        "not found",
        "does not exist",
        "division by zero",
        "unknown ",
        "schema",
        "content: null",
        "'content'",
        "\"content\"",
        "cannot be null",
    ]) {
        MessageHint::Arguments
    } else {
        MessageHint::Unknown
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn classify(signal: Signal, consecutive: u32) -> Classification {
        Classifier::default().classify(
            &signal,
            ClassifyContext {
                consecutive_failures: consecutive,
            },
        )
    }

    #[test]
    fn timeouts_are_transient_until_they_persist() {
        assert_eq!(
            classify(Signal::Timeout, 1).class,
            FailureClass::ToolTimeout
        );
        assert_eq!(
            classify(Signal::Timeout, 2).class,
            FailureClass::ToolTimeout
        );
        let persistent = classify(Signal::Timeout, 3);
        assert_eq!(persistent.class, FailureClass::ToolUnavailable);
        assert_eq!(persistent.error_type, ErrorType::Unrecoverable);
    }

    #[test]
    fn rate_limits_stay_transient_and_keep_retry_after() {
        let c = classify(
            Signal::HttpStatus {
                status: 429,
                retry_after_ms: Some(2000),
                message: "rate limited".into(),
            },
            9,
        );
        assert_eq!(c.class, FailureClass::ToolTimeout);
        assert_eq!(c.error_type, ErrorType::Transient);
        assert_eq!(c.retry_after_ms, Some(2000));
    }

    #[test]
    fn content_null_500_is_structural() {
        let c = classify(
            Signal::HttpStatus {
                status: 500,
                retry_after_ms: None,
                message: "'content' must be a string, got null".into(),
            },
            1,
        );
        assert_eq!(c.class, FailureClass::ArgumentInvalid);
        assert_eq!(c.error_type, ErrorType::Structural);
        let plain = classify(
            Signal::HttpStatus {
                status: 500,
                retry_after_ms: None,
                message: "internal error".into(),
            },
            1,
        );
        assert_eq!(plain.class, FailureClass::ToolTimeout);
    }

    #[test]
    fn model_side_errors() {
        let ctx = classify(
            Signal::HttpStatus {
                status: 400,
                retry_after_ms: None,
                message: "This model's maximum context length is 4096 tokens".into(),
            },
            0,
        );
        assert_eq!(ctx.class, FailureClass::ArgumentInvalid);
        assert_eq!(
            classify(Signal::UnknownTool { name: "x".into() }, 0).error_type,
            ErrorType::ModelError
        );
        assert_eq!(
            classify(Signal::Refusal, 0).class,
            FailureClass::PlanningFailure
        );
        assert_eq!(
            classify(Signal::EmptyResponse, 0).error_type,
            ErrorType::ModelError
        );
        assert_eq!(
            classify(Signal::InvalidArguments { errors: vec![] }, 0).class,
            FailureClass::ArgumentInvalid
        );
    }

    #[test]
    fn every_class_has_a_unique_name() {
        let mut names: Vec<_> = FailureClass::ALL.iter().map(|c| c.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), FailureClass::ALL.len());
        for c in FailureClass::ALL {
            let json = serde_json::to_string(&c).unwrap_or_default();
            assert_eq!(json, format!("\"{}\"", c.as_str()));
        }
    }

    #[test]
    fn exception_messages_refine_the_class() {
        assert_eq!(
            classify(
                Signal::Exception {
                    message: "permission denied".into()
                },
                0
            )
            .class,
            FailureClass::ToolUnavailable
        );
        assert_eq!(
            classify(
                Signal::Exception {
                    message: "connection reset by peer".into()
                },
                0
            )
            .class,
            FailureClass::ToolTimeout
        );
    }
}
