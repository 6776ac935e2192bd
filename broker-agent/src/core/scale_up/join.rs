//! The end of a scale-up, inside OpenShift: the new node reported; it joins
//! the target district (`add-node`, checked first as add-node checks it),
//! and the operation counts as joined only once the node's own report shows
//! that district.
//!
//! `Booting -> Adding -> Districting -> Joined`; a node already in the
//! target district (or a group without districts) joins at once; a node
//! that cannot be added ends the operation `Failed` with the reason.

use chrono::{DateTime, Utc};
use gearshift_handlers::HandlerError;
use gearshift_proto::msg::{DecisionKind, NodeReport};
use gearshift_proto::routing::NO_DISTRICT;
use serde::{Deserialize, Serialize};

use super::{ScaleUp, UpCtx, UpOut, UpOutcome, UpStep};
use crate::core::actions::PaasCall;
use crate::core::actions::{Effect, Note, Out, dur};
use crate::paas::Outcome;
use crate::paas::PaasKind;

/// How a reporting node was matched to its scale-up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Match {
    /// Its report carried the operation id (`booted_for`, from its user data).
    OperationId,
    /// The handler cannot pass the operation id (Heat signal, Magnum,
    /// heat-via-node, email, spool, log): the first node never seen before
    /// that reported in the group within the provision window took the
    /// oldest open scale-up of the group.
    FirstNewNode,
}

impl Match {
    /// How it was matched, for the decision's reason.
    pub fn describe(self) -> &'static str {
        match self {
            Match::OperationId => "matched by the operation id in its report",
            Match::FirstNewNode => {
                "matched as the first new node of the group within the provision window (its handler cannot pass the operation id)"
            }
        }
    }
}

/// What a scale-up reads of its node's report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sighting {
    /// The node.
    pub node: String,
    /// Its profile.
    pub profile: String,
    /// Its district's UUID, when districted.
    pub district: Option<String>,
    /// Its gears (add-node needs none).
    pub gears: u32,
    /// How it was matched.
    pub matched: Match,
}

impl Sighting {
    /// The sighting in `r`.
    pub fn of(r: &NodeReport, matched: Match) -> Sighting {
        Sighting {
            node: r.node.clone(),
            profile: r.profile.clone(),
            district: r.district_uuid().map(str::to_string),
            gears: r.gears.total(),
            matched,
        }
    }
}

impl ScaleUp {
    /// Its node reported: the first time, place it in the district; later,
    /// join once the report shows the district.
    pub(super) fn sighted(&mut self, cx: &UpCtx<'_>, s: Sighting, now: DateTime<Utc>) -> UpOut {
        match &self.step {
            st if st.is_terminal() => Out::none(),
            UpStep::Adding { .. } | UpStep::Districting => {
                let mine = self.node.as_deref() == Some(s.node.as_str());
                if mine && s.district.as_deref() == Some(cx.group.district.as_str()) {
                    return self.joined(cx, &s);
                }
                Out::none()
            }
            _ => {
                self.node = Some(s.node.clone());
                self.seen_at = Some(now);
                self.matched = Some(s.matched);
                self.place(cx, &s)
            }
        }
    }

    /// The first report: joined, add-node, or why the node cannot be added.
    fn place(&mut self, cx: &UpCtx<'_>, s: &Sighting) -> UpOut {
        let target = cx.group.district.as_str();
        if target == NO_DISTRICT || s.district.as_deref() == Some(target) {
            return self.joined(cx, s);
        }
        let node = &s.node;
        if let Some(other) = &s.district {
            return self.add_failed(format!(
                "{node} reported in district {other}, not in the target district {target}"
            ));
        }
        // add-node's own checks (district.rb): the district's profile, no gears.
        if s.profile != cx.group.profile {
            return self.add_failed(format!(
                "cannot add {node} to district {target}: its profile {} is not the district's {} (profile_mismatch)",
                s.profile, cx.group.profile
            ));
        }
        if s.gears > 0 {
            return self.add_failed(format!(
                "cannot add {node} to district {target}: it holds {} gears, add-node needs an empty node (node_has_gears)",
                s.gears
            ));
        }
        match cx.cfg.paas.kind {
            PaasKind::OpenShift => self.add(cx),
            PaasKind::None => {
                self.step = UpStep::Districting;
                self.detail = format!(
                    "{node} reported undistricted; [paas] kind = \"none\": waiting for it to be added to district {target} outside gearshift"
                );
                Out::touched()
            }
        }
    }

