//! The `heat-via-node` handler: the PEP's path. The broker agent does not
//! talk to Heat; it asks a node agent to send the Heat signal with the
//! node's own credentials (the cfn-push-stats role of the PEP).
//!
//! For each request the handler subscribes to `event.<node>`, then
//! publishes a signed `cmd.heat_signal` (`{"action", "reason"}`, and the
//! request's leader `epoch` when not 0) on
//! `cmd.<node>` with `corr` = `<op>/<action>` and an expiry of
//! `command_ttl`, and waits up to `node_timeout` for that node's
//! `event.done` (success) or `event.failed` / `event.refused` naming the
//! command's id. A node that does not answer in time is skipped and the
//! next one asked, up to `max_nodes_tried`.
//!
//! - add a node: `scale_up_action` (default `scale_up`) on an active node
//!   of the group (from the broker agent's fleet view). The node confirms
//!   that Heat started scaling (Heat answers 200 to signals it then
//!   ignores) and answers `event.failed` when Heat ignored it;
//! - remove exactly this node (`mark_unhealthy_first`, the default):
//!   `mark_unhealthy` on the node being removed itself. Only it knows its
//!   group member; it marks it and then sends the stack update that makes
//!   Heat drop exactly it (node `[heat] mark_unhealthy_removes`, default
//!   on). No scale-down signal follows: after a mark, a scale-down signal
//!   removes the marked member *and* the oldest healthy one (measured on
//!   Heat 27). Without `mark_unhealthy_first`, `scale_down_action` (default
//!   `scale_down`) on that node or another active one: Heat then picks the
//!   victim (failed members first, then the oldest).
//!
//! `event.failed` maps by its fields: `retryable` with HTTP 409 is `Busy`,
//! other `retryable` ones `Transient`, the rest `Permanent`; a reason naming
//! a quota (Heat's documented phrases) is `Quota`. `event.refused` (bad
//! signature, expired) is `Permanent`: other nodes would refuse it too.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use gearshift_bus::{OutMessage, SharedBus};
use gearshift_proto::msg::{HeatAction, HeatSignal};
use gearshift_proto::sign::TimePolicy;
use gearshift_proto::{Envelope, Expect, Gate, KeyPair, Keyring, Kind, Message, routing};

use crate::config::HeatViaNodeConfig;
use crate::{
    BuildError, CreateOutcome, CreateRequest, FleetView, GroupKey, Handler, HandlerContext,
    HandlerError, RemoveOutcome, RemoveRequest,
};

/// Asks node agents to signal Heat.
pub struct HeatViaNodeHandler {
    cfg: HeatViaNodeConfig,
    bus: SharedBus,
    signer: Arc<KeyPair>,
    keyring: Option<Arc<Keyring>>,
    agent: String,
    fleet: Arc<dyn FleetView>,
}

impl std::fmt::Debug for HeatViaNodeHandler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeatViaNodeHandler")
            .field("cfg", &self.cfg)
            .field("agent", &self.agent)
            .finish_non_exhaustive()
    }
}

/// How one node answered.
enum Answer {
    Done(String),
    Error(HandlerError),
    Silent,
}

impl HeatViaNodeHandler {
    /// Needs the context's bus and signing key.
    pub fn new(cfg: HeatViaNodeConfig, ctx: &HandlerContext) -> Result<Self, BuildError> {
        cfg.validate()?;
        Ok(HeatViaNodeHandler {
            bus: ctx
                .bus
                .clone()
                .ok_or_else(|| BuildError::Setup("heat-via-node needs the bus".into()))?,
            signer: ctx.signer.clone().ok_or_else(|| {
                BuildError::Setup("heat-via-node needs the broker's signing key".into())
            })?,
            keyring: ctx.keyring.clone(),
            agent: ctx.agent.clone(),
            fleet: ctx.fleet.clone(),
            cfg,
        })
    }

