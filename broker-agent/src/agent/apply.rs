//! Carrying out the core's actions: journal first, then commands, handler
//! calls, decisions and explanations.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use gearshift_bus::OutMessage;
use gearshift_handlers::{Handler, HandlerError};
use gearshift_proto::msg::{Decision, Explanation, Message};
use gearshift_proto::{Envelope, routing};
use uuid::Uuid;

use super::{Agent, Observed, Result2, RunState};
use crate::core::{Action, CallResult, CallTag, Core, HandlerCall, PaasCall};
use crate::history::Event;
use crate::ops::OpId;
use crate::paas::{Outcome, PaasAdapter, PaasError};

impl Agent {
    /// Journals the core's changes, then carries out the actions.
    pub(super) async fn apply(
        &self,
        core: &mut Core,
        st: &mut RunState,
        acts: Vec<Action>,
        now: DateTime<Utc>,
    ) -> Result2<()> {
        let ch = core.take_changes();
        if !st.ha.leading() {
            // A standby decides nothing: what its warm fleet model would
            // do is dropped (the journal it loads at takeover is the truth).
            core.take_history();
            return Ok(());
        }
        if !ch.is_empty() {
            self.journal.commit(core, &ch)?;
            // Replicated before the effects, as journaled before them.
            if !self.replicate(core, st).await {
                st.ha.proof.replication_failed();
            }
        }
        st.record(core.take_history());
        if !st.ha.still_proven(self.bus.health().connected) {
            // Journaled, not carried out: whoever leads next (maybe this
            // agent again, once the election proved it) resumes them.
            tracing::warn!(
                effects = acts.len(),
                "leadership in doubt (the bus connection changed or the journal did not replicate): \
                 effects left to the next leader's resume"
            );
            return Ok(());
        }
        let changed = !acts.is_empty() || !ch.is_empty();
        let mut explanations = vec![];
        for a in acts {
            match a {
                Action::Call { tag, handler, call } => self.spawn_call(st, tag, handler, call),
                Action::Paas { op, call } => self.spawn_paas(st, op, call),
                Action::Explain(x) => {
                    if st.explained.admit(&x, now) {
                        st.record_event(now, Event::Explanation(x.clone()));
                        explanations.push(x);
                    }
                }
                Action::Decide(d) => {
                    st.record_event(now, Event::Decision(d.clone()));
                    self.decide(d, now).await;
                    if let Some(p) = st.pressure.take() {
                        let secs =
                            (Utc::now() - p).num_microseconds().unwrap_or(i64::MAX) as f64 / 1e6;
                        self.metrics.latency(secs.max(0.0));
                    }
                }
                Action::Send {
                    node,
                    corr,
                    id,
                    msg,
                } => self.send(&node, &corr, id, msg, now).await,
                Action::StaleEpoch(s) => self.on_stale_epoch(st, &s),
            }
        }
        // Explanations (those whose content changed, see `crate::explain`)
        // are best effort: after the decisions and commands, all in flight
        // at once.
        futures::future::join_all(explanations.into_iter().map(|x| self.explain(x, now))).await;
        if changed {
            st.status_dirty = true;
            self.publish_status(core, st, now, false);
        }
        Ok(())
    }

    /// `saga.handler_timeout`, or longer for a handler whose own waits (a
    /// server booting with its volume, a stack update) may legitimately last
    /// longer: timing such a call out early would make the saga retry a request
    /// the cloud is still carrying out.
    fn call_timeout(&self, handler: &str) -> std::time::Duration {
        let base = self.cfg.saga.handler_timeout;
        match self
            .cfg
            .handlers
            .get(handler)
            .and_then(|h| h.longest_call())
        {
            Some(longest) => base.max(longest + std::time::Duration::from_secs(30)),
            None => base,
        }
    }

    /// Calls the handler on a task; its answer (or its timeout) comes back
    /// through the results channel.
    fn spawn_call(&self, st: &mut RunState, tag: CallTag, handler: String, call: HandlerCall) {
        st.in_flight_calls += 1;
        let Some(h) = self.handlers.get(&handler).cloned() else {
            tracing::error!(handler, "no such handler");
            let res = call.failed(HandlerError::Permanent(format!(
                "no handler named {handler:?}"
            )));
            let _ = st.results_tx.send((tag, call.name(), res));
            return;
        };
        let timeout = self.call_timeout(&handler);
        let tx = st.results_tx.clone();
        tracing::info!(handler, call = call.name(), tag = ?tag, "handler call");
        self.tracker.spawn(async move {
            let name = call.name();
            let res = match tokio::time::timeout(timeout, run_call(h, call.clone())).await {
                Ok(r) => r,
                Err(_) => call.failed(HandlerError::Transient(format!(
                    "no answer within {}",
                    humantime::format_duration(timeout)
                ))),
            };
            let _ = tx.send((tag, name, res));
        });
    }

