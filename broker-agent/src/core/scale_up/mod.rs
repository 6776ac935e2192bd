//! The scale-up operation: ask the cloud for one node, wait for it, and
//! add it to its district.
//!
//! `Preflight -> Requesting -> Booting -> [Adding -> Districting ->] Joined`,
//! or it ends `Failed` / `TimedOut`; `join.rs` holds the district part (a
//! node that reports undistricted is added with `add-node`, and joins once
//! its report shows the district); `claim.rs` which operation a report
//! belongs to (its operation id, or the first new node of the group); `Checking` asks the handler whether a request whose outcome
//! is unknown reached the cloud (a create is never sent twice on a doubt),
//! and `Waiting` delays a retry while the cloud is busy.
//!
//! [`ScaleUp::step`] is the machine: `(state, input, now) -> (state,
//! effects)`. It knows nothing of other operations or of the fleet; what a
//! failure or a join means for the group (backoff, exhaustion, cooldowns) is
//! its [`UpOutcome`], which the coordinator hands to the group's trackers.

use chrono::{DateTime, Utc};
use gearshift_handlers::{Capacity, CreateOutcome, CreateRequest, GroupKey, HandlerError, Lookup};
use gearshift_proto::msg::DecisionKind;
use serde::{Deserialize, Serialize};

use crate::config::BrokerConfig;
use crate::core::actions::{CallResult, Effect, HandlerCall, Note, Out, PaasCall, dur};
use crate::ops::OpId;

mod claim;
mod join;

pub use claim::claim;
pub use join::{Match, Sighting};

/// A scale-up saga.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScaleUp {
    /// Where it is.
    pub step: UpStep,
    /// Create requests made (1 for the first).
    pub attempt: u32,
    /// The new node's name, when the handler or the join told.
    pub node: Option<String>,
    /// The cloud's id of the new node.
    pub cloud_id: Option<String>,
    /// When the (last) create request was accepted or became uncertain.
    pub requested_at: Option<DateTime<Utc>>,
    /// The last thing the handler (or add-node) said.
    pub detail: String,
    /// When its node first reported (the district join's deadline runs from here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seen_at: Option<DateTime<Utc>>,
    /// How its node was matched to it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub matched: Option<Match>,
    /// add-node requests made.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub add_attempts: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// Steps of a scale-up.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "step", rename_all = "snake_case")]
pub enum UpStep {
    /// Asking the handler how much capacity is left.
    Preflight,
    /// The create request is (or may be) in flight. Journaled before the call.
    Requesting,
    /// Asking the handler whether an earlier request reached the cloud.
    Checking,
    /// Waiting before another create request (the cloud was busy).
    Waiting {
        /// When to ask again.
        until: DateTime<Utc>,
    },
    /// The node is being built; waiting for its first report.
    Booting {
        /// The handler could not tell whether the request reached the cloud.
        uncertain: bool,
    },
    /// The node reported undistricted: `add-node` to the target district is
    /// (or may be) in flight. Journaled before the call.
    Adding {
        /// When to ask again after a retryable failure (`None`: in flight).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        retry_at: Option<DateTime<Utc>>,
    },
    /// The node is in the target district for OpenShift (or, with `[paas]
    /// kind = "none"`, waits to be added outside gearshift): waiting for its
    /// report to show the district.
    Districting,
    /// The node reported in the target district.
    Joined,
    /// The request failed.
    Failed {
        /// `quota`, `busy`, `transient`, `permanent` or `aborted`.
        kind: String,
        /// What went wrong.
        error: String,
    },
    /// The node never reported within the provision timeout.
    TimedOut,
}

impl UpStep {
    /// Whether this is an end state.
    pub fn is_terminal(&self) -> bool {
        matches!(
            self,
            UpStep::Joined | UpStep::Failed { .. } | UpStep::TimedOut
        )
    }

    /// Short name.
    pub fn name(&self) -> &'static str {
        match self {
            UpStep::Preflight => "preflight",
            UpStep::Requesting => "requesting",
            UpStep::Checking => "checking",
            UpStep::Waiting { .. } => "waiting",
            UpStep::Booting { .. } => "booting",
            UpStep::Adding { .. } => "adding",
            UpStep::Districting => "districting",
            UpStep::Joined => "joined",
            UpStep::Failed { .. } => "failed",
            UpStep::TimedOut => "timed_out",
        }
    }
}