    async fn ask(
        &self,
        node: &str,
        action: HeatAction,
        reason: &str,
        op: &str,
        epoch: u64,
    ) -> Result<Answer, HandlerError> {
        let transient = |e: gearshift_bus::BusError| HandlerError::Transient(format!("bus: {e}"));
        // Subscribe first, so the answer cannot slip by before we listen.
        let mut events = self
            .bus
            .subscribe(&routing::event(node))
            .await
            .map_err(transient)?;
        let env = Envelope::new(
            self.agent.clone(),
            HeatSignal {
                action,
                reason: reason.to_string(),
                epoch,
            },
        )
        .with_corr(format!("{op}/{}", action.as_str()))
        .with_ttl(self.cfg.command_ttl);
        let id = env.id;
        let bytes = self.signer.seal(env);
        self.bus
            .publish(OutMessage::new(routing::command(node), bytes))
            .await
            .map_err(transient)?;
        tracing::info!(%node, action = action.as_str(), cmd = %id, %op, "asked the node to signal Heat");
        let deadline = tokio::time::Instant::now() + self.cfg.node_timeout;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                return Ok(Answer::Silent);
            }
            let delivery = match events.next_timeout(left).await {
                Ok(Some(d)) => d,
                Ok(None) => {
                    return Err(HandlerError::Transient(
                        "the bus closed while waiting for the node".into(),
                    ));
                }
                Err(_) => return Ok(Answer::Silent),
            };
            let Some(msg) = self.admit(node, &delivery.payload) else {
                continue;
            };
            if let Some(answer) = answer_to(node, id, action, msg) {
                return Ok(answer);
            }
        }
    }

    /// The message of a verified event of `node` in `payload`; `None` for
    /// anything else on its event key (logged when refused).
    fn admit(&self, node: &str, payload: &[u8]) -> Option<Message> {
        let decoded = match Envelope::decode(payload) {
            Ok(d) => d,
            Err(e) => {
                tracing::warn!(%node, error = %e, "undecodable message on the node's event key; ignored");
                return None;
            }
        };
        if decoded.envelope.from != node {
            return None;
        }
        let envelope = match &self.keyring {
            Some(kr) => match Gate::new(kr, TimePolicy::default()).admit_decoded(
                decoded,
                Expect::kinds(Kind::is_node_event),
                chrono::Utc::now(),
            ) {
                Ok(a) => a.envelope,
                Err(r) => {
                    tracing::warn!(%node, reason = r.reason, detail = %r.detail, "node event refused; ignored");
                    return None;
                }
            },
            None => decoded.envelope,
        };
        Some(envelope.msg)
    }

    /// Asks `candidates` in turn until one answers.
    async fn ask_any(
        &self,
        candidates: &[String],
        action: HeatAction,
        reason: &str,
        op: &str,
        epoch: u64,
    ) -> Result<String, HandlerError> {
        if candidates.is_empty() {
            return Err(HandlerError::Transient(
                "no active node in the group to send the Heat signal".into(),
            ));
        }
        let mut silent = Vec::new();
        for node in candidates.iter().take(self.cfg.max_nodes_tried as usize) {
            match self.ask(node, action, reason, op, epoch).await? {
                Answer::Done(d) => return Ok(d),
                Answer::Error(e) => return Err(e),
                Answer::Silent => {
                    tracing::warn!(%node, action = action.as_str(), "node did not answer in time; trying another");
                    silent.push(node.clone());
                }
            }
        }
        Err(HandlerError::Transient(format!(
            "no node answered cmd.heat_signal {} within {:?} (asked {})",
            action.as_str(),
            self.cfg.node_timeout,
            silent.join(", ")
        )))
    }

    fn candidates(&self, group: &GroupKey, first: Option<&str>) -> Vec<String> {
        let mut out: Vec<String> = first.map(|n| vec![n.to_string()]).unwrap_or_default();
        for n in self.fleet.active_nodes(group) {
            if !out.contains(&n) {
                out.push(n);
            }
        }
        out
    }

    /// The configured wait per node.
    pub fn node_timeout(&self) -> Duration {
        self.cfg.node_timeout
    }
}

#[async_trait]
impl Handler for HeatViaNodeHandler {
    fn kind(&self) -> &'static str {
        "heat-via-node"
    }

    async fn create_node(&self, req: &CreateRequest) -> Result<CreateOutcome, HandlerError> {
        let reason = format!(
            "gearshift: scale up {} in district {} (op {})",
            req.group.profile, req.group.district, req.op
        );
        let nodes = self.candidates(&req.group, None);
        let detail = self
            .ask_any(
                &nodes,
                self.cfg.scale_up_action,
                &reason,
                &req.op,
                req.epoch,
            )
            .await?;
        Ok(CreateOutcome {
            node: None,
            cloud_id: None,
            detail,
        })
    }

    async fn remove_node(&self, req: &RemoveRequest) -> Result<RemoveOutcome, HandlerError> {
        let reason = format!(
            "gearshift: {} drained for removal (op {})",
            req.node, req.op
        );
        if self.cfg.mark_unhealthy_first {
            let mark = HeatAction::MarkUnhealthy;
            // Only the node itself knows its group member; marking it and the
            // update that follows remove exactly it.
            return match self
                .ask(&req.node, mark, &reason, &req.op, req.epoch)
                .await?
            {
                Answer::Done(detail) => Ok(RemoveOutcome {
                    detail,
                    gone: false,
                }),
                Answer::Error(e) => Err(e),
                Answer::Silent => Err(HandlerError::Transient(format!(
                    "{} did not answer cmd.heat_signal {} within {:?}",
                    req.node,
                    mark.as_str(),
                    self.cfg.node_timeout
                ))),
            };
        }
        let nodes = self.candidates(&req.group, Some(&req.node));
        let detail = self
            .ask_any(
                &nodes,
                self.cfg.scale_down_action,
                &reason,
                &req.op,
                req.epoch,
            )
            .await?;
        Ok(RemoveOutcome {
            detail,
            gone: false,
        })
    }
}

/// What `msg` answers to command `id` (asking the node for `action`), if
/// it is the node's answer to it.
fn answer_to(node: &str, id: uuid::Uuid, action: HeatAction, msg: Message) -> Option<Answer> {
    match msg {
        Message::Done(d) if d.cmd == id => Some(Answer::Done(format!("{node}: {:?}", d.result))),
        Message::Failed(f) if f.cmd == id => {
            let msg = format!(
                "{node} could not signal Heat ({}): {}",
                action.as_str(),
                f.error
            );
            let err = if gearshift_cloud::error::heat_reason_names_quota(&f.error) {
                HandlerError::Quota(msg)
            } else if f.retryable && f.http_status == Some(409) {
                HandlerError::Busy(msg)
            } else if f.retryable {
                HandlerError::Transient(msg)
            } else {
                HandlerError::Permanent(msg)
            };
            Some(Answer::Error(err))
        }
        Message::Refused(r) if r.cmd == Some(id) => {
            Some(Answer::Error(HandlerError::Permanent(format!(
                "{node} refused cmd.heat_signal ({}): {}",
                r.reason, r.detail
            ))))
        }
        _ => None,
    }
}
