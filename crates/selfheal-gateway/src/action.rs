//! The healing actions a turn reports, typed. An answer's `selfheal.actions`, its
//! `x-selfheal-actions` header and the run's remembered actions all list them; they are spelled
//! only where they are written out (serde and strum, in `snake_case`), as the wire always spelled
//! them, so reports and traces read as they did when they were strings. The spellings are the
//! ones `docs/reference/report.md` documents (a test holds the two together).

use selfheal_core::{ActionKind, EventKind};

/// One healing action of a turn.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    serde::Serialize,
    serde::Deserialize,
    strum::IntoStaticStr,
    strum::EnumString,
    strum::EnumIter,
)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub(crate) enum Action {
    /// A call sent again to the same target after a backoff.
    Retry,
    /// An upstream call moved to the chain's next target (its own failures, or its breaker).
    Fallback,
    /// An upstream skipped while its circuit is open.
    CooldownSkip,
    /// The ladder's escalation: the request goes to the chain's fallback model.
    Escalate,
    /// A tool call's arguments repaired (JSON repair, schema coercion).
    Repair,
    /// Tool calls the model wrote as text, taken as calls.
    Salvage,
    /// The model asked again for calls that could not be used.
    Reask,
    /// A stream that broke before any content asked again.
    Reissue,
    /// The model asked to read its unconfirmed values once more before answering.
    Reread,
    /// The client set no output limit; the gateway set `[limits] default_max_tokens` upstream.
    Cap,
    /// The model's output degenerated (a run of whitespace, one piece repeated) and the
    /// upstream was cut off.
    Cut,
    /// Guidance added to the conversation.
    Guidance,
    /// Tools hidden from the model.
    Hide,
    /// The model call held until the delay of a tool's retry (its backoff or `Retry-After`)
    /// had passed: the agent calls the tool again only after that answer.
    Wait,
    /// A failed tool replaced by an equivalent one (the controller's recovery).
    Substitute,
    /// The plan rebuilt from the current state (the controller's recovery).
    Replan,
    /// Stale context fetched again (the controller's recovery).
    Refresh,
    /// The run ended with what it has.
    Degrade,
    /// The run stopped (the controller's abort, or the monitor's failure-rate rule).
    Terminate,
}

impl Action {
    /// The action's name, as the report, the headers and the trace spell it.
    pub(crate) fn as_str(self) -> &'static str {
        self.into()
    }

    /// The action a call event of the upstream client's log reports (`retry`, `fallback`,
    /// `cooldown_skip`); `None` for a kind that is not one.
    pub(crate) fn of_call_event(kind: EventKind) -> Option<Action> {
        match kind {
            EventKind::Retry => Some(Action::Retry),
            EventKind::Fallback => Some(Action::Fallback),
            EventKind::CooldownSkip => Some(Action::CooldownSkip),
            _ => None,
        }
    }
}

impl From<ActionKind> for Action {
    fn from(kind: ActionKind) -> Action {
        match kind {
            ActionKind::Retry => Action::Retry,
            ActionKind::Repair => Action::Repair,
            ActionKind::Substitute => Action::Substitute,
            ActionKind::Replan => Action::Replan,
            ActionKind::Refresh => Action::Refresh,
            ActionKind::Escalate => Action::Escalate,
            ActionKind::Degrade => Action::Degrade,
            ActionKind::Terminate => Action::Terminate,
        }
    }
}

/// Adds `action` to `actions` unless it is there already.
pub(crate) fn push_once(actions: &mut Vec<Action>, action: Action) {
    if !actions.contains(&action) {
        actions.push(action);
    }
}

/// `actions` as the `x-selfheal-actions` header lists them (comma-separated).
pub(crate) fn joined(actions: &[Action]) -> String {
    let mut out = String::with_capacity(actions.len() * 8);
    for (i, a) in actions.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(a.as_str());
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use strum::IntoEnumIterator;

    /// The names in backquotes in the `actions` row of the report reference.
    fn documented() -> Vec<String> {
        let doc = include_str!("../../../docs/reference/report.md");
        let row = doc
            .lines()
            .find(|l| l.starts_with("| `actions` |"))
            .expect("the report reference has an `actions` row");
        let meaning = row.splitn(4, '|').nth(3).unwrap_or("");
        meaning
            .split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_owned)
            .collect()
    }

    /// Every action is documented under the name it is written as, and every documented name
    /// is an action: the reference and the code cannot drift apart.
    #[test]
    fn the_spellings_agree_with_the_report_reference() {
        let documented = documented();
        for action in Action::iter() {
            let name = action.as_str();
            assert!(
                documented.iter().any(|d| d == name),
                "`{name}` is not in docs/reference/report.md: {documented:?}"
            );
            assert_eq!(serde_json::to_value(action).unwrap(), name);
            assert_eq!(name.parse::<Action>().unwrap(), action);
            let back: Action = serde_json::from_value(serde_json::json!(name)).unwrap();
            assert_eq!(back, action);
        }
        for name in &documented {
            assert!(
                name.parse::<Action>().is_ok(),
                "docs/reference/report.md documents `{name}`, which is no action"
            );
        }
    }

    #[test]
    fn the_cores_kinds_keep_their_names() {
        for kind in ActionKind::ALL {
            assert_eq!(Action::from(kind).as_str(), kind.as_str());
        }
        for kind in [
            EventKind::Retry,
            EventKind::Fallback,
            EventKind::CooldownSkip,
        ] {
            assert_eq!(Action::of_call_event(kind).unwrap().as_str(), kind.as_str());
        }
        assert_eq!(Action::of_call_event(EventKind::Request), None);
        assert_eq!(joined(&[Action::Retry, Action::Fallback]), "retry,fallback");
        assert_eq!(joined(&[]), "");
    }
}