/// What a scale-up is told.
#[derive(Debug, Clone, PartialEq)]
pub enum UpInput {
    /// Just decided: ask for capacity first.
    Start,
    /// The answer to its latest handler call.
    Result(CallResult),
    /// Time passed (provision timeout, end of a wait).
    Tick,
    /// The agent restarted: re-issue the effect of the current step.
    Resume,
    /// Its node reported (matched by the coordinator: its operation id, or
    /// the first new node of the group).
    Report(Sighting),
    /// An operator aborted it.
    Abort {
        /// Who.
        by: String,
    },
}

/// What a scale-up's end means for its group.
#[derive(Debug, Clone, PartialEq)]
pub enum UpOutcome {
    /// The node joined: the failures are over.
    Joined,
    /// The cloud refused or failed: backoff, and exhaustion on quota errors.
    Failed(HandlerError),
    /// The node never reported: a failure too.
    TimedOut,
    /// The node never reported, and the create request may never have
    /// reached the cloud: the process that made it stopped before the
    /// answer, and the handler cannot look it up (`exec`). Not a cloud
    /// failure: no backoff, so the next evaluation asks again at once.
    Lost,
}

/// What a scale-up reads besides its own state.
#[derive(Debug, Clone, Copy)]
pub struct UpCtx<'a> {
    /// Its id.
    pub op: &'a OpId,
    /// Its group.
    pub group: &'a GroupKey,
    /// When it was decided (the provision timeout runs from here when no
    /// request time is known).
    pub created: DateTime<Utc>,
    /// Attempts, waits and timeouts; the group's shape.
    pub cfg: &'a BrokerConfig,
}

type UpOut = Out<UpOutcome>;

impl ScaleUp {
    /// A scale-up just decided (its first step is the pre-flight check).
    pub fn new() -> ScaleUp {
        ScaleUp {
            step: UpStep::Preflight,
            attempt: 0,
            node: None,
            cloud_id: None,
            requested_at: None,
            detail: String::new(),
            seen_at: None,
            matched: None,
            add_attempts: 0,
        }
    }

    /// The machine.
    pub fn step(&mut self, cx: &UpCtx<'_>, input: UpInput, now: DateTime<Utc>) -> UpOut {
        match input {
            UpInput::Start => preflight(cx),
            UpInput::Result(r) => self.on_result(cx, r, now),
            UpInput::Tick => self.on_tick(cx, now),
            UpInput::Resume => match self.step {
                UpStep::Preflight => preflight(cx),
                UpStep::Requesting | UpStep::Checking => self.check(cx),
                // add-node is idempotent: a repeat answers "already so".
                UpStep::Adding { retry_at: None } => self.add(cx),
                _ => Out::none(),
            },
            UpInput::Report(s) => self.sighted(cx, s, now),
            UpInput::Abort { by } => {
                self.step = UpStep::Failed {
                    kind: "aborted".into(),
                    error: format!("operator {by} aborted it"),
                };
                Out::touched()
            }
        }
    }

    fn on_result(&mut self, cx: &UpCtx<'_>, r: CallResult, now: DateTime<Utc>) -> UpOut {
        match (&self.step, r) {
            (UpStep::Preflight, CallResult::Capacity(r)) => match r {
                Ok(Capacity {
                    nodes_available: Some(0),
                    detail,
                }) => self.failed(HandlerError::Quota(format!("pre-flight: {detail}"))),
                Err(e) if e.is_quota() => self.failed(e),
                Ok(_) | Err(_) => self.request(cx),
            },
            (UpStep::Requesting, CallResult::Create(r)) => match r {
                Ok(o) => self.booting(Some(o), false, now),
                Err(HandlerError::Transient(e)) => {
                    // The request may or may not have reached the cloud: ask.
                    tracing::warn!(
                        op = %cx.op,
                        error = e,
                        "create-node outcome unknown; looking it up"
                    );
                    self.check(cx)
                }
                Err(HandlerError::Busy(e)) => self.retry_later(cx, e, now),
                Err(e) => self.failed(e),
            },
            (UpStep::Checking, CallResult::Lookup(r)) => match r {
                Ok(Lookup::Found(o)) => self.booting(Some(o), false, now),
                Ok(Lookup::NotFound) if self.attempt >= cx.cfg.saga.create_attempts => {
                    self.failed(HandlerError::Transient(format!(
                        "no node after {} create requests",
                        self.attempt
                    )))
                }
                Ok(Lookup::NotFound) => self.request(cx),
                // Cannot tell: never ask twice; wait for the join or the provision timeout.
                Ok(Lookup::Unknown) | Err(_) => self.booting(None, true, now),
            },
            (
                UpStep::Adding { retry_at: None },
                CallResult::Paas {
                    call: PaasCall::AddNode { .. },
                    outcome,
                },
            ) => self.on_added(cx, outcome, now),
            _ => Out::none(),
        }
    }

