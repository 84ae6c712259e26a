//! Tools the agent loop can call: async functions with a JSON Schema and a declared effect.
//!
//! Why a declared effect: the policy may retry a failed call, and retrying is only safe when the
//! call has no side effect or the same effect twice is harmless. A tool says which it is
//! ([`Effect`], after MCP's `readOnlyHint` / `idempotentHint` / `destructiveHint`), and the loop
//! never retries a destructive call that may already have run unless the caller allows it.
//!
//! Why an output schema: a tool that returns *something* has not necessarily returned the right
//! thing. A spec may carry an [`OutputSchema`]; the agent loop checks every successful output
//! against it before the model sees it, and a mismatch is a verifier rejection the controller
//! recovers from like any other failure (SPEC §3) instead of a plausible-looking result. The
//! schema is compiled once, when the spec is built, so a bad schema is an [`OutputSchemaError`]
//! there and never a surprise in the middle of a run.
//!
//! The trait is object-safe without `async_trait`: `call` returns a boxed `'static` future, so
//! tools can be stored as `Arc<dyn Tool>` and raced against their timeout.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use selfheal_core::{Judgement, SchemaError, SchemaVerifier, Subject, Verifier};
use serde_json::Value;
use thiserror::Error;

/// What calling a tool does to the world.
///
/// The default is the conservative [`Effect::Destructive`]: a tool that does not say it only
/// reads, or that a repeat is harmless, is never retried after it may have run — as the MCP
/// proxy treats a tool without `readOnlyHint` or `idempotentHint`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Effect {
    /// Reads only: retrying is always safe.
    ReadOnly,
    /// Writes, but the same call twice has the effect of one: retrying is safe.
    Idempotent,
    /// Writes, and a repeat may do it twice (or nobody said otherwise): never retried after it
    /// may have run, unless the agent allows it.
    #[default]
    Destructive,
}

/// The description of a tool: what the model is offered and how the loop treats it.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolSpec {
    /// The name the model calls it by.
    pub name: String,
    /// What it does, for the model.
    pub description: String,
    /// The JSON Schema of its arguments.
    pub parameters: Value,
    /// How long one call may take.
    pub timeout: Duration,
    /// Its effect on the world.
    pub effect: Effect,
    /// An equivalent tool the loop may call instead when this one fails (a substitute).
    pub substitute: Option<String>,
    /// The JSON Schema every successful output must match, compiled (see
    /// [`ToolSpec::with_output_schema`]). `None`: outputs are not checked.
    pub output_schema: Option<OutputSchema>,
    /// Its arguments are copied from the task or an earlier tool result, never invented: a
    /// call whose argument appears in neither is re-asked before it runs (the core's
    /// [`selfheal_core::ungrounded_arguments`], as the gateway's `grounded` tools).
    pub grounded: bool,
}

/// A tool's output schema, compiled once into a [`SchemaVerifier`].
///
/// The only way to make one is [`OutputSchema::new`], so a spec never holds a schema that does
/// not compile. Clones share the compiled verifier; equality compares the schemas.
#[derive(Clone)]
pub struct OutputSchema {
    schema: Value,
    verifier: Arc<SchemaVerifier>,
}

impl OutputSchema {
    /// Compiles `schema` (draft detected from `$schema`, 2020-12 by default).
    pub fn new(schema: Value) -> Result<Self, SchemaError> {
        let verifier = SchemaVerifier::new(&schema)?;
        Ok(OutputSchema {
            schema,
            verifier: Arc::new(verifier),
        })
    }

    /// The schema as given.
    pub fn schema(&self) -> &Value {
        &self.schema
    }

    /// The compiled verifier (its name in traces is `schema`).
    pub fn verifier(&self) -> &SchemaVerifier {
        &self.verifier
    }

    /// Judges one output: [`Judgement::Accept`] or [`Judgement::Reject`] with the first errors
    /// and their JSON pointers.
    pub fn verify(&self, output: &Value) -> Judgement {
        self.verifier.verify(&Subject {
            output,
            claims_success: true,
            unresolved_failures: 0,
            evidence: &[],
        })
    }
}

impl std::fmt::Debug for OutputSchema {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("OutputSchema").field(&self.schema).finish()
    }
}

impl PartialEq for OutputSchema {
    fn eq(&self, other: &Self) -> bool {
        self.schema == other.schema
    }
}

/// A tool's output schema did not compile.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("the output schema of tool `{tool}` does not compile: {source}")]
pub struct OutputSchemaError {
    /// The tool whose schema it is.
    pub tool: String,
    /// The compiler's complaint.
    #[source]
    pub source: SchemaError,
}

