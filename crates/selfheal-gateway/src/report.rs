//! What a healed answer tells about itself: the `selfheal` report (actions, budget, limits),
//! the `x-selfheal-*` headers, and the trace details recorded for a request. Shared by every
//! dialect so that chat, Responses and Messages report a run the same way.

use crate::action::{Action, joined, push_once};
use crate::heal::{self};
use crate::runs::RunState;
use crate::state::lock;
use crate::store::Detail;
use crate::upstream::CallLog;
use axum::http::{HeaderName, HeaderValue};
use axum::response::Response;
use selfheal_core::{BudgetLimits, Dimension};
use serde_json::{Value, json};
use std::sync::Mutex;

/// The report's `budget`: what the run spent and its limits.
pub(crate) fn budget_json(st: &RunState) -> Value {
    json!({"spent": st.ledger().spent(), "limits": limits_json(st.ledger().limits())})
}

/// Adds the kinds of the call's events (retry, fallback, ...) to `actions`, each once.
pub(crate) fn call_actions(log: &CallLog, actions: &mut Vec<Action>) {
    for a in log
        .events
        .iter()
        .filter_map(|e| Action::of_call_event(e.kind))
    {
        push_once(actions, a);
    }
}

/// How a turn ended, as the report, the headers and the trace spell it (`complete`, `partial`,
/// `failed`): spelled only there.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, strum::IntoStaticStr, strum::EnumString,
)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub(crate) enum Status {
    /// The answer is whole and claimed.
    Complete,
    /// The answer went out, but not all of it can be claimed (calls left out, a failure open,
    /// a value not read again): the reason says why.
    Partial,
    /// No answer could be had.
    Failed,
}

impl Status {
    /// The status's name.
    pub(crate) fn as_str(self) -> &'static str {
        self.into()
    }
}

pub(crate) fn selfheal_report(
    state: &Mutex<RunState>,
    status: Status,
    reason: Option<&str>,
    actions: &[Action],
) -> Value {
    let st = lock(state);
    json!({
        "status": status,
        "reason": reason,
        "failures": st.failures,
        "actions": actions,
        "budget": budget_json(&st),
    })
}

/// [`selfheal_report`] written as JSON text, without building a `Value`: the same keys and
/// values.
pub(crate) fn selfheal_report_bytes(
    state: &Mutex<RunState>,
    status: Status,
    reason: Option<&str>,
    actions: &[Action],
) -> Vec<u8> {
    let st = lock(state);
    let report = Report {
        actions,
        budget: BudgetReport {
            limits: LimitsReport(st.ledger().limits()),
            spent: st.ledger().spent(),
        },
        failures: st.failures,
        reason,
        status,
    };
    // About 330 bytes: one allocation, not a buffer grown from empty a field at a time.
    let mut out = Vec::with_capacity(512);
    match serde_json::to_writer(&mut out, &report) {
        Ok(()) => out,
        Err(_) => Vec::new(),
    }
}

/// The `selfheal` report as [`selfheal_report`] builds it, for writing straight to text.
#[derive(serde::Serialize)]
pub(crate) struct Report<'a> {
    pub(crate) actions: &'a [Action],
    pub(crate) budget: BudgetReport<'a>,
    pub(crate) failures: u64,
    pub(crate) reason: Option<&'a str>,
    pub(crate) status: Status,
}

#[derive(serde::Serialize)]
pub(crate) struct BudgetReport<'a> {
    pub(crate) limits: LimitsReport<'a>,
    pub(crate) spent: &'a selfheal_core::Amounts,
}

/// [`limits_json`] as a serializer: an unlimited dimension is `null`.
pub(crate) struct LimitsReport<'a>(&'a BudgetLimits);

impl serde::Serialize for LimitsReport<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = s.serialize_map(Some(Dimension::ALL.len()))?;
        for d in Dimension::ALL {
            let v = self.0.get(d);
            map.serialize_entry(&d, &(v != u64::MAX).then_some(v))?;
        }
        map.end()
    }
}

/// Budget limits for clients: an unlimited dimension is `null`, not `u64::MAX`, which
/// JavaScript cannot even read exactly.
pub(crate) fn limits_json(limits: &BudgetLimits) -> Value {
    Value::Object(
        Dimension::ALL
            .into_iter()
            .map(|d| {
                let v = limits.get(d);
                (d.to_string(), (v != u64::MAX).then_some(v).into())
            })
            .collect(),
    )
}

/// A chat request's `request` event (fields in the order `json!` would sort them, so the
/// trace reads as it did when these were maps).
#[derive(serde::Serialize)]
pub(crate) struct RequestDetail<'a> {
    pub(crate) messages: usize,
    pub(crate) model: &'a str,
    pub(crate) stream: bool,
    pub(crate) tenant: &'a str,
}

/// A `tool_result` event.
#[derive(serde::Serialize)]
pub(crate) struct ToolResultDetail<'a> {
    pub(crate) outcome: crate::recover::Outcome,
    pub(crate) tool: &'a str,
}

pub(crate) fn tool_result_detail(r: &heal::Replayed) -> Detail {
    Detail::of(&ToolResultDetail {
        outcome: r.outcome,
        tool: &r.tool,
    })
}

/// A `response` event.
#[derive(serde::Serialize)]
pub(crate) struct ResponseDetail {
    pub(crate) status: Status,
}

pub(crate) fn add_headers(
    resp: &mut Response,
    run: &str,
    status: Status,
    actions: &[Action],
    reason: Option<&str>,
) {
    let h = resp.headers_mut();
    let mut put = |name: &'static str, value: String| {
        // The common case, a value that is already clean, goes in as it is.
        if value.len() <= 512 && value.bytes().all(|b| b.is_ascii() && !b.is_ascii_control()) {
            if let Ok(v) = HeaderValue::try_from(value) {
                h.insert(HeaderName::from_static(name), v);
            }
            return;
        }
        let clean: String = value
            .chars()
            .map(|c| {
                if c.is_ascii() && !c.is_ascii_control() {
                    c
                } else {
                    '?'
                }
            })
            .take(512)
            .collect();
        if let Ok(v) = HeaderValue::from_str(&clean) {
            h.insert(HeaderName::from_static(name), v);
        }
    };
    put("x-selfheal-run", run.to_owned());
    put("x-selfheal-status", status.as_str().to_owned());
    put("x-selfheal-actions", joined(actions));
    if let Some(r) = reason {
        put("x-selfheal-reason", r.to_owned());
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::recover::Outcome;

    /// The typed statuses and outcomes are spelled, where they are written out (the report,
    /// the headers, the trace), as the wire always spelled them, and read back from it.
    #[test]
    fn statuses_and_outcomes_are_spelled_as_on_the_wire() {
        for (status, name) in [
            (Status::Complete, "complete"),
            (Status::Partial, "partial"),
            (Status::Failed, "failed"),
        ] {
            assert_eq!(status.as_str(), name);
            assert_eq!(serde_json::to_value(status).unwrap(), json!(name));
            assert_eq!(name.parse::<Status>().unwrap(), status);
        }
        assert!("completed".parse::<Status>().is_err());
        for (outcome, name, failed) in [
            (Outcome::Ok, "ok", false),
            (Outcome::Hard, "hard", true),
            (Outcome::Soft, "soft", true),
            (Outcome::Check, "check", false),
            (Outcome::Held, "held", false),
        ] {
            assert_eq!(serde_json::to_value(outcome).unwrap(), json!(name));
            assert_eq!(outcome.failed(), failed, "{name}");
        }
    }
}