    fn on_tick(&mut self, cx: &UpCtx<'_>, now: DateTime<Utc>) -> UpOut {
        match &self.step {
            UpStep::Booting { .. } => {
                let since = self.requested_at.unwrap_or(cx.created);
                if now - since >= dur(cx.cfg.policy.provision_timeout) {
                    return self.timed_out(cx);
                }
                Out::none()
            }
            UpStep::Waiting { until } if now >= *until => self.request(cx),
            UpStep::Adding { .. } | UpStep::Districting => self.district_tick(cx, now),
            _ => Out::none(),
        }
    }

    /// Journals `Requesting` and issues the create call.
    fn request(&mut self, cx: &UpCtx<'_>) -> UpOut {
        self.step = UpStep::Requesting;
        self.attempt += 1;
        Out::effect(Effect::Call(HandlerCall::Create(CreateRequest {
            op: cx.op.to_string(),
            group: cx.group.clone(),
            shape: cx.cfg.group(cx.group).shape,
            attempt: self.attempt,
            epoch: 0,
        })))
    }

    fn check(&mut self, cx: &UpCtx<'_>) -> UpOut {
        self.step = UpStep::Checking;
        Out::effect(Effect::Call(HandlerCall::Lookup {
            op: cx.op.clone(),
            group: cx.group.clone(),
        }))
    }

    fn retry_later(&mut self, cx: &UpCtx<'_>, why: String, now: DateTime<Utc>) -> UpOut {
        if self.attempt >= cx.cfg.saga.create_attempts {
            return self.failed(HandlerError::Busy(why));
        }
        self.step = UpStep::Waiting {
            until: now + dur(cx.cfg.saga.presence_poll),
        };
        self.detail = format!("cloud busy: {why}");
        Out::touched()
    }

    fn booting(&mut self, o: Option<CreateOutcome>, uncertain: bool, now: DateTime<Utc>) -> UpOut {
        self.step = UpStep::Booting { uncertain };
        self.requested_at = Some(now);
        if let Some(o) = o {
            self.node = o.node.or(self.node.take());
            self.cloud_id = o.cloud_id.or(self.cloud_id.take());
            self.detail = o.detail;
        } else if uncertain {
            self.detail = "the handler cannot tell whether the request reached the cloud; waiting for the node".into();
        }
        Out::touched()
    }

    fn failed(&mut self, e: HandlerError) -> UpOut {
        self.step = UpStep::Failed {
            kind: e.label().to_string(),
            error: e.to_string(),
        };
        let decide = Effect::Decide(Note {
            kind: DecisionKind::HandlerFailed,
            node: None,
            reason: format!("create-node failed ({}): {e}", e.label()),
            stats: true,
        });
        Out {
            outcome: Some(UpOutcome::Failed(e)),
            ..Out::effect(decide)
        }
    }

    fn timed_out(&mut self, cx: &UpCtx<'_>) -> UpOut {
        let uncertain = matches!(self.step, UpStep::Booting { uncertain: true });
        self.step = UpStep::TimedOut;
        let mut reason = format!(
            "no node reported for {} within the provision timeout ({})",
            cx.op,
            humantime::format_duration(cx.cfg.policy.provision_timeout)
        );
        if uncertain {
            reason.push_str(
                "; its create request may never have reached the cloud (the agent that made it \
                 stopped, and the handler cannot look it up): no backoff",
            );
        }
        let decide = Effect::Decide(Note {
            kind: DecisionKind::ProvisionTimeout,
            node: None,
            reason,
            stats: true,
        });
        Out {
            outcome: Some(if uncertain {
                UpOutcome::Lost
            } else {
                UpOutcome::TimedOut
            }),
            ..Out::effect(decide)
        }
    }
}

impl Default for ScaleUp {
    fn default() -> Self {
        ScaleUp::new()
    }
}

/// The pre-flight capacity check.
fn preflight(cx: &UpCtx<'_>) -> UpOut {
    Out::effect(Effect::Call(HandlerCall::Capacity {
        group: cx.group.clone(),
        shape: cx.cfg.group(cx.group).shape,
    }))
}

#[cfg(test)]
mod tests;