impl ToolSpec {
    /// A tool with a 30 s timeout, no substitute, and the conservative effect
    /// ([`Effect::Destructive`]: not retried after it may have run) until
    /// [`ToolSpec::with_effect`] says otherwise.
    pub fn new(name: impl Into<String>, description: impl Into<String>, parameters: Value) -> Self {
        ToolSpec {
            name: name.into(),
            description: description.into(),
            parameters,
            timeout: Duration::from_secs(30),
            effect: Effect::Destructive,
            substitute: None,
            output_schema: None,
            grounded: false,
        }
    }

    /// The same spec, its arguments to be copied from the task or an earlier tool result
    /// ([`ToolSpec::grounded`]).
    pub fn with_grounded(mut self) -> Self {
        self.grounded = true;
        self
    }

    /// The same spec with another timeout.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The same spec with another effect.
    pub fn with_effect(mut self, effect: Effect) -> Self {
        self.effect = effect;
        self
    }

    /// The same spec with a substitute tool.
    pub fn with_substitute(mut self, name: impl Into<String>) -> Self {
        self.substitute = Some(name.into());
        self
    }

    /// The same spec with an output schema: every successful output of the tool is checked
    /// against `schema` before the model sees it. Fails, naming the tool, when the schema does
    /// not compile.
    pub fn with_output_schema(mut self, schema: Value) -> Result<Self, OutputSchemaError> {
        match OutputSchema::new(schema) {
            Ok(s) => {
                self.output_schema = Some(s);
                Ok(self)
            }
            Err(source) => Err(OutputSchemaError {
                tool: self.name,
                source,
            }),
        }
    }

    /// The OpenAI `tools` entry for this tool (the output schema is not part of it: the OpenAI
    /// tool format has no place for one, and it is the loop's check, not the model's).
    pub fn openai(&self) -> Value {
        serde_json::json!({
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            }
        })
    }

    /// The names of the required arguments, from the schema.
    pub fn required(&self) -> Vec<String> {
        selfheal_repair::required_properties(&self.parameters)
    }
}

/// Why a tool call failed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ToolError {
    /// The call was refused before it did anything (bad input, connection refused): safe to
    /// retry whatever the tool's effect.
    #[error("{0}")]
    Rejected(String),
    /// The call failed and may have had its effect.
    #[error("{message}")]
    Failed {
        /// The error text.
        message: String,
        /// An HTTP-like status, when the tool has one.
        status: Option<u16>,
        /// `Retry-After` in milliseconds, when the tool sent one.
        retry_after_ms: Option<u64>,
    },
}

impl ToolError {
    /// A failure with a message and no status.
    pub fn failed(message: impl Into<String>) -> Self {
        ToolError::Failed {
            message: message.into(),
            status: None,
            retry_after_ms: None,
        }
    }
}

/// An async function the model can call.
pub trait Tool: Send + Sync {
    /// Its description.
    fn spec(&self) -> &ToolSpec;
    /// Calls it with validated arguments.
    fn call(&self, args: Value) -> BoxFuture<'static, Result<Value, ToolError>>;
}

type ToolFn = dyn Fn(Value) -> BoxFuture<'static, Result<Value, ToolError>> + Send + Sync;

/// A tool made from a closure returning a future.
pub struct FnTool {
    spec: ToolSpec,
    f: Arc<ToolFn>,
}

impl std::fmt::Debug for FnTool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FnTool").field("spec", &self.spec).finish()
    }
}

impl FnTool {
    /// Wraps `f` as a tool described by `spec`.
    pub fn new<F, Fut>(spec: ToolSpec, f: F) -> Self
    where
        F: Fn(Value) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Value, ToolError>> + Send + 'static,
    {
        FnTool {
            spec,
            f: Arc::new(move |args| f(args).boxed()),
        }
    }

    /// Wraps `self` in an `Arc<dyn Tool>`.
    pub fn shared(self) -> Arc<dyn Tool> {
        Arc::new(self)
    }
}

impl Tool for FnTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn call(&self, args: Value) -> BoxFuture<'static, Result<Value, ToolError>> {
        (self.f)(args)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 11: a tool that declares nothing is never retried after it may have run.
    #[test]
    fn an_undeclared_tool_is_treated_as_destructive() {
        let spec = ToolSpec::new("send", "Sends.", serde_json::json!({"type": "object"}));
        assert_eq!(spec.effect, Effect::Destructive);
        assert_eq!(Effect::default(), Effect::Destructive);
    }
}