    /// Journals `Adding` and asks for add-node.
    pub(super) fn add(&mut self, cx: &UpCtx<'_>) -> UpOut {
        let Some(node) = self.node.clone() else {
            return Out::none();
        };
        self.step = UpStep::Adding { retry_at: None };
        self.add_attempts += 1;
        self.detail = format!(
            "add-node {node} to district {} (attempt {})",
            cx.group.district, self.add_attempts
        );
        Out::effect(Effect::Paas(PaasCall::AddNode {
            district: cx.group.district.clone(),
            host: node,
            profile: cx.group.profile.clone(),
        }))
    }

    /// add-node's answer.
    pub(super) fn on_added(&mut self, cx: &UpCtx<'_>, o: Outcome, now: DateTime<Utc>) -> UpOut {
        let node = self.node.clone().unwrap_or_default();
        let target = &cx.group.district;
        if o.is_success() {
            self.step = UpStep::Districting;
            self.detail = format!(
                "add-node {node} to district {target}: {o}; waiting for its report to show the district"
            );
            return Out::touched();
        }
        if o.is_retryable() && self.add_attempts < cx.cfg.saga.command_attempts {
            self.step = UpStep::Adding {
                retry_at: Some(now + dur(cx.cfg.saga.presence_poll)),
            };
            self.detail = format!("add-node {node} to district {target}: {o}; trying again");
            return Out::touched();
        }
        self.add_failed(format!("add-node {node} to district {target}: {o}"))
    }

    /// Ticks while the node is being added: a retry due, or the node never
    /// showing the district within the provision timeout of its first report.
    pub(super) fn district_tick(&mut self, cx: &UpCtx<'_>, now: DateTime<Utc>) -> UpOut {
        let since = self.seen_at.unwrap_or(now);
        if now - since >= dur(cx.cfg.policy.provision_timeout) {
            return self.add_failed(format!(
                "{} did not report district {} within {} of its first report ({})",
                self.node.as_deref().unwrap_or("the node"),
                cx.group.district,
                humantime::format_duration(cx.cfg.policy.provision_timeout),
                self.detail
            ));
        }
        match self.step {
            UpStep::Adding { retry_at: Some(t) } if now >= t => self.add(cx),
            _ => Out::none(),
        }
    }

    /// The node cannot join the district: the operation fails, with why.
    fn add_failed(&mut self, why: String) -> UpOut {
        self.step = UpStep::Failed {
            kind: "district".into(),
            error: why.clone(),
        };
        self.detail = why.clone();
        let decide = Effect::Decide(Note {
            kind: DecisionKind::HandlerFailed,
            node: self.node.clone(),
            reason: format!("the new node cannot join its district: {why}"),
            stats: true,
        });
        Out {
            outcome: Some(UpOutcome::Failed(HandlerError::Permanent(why))),
            ..Out::effect(decide)
        }
    }

    fn joined(&mut self, cx: &UpCtx<'_>, s: &Sighting) -> UpOut {
        self.step = UpStep::Joined;
        let node = s.node.clone();
        let place = match s.district.as_deref() {
            Some(d) => format!(", in district {d}"),
            None => String::new(),
        };
        let reason = format!(
            "{node} reported{place}, booted for {} ({})",
            cx.op,
            s.matched.describe()
        );
        self.detail = reason.clone();
        Out {
            outcome: Some(UpOutcome::Joined),
            ..Out::effect(Effect::Decide(Note {
                kind: DecisionKind::Joined,
                node: Some(node),
                reason,
                stats: true,
            }))
        }
    }
}