    /// Runs a PaaS command on a task; its outcome comes back through the
    /// results channel. The adapter bounds the command itself (`[paas]`
    /// timeouts); a command that cannot run answers a permanent failure.
    fn spawn_paas(&self, st: &mut RunState, op: OpId, call: PaasCall) {
        st.in_flight_calls += 1;
        let paas = self.paas.clone();
        let tx = st.results_tx.clone();
        tracing::info!(%op, call = call.name(), "paas call");
        self.tracker.spawn(async move {
            let outcome = match run_paas(&*paas, &call).await {
                Ok(o) => o,
                Err(e) => Outcome::from_error(&e),
            };
            let name = call.name();
            let _ = tx.send((CallTag::Paas(op), name, CallResult::Paas { call, outcome }));
        });
    }

    /// Publishes a signed command on `cmd.<node>`.
    async fn send(&self, node: &str, corr: &OpId, id: Uuid, msg: Message, now: DateTime<Utc>) {
        let kind = msg.kind();
        let mut e = Envelope::new_at(&self.cfg.agent.name, msg, now)
            .with_corr(corr.to_string())
            .with_ttl(self.cfg.saga.command_ttl);
        e.id = id;
        let m = OutMessage::new(routing::command(node), self.signer.seal(e));
        match self.bus.publish(m).await {
            Ok(()) => tracing::info!(node, op = %corr, %kind, cmd = %id, "command sent"),
            Err(e) => {
                tracing::warn!(node, op = %corr, %kind, error = %e, "command not sent; the step's timeout sends it again")
            }
        }
    }

    /// Publishes a decision and tells the observers.
    pub(super) async fn decide(&self, d: Decision, now: DateTime<Utc>) {
        tracing::info!(
            decision = d.decision.as_str(),
            district = %d.district,
            profile = %d.profile,
            op = ?d.op,
            node = ?d.node,
            reason = %d.reason,
            "decision"
        );
        let key = routing::decision(d.decision, &d.district, &d.profile);
        let mut e = Envelope::new_at(&self.cfg.agent.name, d.clone(), now);
        if let Some(op) = &d.op {
            e = e.with_corr(op.clone());
        }
        let m = OutMessage::new(key, self.signer.seal(e));
        if let Err(e) = self.bus.publish(m).await {
            tracing::warn!(error = %e, "decision not published");
        }
        self.metrics.decision(d.decision.as_str());
        let _ = self.observed_tx.send(Observed::Decision(d));
    }

    /// Publishes an explanation (transient, best effort) and tells the observers.
    async fn explain(&self, x: Explanation, now: DateTime<Utc>) {
        tracing::debug!(district = %x.district, profile = %x.profile, outcome = ?x.outcome, summary = %x.summary, "explanation");
        let key = routing::explain(&x.district, &x.profile);
        let e = Envelope::new_at(&self.cfg.agent.name, x.clone(), now);
        let m = OutMessage::new(key, self.signer.seal(e)).transient();
        if let Err(e) = self.bus.publish(m).await {
            tracing::debug!(error = %e, "explanation not published");
        }
        let _ = self.observed_tx.send(Observed::Explanation(x));
    }
}

async fn run_paas(paas: &dyn PaasAdapter, call: &PaasCall) -> Result<Outcome, PaasError> {
    match call {
        PaasCall::Deactivate { district, host } => paas.deactivate(district, host).await,
        PaasCall::Activate { district, host } => paas.activate(district, host).await,
        PaasCall::AddNode {
            district,
            host,
            profile,
        } => paas.add_node(district, host, profile).await,
        PaasCall::RemoveNode { district, host } => paas.remove_node(district, host).await,
        PaasCall::Move { gear, target } => paas.move_gear(gear, target).await,
    }
}

async fn run_call(h: Arc<dyn Handler>, call: HandlerCall) -> CallResult {
    match call {
        HandlerCall::Create(r) => CallResult::Create(h.create_node(&r).await),
        HandlerCall::Remove(r) => CallResult::Remove(h.remove_node(&r).await),
        HandlerCall::Lookup { op, group } => {
            CallResult::Lookup(h.lookup(op.as_str(), &group).await)
        }
        HandlerCall::Presence { node, group } => {
            CallResult::Presence(h.presence(&node, &group).await)
        }
        HandlerCall::Capacity { group, shape } => {
            CallResult::Capacity(h.capacity(&group, &shape).await)
        }
    }
}
