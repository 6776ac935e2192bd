//! The durable history: every decision, every saga step, each explanation
//! whose meaning changed and every operator request, appended as JSON lines
//! to `<state_dir>/history.jsonl`, rotated by size (`[history]`), read back
//! by `gearshift-broker history` without the bus and shown on the dashboard.
//!
//! It answers "what did the autoscaler do last Tuesday and why". It is a
//! record, not the agent's memory (that is the journal): a write that fails
//! is logged and the agent carries on.
//!
//! Layout: this file holds the records and the explanation filter;
//! `config.rs` `[history]`, `writer.rs` the rotating appender, `read.rs`
//! reading, filtering and printing.

pub mod config;
pub mod read;
pub mod writer;

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use gearshift_handlers::GroupKey;
use gearshift_proto::msg::{AdminRequest, Decision, Explanation, Outcome};
use gearshift_proto::routing::ALL;
use serde::{Deserialize, Serialize};

pub use self::config::HistoryConfig;
pub use self::read::{Filter, read};
pub use self::writer::{HistoryError, Sink, Writer};

/// One line of the history.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    /// When it happened (the broker agent's clock).
    pub at: DateTime<Utc>,
    /// What happened.
    #[serde(flatten)]
    pub event: Event,
}

/// What a history line records.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Event {
    /// A decision, as published.
    Decision(Decision),
    /// An explanation whose outcome or rule verdicts changed.
    Explanation(Explanation),
    /// An operation changed state.
    Saga(SagaStep),
    /// An operator's request and the answer.
    Operator(OperatorAct),
}

/// One state change of an operation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SagaStep {
    /// Operation id.
    pub op: String,
    /// `scale_up` or `scale_down`.
    pub kind: String,
    /// District.
    pub district: String,
    /// Profile.
    pub profile: String,
    /// The node, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// The state before; none when the operation was created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    /// The state now.
    pub to: String,
}

/// An operator's request and what the agent answered.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OperatorAct {
    /// Who asked (the request's `from`).
    pub by: String,
    /// The request.
    pub request: AdminRequest,
    /// Whether it was accepted.
    pub ok: bool,
    /// The answer.
    pub message: String,
}

impl Event {
    /// The node group concerned; `None` for the fleet as a whole.
    pub fn group(&self) -> Option<GroupKey> {
        let g = |d: &str, p: &str| {
            (d != ALL).then(|| GroupKey {
                district: d.to_string(),
                profile: p.to_string(),
            })
        };
        match self {
            Event::Decision(d) => g(&d.district, &d.profile),
            Event::Explanation(x) => g(&x.district, &x.profile),
            Event::Saga(s) => g(&s.district, &s.profile),
            Event::Operator(o) => match &o.request {
                AdminRequest::Pause {
                    district: Some(d),
                    profile: Some(p),
                    ..
                }
                | AdminRequest::Resume {
                    district: Some(d),
                    profile: Some(p),
                } => g(d, p),
                _ => None,
            },
        }
    }
}

/// The meaning of an explanation: its outcome and each rule's verdict
/// (details carry durations and figures that change every evaluation).
pub(crate) type Meaning = (Outcome, Vec<(String, bool)>);

/// The meaning of `x` (see [`Meaning`]).
pub(crate) fn meaning(x: &Explanation) -> Meaning {
    (
        x.outcome,
        x.reasons.iter().map(|r| (r.rule.clone(), r.ok)).collect(),
    )
}

/// Lets through the explanations whose meaning changed since the group's
/// last one that was let through.
#[derive(Debug, Default)]
pub struct ExplanationFilter {
    last: HashMap<(String, String), Meaning>,
}

impl ExplanationFilter {
    /// Whether `x` says something new about its group (and remembers it).
    pub fn changed(&mut self, x: &Explanation) -> bool {
        let meaning = meaning(x);
        let key = (x.district.clone(), x.profile.clone());
        if self.last.get(&key) == Some(&meaning) {
            return false;
        }
        self.last.insert(key, meaning);
        true
    }
}

#[cfg(test)]
mod tests;
