//! Receiving commands: decode, authenticate, check the replay journal, then
//! execute; refuse (log, count, `event.refused`, ack away) anything else.
//!
//! | command | journaled | acknowledged once |
//! | --- | --- | --- |
//! | `cmd.deactivate`, `cmd.activate` | yes | the state file is fsynced |
//! | `cmd.evacuate` | yes | the plan's checkpoint is written |
//! | `cmd.remove` | yes | the result was published (confirmed) |
//! | `cmd.heat_signal` | yes | the result was queued for publication |
//! | `cmd.inventory`, `cmd.ping` | no (read-only; in-memory replay guard) | answered |

use std::sync::Arc;
use std::sync::atomic::Ordering;

use chrono::Utc;
use gearshift_bus::{ConsumeOptions, Delivery, OutMessage, QueueSpec};
use gearshift_proto::msg::{
    Ack, CommandResult, Done, Evacuate, Failed, HeatAction, Kind, Message, Pong, Refused,
};
use gearshift_proto::{AuthError, Envelope, TimePolicy, routing};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::{Inner, RunningEvac, lock};
use crate::evacuate::plan::{Plan, operation_id};
use crate::evacuate::{self, Abort, RunEnd};
use crate::heat::is_idempotent;
use crate::state::journal::{EntryStatus, JournalEntry, Seen, StoredEvent};
use crate::state::read_json;

/// Longest detail kept in a refusal or failure (bytes).
const MAX_DETAIL: usize = 2048;

fn clip(s: &str) -> String {
    if s.len() <= MAX_DETAIL {
        return s.to_string();
    }
    let mut end = MAX_DETAIL;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

/// The envelope id of bytes that failed to decode, when it can still be read.
fn lenient_id(bytes: &[u8]) -> Option<Uuid> {
    let v: serde_json::Value = serde_json::from_slice(bytes).ok()?;
    Uuid::parse_str(v.get("id")?.as_str()?).ok()
}

impl Inner {
    fn time_policy(&self) -> TimePolicy {
        TimePolicy {
            window: chrono::Duration::from_std(self.settings().time_window)
                .unwrap_or(chrono::Duration::minutes(5)),
        }
    }

    /// Consumes the node's durable command queue until `stop`; re-subscribes
    /// with backoff whenever the subscription fails or ends.
    pub(super) async fn command_loop(self: Arc<Self>, stop: CancellationToken) {
        let spec = QueueSpec::node_commands(&self.name);
        let mut attempt = 0u32;
        loop {
            let sub = tokio::select! {
                r = self.bus.consume(&spec, ConsumeOptions { prefetch: self.prefetch }) => r,
                _ = stop.cancelled() => return,
            };
            match sub {
                Ok(mut sub) => {
                    attempt = 0;
                    self.bus_connected.store(true, Ordering::SeqCst);
                    tracing::info!(queue = %spec.name, "consuming commands");
                    loop {
                        tokio::select! {
                            d = sub.next() => match d {
                                Some(d) => self.handle_command(d).await,
                                None => break,
                            },
                            _ = stop.cancelled() => return,
                        }
                    }
                    tracing::warn!(queue = %spec.name, "command subscription ended; subscribing again");
                }
                Err(e) => {
                    tracing::warn!(queue = %spec.name, error = %e, "cannot consume commands; retrying");
                }
            }
            let delay = gearshift_bus::backoff(attempt, self.retry_min, self.retry_max);
            attempt = attempt.saturating_add(1);
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = stop.cancelled() => return,
            }
        }
    }

    /// Answers broadcast pings until `stop`.
    pub(super) async fn ping_loop(self: Arc<Self>, stop: CancellationToken) {
        let mut attempt = 0u32;
        loop {
            let sub = tokio::select! {
                r = self.bus.subscribe(routing::PING) => r,
                _ = stop.cancelled() => return,
            };
            match sub {
                Ok(mut sub) => {
                    attempt = 0;
                    loop {
                        tokio::select! {
                            d = sub.next() => match d {
                                Some(d) => self.handle_broadcast_ping(d).await,
                                None => break,
                            },
                            _ = stop.cancelled() => return,
                        }
                    }
                }
                Err(e) => tracing::warn!(error = %e, "cannot subscribe to pings; retrying"),
            }
            let delay = gearshift_bus::backoff(attempt, self.retry_min, self.retry_max);
            attempt = attempt.saturating_add(1);
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = stop.cancelled() => return,
            }
        }
    }

    async fn handle_broadcast_ping(self: &Arc<Self>, d: Delivery) {
        let received_at = Utc::now();
        let decoded = match Envelope::decode(&d.payload) {
            Ok(x) => x,
            Err(e) => {
                self.refuse_quietly(e.reason_label(), &e.to_string());
                return;
            }
        };
        if decoded.envelope.kind() != Kind::Ping {
            self.refuse_quietly("unexpected_kind", decoded.envelope.kind().as_str());
            return;
        }
        let keyring = self.settings().keyring;
        let checked = gearshift_proto::sign::authenticate(
            &keyring,
            &self.time_policy(),
            &decoded,
            received_at,
        )
        .and_then(|_| {
            lock(&self.ping_guard).check_and_record(
                decoded.envelope.id,
                decoded.envelope.ts,
                received_at,
            )
        });
        if let Err(e) = checked {
            // Broadcast pings are not answered with event.refused: a rogue
            // publisher must not make the whole fleet talk.
            self.refuse_quietly(e.reason_label(), &e.to_string());
            return;
        }
        self.pong(&decoded.envelope, &d, received_at).await;
    }

    fn refuse_quietly(&self, reason: &str, detail: &str) {
        use gearshift_service::ratelimit::Verdict;
        self.metrics.broadcast_refused(reason);
        match lock(&self.refusal_log).check(reason, std::time::Instant::now()) {
            Verdict::Log { suppressed } => tracing::warn!(
                reason,
                detail = %clip(detail),
                suppressed,
                "broadcast message refused"
            ),
            Verdict::Suppress => {
                tracing::debug!(reason, detail = %clip(detail), "broadcast message refused")
            }
        }
    }

    async fn pong(&self, ping: &Envelope, d: &Delivery, received_at: chrono::DateTime<Utc>) {
        let pong = Pong {
            agent: self.name.clone(),
            role: "node".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            started_at: self.started_at,
            received_at,
            ping: ping.id,
            active: Some(lock(&self.node_state).active),
        };
        let payload = self.seal(self.envelope(pong, ping.corr.as_deref()));
        let r = match &d.reply_to {
            Some(q) => {
                let mut m = OutMessage::new(q.clone(), payload).transient();
                m.correlation_id = d.correlation_id.clone();
                self.bus.send_to_queue(q, m).await
            }
            None => {
                let mut m = OutMessage::new(routing::event(&self.name), payload).transient();
                m.correlation_id = d.correlation_id.clone();
                self.bus.publish(m).await
            }
        };
        match r {
            Ok(()) => {
                self.metrics.pongs.inc();
            }
            Err(e) => tracing::warn!(error = %e, "cannot answer a ping"),
        }
    }

    /// Refuses a command: logged with the reason, counted, published as
    /// `event.refused`. The caller acknowledges the delivery.
    fn refuse(&self, env: Option<&Envelope>, id: Option<Uuid>, reason: &str, detail: &str) {
        let kind = env.map_or("unknown", |e| e.kind().as_str());
        tracing::warn!(kind, id = ?id, from = env.map(|e| e.from.as_str()), reason,
            detail = %clip(detail), "command refused");
        self.metrics.refused(reason);
        self.metrics.command(kind, "refused");
        self.emit(
            Refused {
                cmd: id,
                reason: reason.to_string(),
                detail: clip(detail),
            },
            env.and_then(|e| e.corr.as_deref()),
            false,
        );
    }

    /// Acknowledges a delivery; notes it in the journal (a later copy of the
    /// same id is then a replay, not a redelivery).
    async fn ack(&self, d: Delivery, journaled: Option<Uuid>) {
        match d.ack().await {
            Ok(()) => {
                if let Some(id) = journaled {
                    let j = self.journal.clone();
                    let r = self.blocking(move || lock(&j).mark_acked(&id)).await;
                    if let Err(e) = r {
                        tracing::warn!(error = %e, "cannot note the acknowledgement in the journal");
                    }
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "acknowledgement failed; the command will be redelivered")
            }
        }
    }

    pub(super) async fn handle_command(self: &Arc<Self>, d: Delivery) {
        let now = Utc::now();
        let decoded = match Envelope::decode(&d.payload) {
            Ok(x) => x,
            Err(e) => {
                self.refuse(
                    None,
                    lenient_id(&d.payload),
                    e.reason_label(),
                    &e.to_string(),
                );
                self.ack(d, None).await;
                return;
            }
        };
        let env = decoded.envelope.clone();
        if !env.kind().is_command() {
            self.refuse(
                Some(&env),
                Some(env.id),
                "unexpected_kind",
                &format!("{} is not a command", env.kind()),
            );
            self.ack(d, None).await;
            return;
        }
        let keyring = self.settings().keyring;
        if let Err(e) = keyring.verify_signature(&decoded) {
            self.refuse(Some(&env), Some(env.id), e.reason_label(), &e.to_string());
            self.ack(d, None).await;
            return;
        }
        if matches!(env.msg, Message::Ping(_) | Message::Inventory(_)) {
            let checked = self
                .time_policy()
                .check(&env, now)
                .and_then(|()| lock(&self.ping_guard).check_and_record(env.id, env.ts, now));
            if let Err(e) = checked {
                self.refuse(Some(&env), Some(env.id), e.reason_label(), &e.to_string());
                self.ack(d, None).await;
                return;
            }
            match &env.msg {
                Message::Ping(_) => {
                    self.pong(&env, &d, now).await;
                    self.metrics.command(env.kind().as_str(), "done");
                }
                _ => self.inventory_command(&env).await,
            }
            self.ack(d, None).await;
            return;
        }

        let seen = lock(&self.journal).seen(&env.id);
        let entry = lock(&self.journal).get(&env.id).cloned();
        match seen {
            Seen::New => {
                if let Err(e) = self.time_policy().check(&env, now) {
                    self.refuse(Some(&env), Some(env.id), e.reason_label(), &e.to_string());
                    self.ack(d, None).await;
                    return;
                }
                let entry = JournalEntry {
                    id: env.id,
                    kind: env.kind().as_str().to_string(),
                    corr: env.corr.clone(),
                    ts: env.ts,
                    received_at: now,
                    status: EntryStatus::Running,
                    result: None,
                    acked: false,
                    boot: self.boot,
                };
                let j = self.journal.clone();
                let e2 = entry.clone();
                if let Err(e) = self.blocking(move || lock(&j).begin(e2)).await {
                    tracing::error!(error = %e, "cannot write the command journal; command not executed");
                    self.emit(
                        Failed {
                            cmd: env.id,
                            command: env.kind().as_str().into(),
                            error: clip(&format!("node cannot persist the command: {e}")),
                            retryable: true,
                            http_status: None,
                        },
                        env.corr.as_deref(),
                        false,
                    );
                    self.metrics.command(env.kind().as_str(), "failed");
                    self.ack(d, None).await;
                    return;
                }
                self.execute(env, d, entry).await;
            }
            Seen::Running => {
                let Some(entry) = entry else { return };
                tracing::info!(id = %env.id, kind = %env.kind(), "command seen before and not finished: resuming");
                self.execute(env, d, entry).await;
            }
            Seen::FinishedUnacked => self.republish(&env, d, entry).await,
            Seen::FinishedAcked if d.redelivered => self.republish(&env, d, entry).await,
            Seen::FinishedAcked => {
                let e = AuthError::Replayed(env.id.to_string());
                self.refuse(Some(&env), Some(env.id), e.reason_label(), &e.to_string());
                self.ack(d, None).await;
            }
        }
    }

    /// A redelivered command whose work finished: publish its result again.
    async fn republish(self: &Arc<Self>, env: &Envelope, d: Delivery, entry: Option<JournalEntry>) {
        tracing::info!(id = %env.id, kind = %env.kind(), "redelivered command already done: publishing its result again");
        if let Some(stored) = entry.and_then(|e| e.result) {
            match Kind::parse(&stored.kind).and_then(|k| Message::from_parts(k, stored.body)) {
                Ok(msg) => self.emit(msg, env.corr.as_deref(), false),
                Err(e) => tracing::error!(error = %e, "stored result unreadable"),
            }
        }
        self.metrics.command(env.kind().as_str(), "duplicate");
        self.ack(d, Some(env.id)).await;
    }

    /// Records the terminal event of a journaled command and queues it.
    async fn conclude(&self, env: &Envelope, msg: Message) {
        drop(self.conclude_confirmed(env, msg).await);
    }

    /// Like [`Inner::conclude`]; the receiver fires once the bus confirmed the event.
    async fn conclude_confirmed(
        &self,
        env: &Envelope,
        msg: Message,
    ) -> tokio::sync::oneshot::Receiver<()> {
        let outcome = if msg.kind() == Kind::Done {
            "done"
        } else {
            "failed"
        };
        let stored = StoredEvent {
            kind: msg.kind().as_str().to_string(),
            body: msg.body_value(),
        };
        let j = self.journal.clone();
        let id = env.id;
        if let Err(e) = self.blocking(move || lock(&j).finish(&id, stored)).await {
            tracing::error!(error = %e, "cannot record the command's result in the journal");
        }
        self.metrics.command(env.kind().as_str(), outcome);
        self.outbox
            .event_confirmed(self.event_message(msg, env.corr.as_deref()))
    }

    fn done(env: &Envelope, result: CommandResult) -> Message {
        Done {
            cmd: env.id,
            command: env.kind().as_str().into(),
            result,
        }
        .into()
    }

    fn failed(env: &Envelope, error: &str, retryable: bool, http_status: Option<u16>) -> Message {
        Failed {
            cmd: env.id,
            command: env.kind().as_str().into(),
            error: clip(error),
            retryable,
            http_status,
        }
        .into()
    }

    fn ack_event(&self, env: &Envelope) {
        self.emit(
            Ack {
                cmd: env.id,
                command: env.kind().as_str().into(),
            },
            env.corr.as_deref(),
            false,
        );
    }

    async fn execute(self: &Arc<Self>, env: Envelope, d: Delivery, entry: JournalEntry) {
        match &env.msg {
            Message::Deactivate(c) => {
                let reason = c.reason.clone();
                self.activation(&env, d, false, &reason).await
            }
            Message::Activate(c) => {
                let reason = c.reason.clone();
                self.activation(&env, d, true, &reason).await
            }
            Message::Evacuate(c) => {
                let c = c.clone();
                self.evacuate_command(&env, d, &c).await
            }
            Message::Remove(c) => {
                let reason = c.reason.clone();
                self.remove_command(&env, d, &entry, &reason).await
            }
            Message::HeatSignal(c) => {
                let (action, reason) = (c.action, c.reason.clone());
                self.heat_command(&env, d, &entry, action, &reason).await
            }
            _ => {
                // Ping and inventory never reach the journal.
                self.ack(d, None).await;
            }
        }
    }

    async fn activation(self: &Arc<Self>, env: &Envelope, d: Delivery, active: bool, reason: &str) {
        let reason = if reason.is_empty() {
            format!("{} from {}", env.kind(), env.from)
        } else {
            reason.to_string()
        };
        let id = env.id;
        let r = self
            .update_state(move |st| {
                if st.active != active {
                    st.active = active;
                    st.changed_at = Some(Utc::now());
                    st.reason = reason;
                    st.changed_by = Some(id);
                }
            })
            .await;
        if let Err(e) = r {
            tracing::error!(error = %e, "cannot persist the node's state");
            self.conclude(
                env,
                Self::failed(
                    env,
                    &format!("cannot persist the node's state: {e}"),
                    true,
                    None,
                ),
            )
            .await;
            self.ack(d, Some(env.id)).await;
            return;
        }
        tracing::info!(active, by = %env.from, id = %env.id, "node {}", if active { "activated" } else { "deactivated" });
        self.metrics.active.set(i64::from(active));
        if let Err(e) = self.runtime.set_active(active).await {
            tracing::warn!(error = %e, "runtime did not take the new state");
        }
        if active {
            // Re-activation aborts a drain in progress (the scale-down was called off).
            for evac in lock(&self.evacs).values() {
                evac.abort.abort("node re-activated by cmd.activate");
            }
        }
        self.report_now.notify_one();
        let msg = if active {
            Self::done(env, CommandResult::Activated)
        } else {
            match self.runtime.inventory().await {
                Ok(inv) => {
                    let gears = inv.gears.clone();
                    *lock(&self.inventory) = Some(inv);
                    Self::done(env, CommandResult::Deactivated { gears })
                }
                Err(e) => Self::failed(
                    env,
                    &format!("node deactivated, but its gears cannot be listed: {e}"),
                    true,
                    None,
                ),
            }
        };
        self.conclude(env, msg).await;
        // The state file is fsynced: the effect is durable.
        self.ack(d, Some(env.id)).await;
    }

    async fn inventory_command(&self, env: &Envelope) {
        let msg = match self.runtime.inventory().await {
            Ok(inv) => {
                let gears = inv.gears.clone();
                *lock(&self.inventory) = Some(inv);
                Self::done(env, CommandResult::Inventory { gears })
            }
            Err(e) => Self::failed(
                env,
                &format!("cannot list gears: {e}"),
                e.is_retryable(),
                None,
            ),
        };
        let outcome = if msg.kind() == Kind::Done {
            "done"
        } else {
            "failed"
        };
        self.metrics.command(env.kind().as_str(), outcome);
        self.emit(msg, env.corr.as_deref(), false);
    }

    async fn evacuate_command(self: &Arc<Self>, env: &Envelope, d: Delivery, evac: &Evacuate) {
        let corr = operation_id(env.corr.as_deref(), env.id);
        let default_par = self.settings().evacuation.parallelism;
        let running_other = {
            let evacs = lock(&self.evacs);
            if evacs.contains_key(&corr) {
                None
            } else {
                evacs.keys().next().cloned()
            }
        };
        if lock(&self.evacs).contains_key(&corr) {
            tracing::info!(%corr, id = %env.id, "evacuation already running; this command joins it");
            self.ack_event(env);
            self.metrics.command(env.kind().as_str(), "duplicate");
            self.ack(d, Some(env.id)).await;
            return;
        }
        if let Some(other) = running_other {
            self.conclude(
                env,
                Self::failed(
                    env,
                    &format!("another evacuation ({other}) is in progress"),
                    true,
                    None,
                ),
            )
            .await;
            self.ack(d, Some(env.id)).await;
            return;
        }
        if lock(&self.node_state).active {
            tracing::warn!(%corr, "evacuating an active node: new gears may still be placed on it");
        }
        let path = self.state.checkpoint_path(&corr);
        let now = Utc::now();
        let existing = {
            let p = path.clone();
            self.blocking(move || read_json::<Plan>(&p)).await
        };
        let plan = match existing {
            Ok(Some(mut p)) => {
                let work = p.resend(env.id, evac, default_par, now);
                p.event_corr = env.corr.clone();
                if !work {
                    tracing::info!(%corr, "evacuation sent again after it finished: publishing its result again");
                    self.conclude(env, Self::done(env, p.result())).await;
                    self.ack(d, Some(env.id)).await;
                    return;
                }
                tracing::info!(%corr, "evacuation sent again: resuming it");
                p
            }
            Ok(None) => {
                let mut p = Plan::new(&corr, env.id, evac, default_par, now);
                p.event_corr = env.corr.clone();
                p
            }
            Err(e) => {
                tracing::error!(error = %e, "evacuation checkpoint unreadable");
                self.conclude(
                    env,
                    Self::failed(
                        env,
                        &format!("evacuation checkpoint unreadable: {e}"),
                        false,
                        None,
                    ),
                )
                .await;
                self.ack(d, Some(env.id)).await;
                return;
            }
        };
        if let Err(e) = evacuate::save(&self.state, &path, &plan).await {
            tracing::error!(error = %e, "cannot write the evacuation checkpoint");
            self.conclude(
                env,
                Self::failed(
                    env,
                    &format!("cannot write the evacuation checkpoint: {e}"),
                    true,
                    None,
                ),
            )
            .await;
            self.ack(d, Some(env.id)).await;
            return;
        }
        tracing::info!(%corr, gears = plan.gears.len(), parallelism = plan.parallelism, "evacuation accepted");
        self.ack_event(env);
        self.metrics.command(env.kind().as_str(), "accepted");
        // The plan is durable: the delivery can go.
        self.ack(d, Some(env.id)).await;
        self.start_evacuation(plan);
    }

    /// Runs an evacuation plan in the background.
    pub(super) fn start_evacuation(self: &Arc<Self>, mut plan: Plan) {
        let abort = Abort::new();
        let corr = plan.corr.clone();
        lock(&self.evacs).insert(
            corr.clone(),
            RunningEvac {
                abort: abort.clone(),
            },
        );
        self.set_operation(Some(&plan));
        let me = self.clone();
        let stop = self.run_stop.clone();
        self.tracker.spawn(async move {
            let path = me.state.checkpoint_path(&plan.corr);
            let s = me.settings();
            let settings = evacuate::Settings {
                attempts: s.evacuation.attempts,
                backoff_min: s.evacuation.backoff_min,
                backoff_max: s.evacuation.backoff_max,
                grace: me.shutdown_grace,
            };
            let sink = super::report::EvacSink { inner: me.clone() };
            let end = evacuate::run(
                &mut plan,
                &path,
                &me.state,
                &me.runtime,
                &settings,
                &sink,
                &stop,
                &abort,
            )
            .await;
            if end == RunEnd::Finished {
                me.finish_evacuation(plan, &path, &stop).await;
                me.set_operation(None);
            }
            lock(&me.evacs).remove(&corr);
            me.report_now.notify_one();
        });
    }

    async fn finish_evacuation(
        self: &Arc<Self>,
        mut plan: Plan,
        path: &std::path::Path,
        stop: &CancellationToken,
    ) {
        let left = match self.runtime.inventory().await {
            Ok(inv) => {
                let n = inv.gears.len() as u32;
                *lock(&self.inventory) = Some(inv);
                n
            }
            Err(_) => lock(&self.inventory)
                .as_ref()
                .map_or(0, |i| i.gears.len() as u32),
        };
        plan.gears_left = left;
        plan.finished = true;
        if let Err(e) = evacuate::save(&self.state, path, &plan).await {
            self.metrics.checkpoint_errors.inc();
            tracing::error!(error = %e, "cannot checkpoint the finished evacuation");
        }
        let (moved, failed, _, total) = plan.counts();
        tracing::info!(corr = %plan.corr, moved, failed, total, gears_left = left, "evacuation finished");
        let msg: Message = Done {
            cmd: plan.cmd,
            command: Kind::Evacuate.as_str().into(),
            result: plan.result(),
        }
        .into();
        let stored = StoredEvent {
            kind: msg.kind().as_str().to_string(),
            body: msg.body_value(),
        };
        let j = self.journal.clone();
        let (corr, cmd) = (plan.event_corr.clone(), plan.cmd);
        if let Err(e) = self
            .blocking(move || {
                lock(&j).finish_operation(Kind::Evacuate.as_str(), corr.as_deref(), &cmd, &stored)
            })
            .await
        {
            tracing::error!(error = %e, "cannot record the evacuation's result in the journal");
        }
        self.metrics.command(Kind::Evacuate.as_str(), "done");
        self.publish_evacuation_done(plan, path, msg, stop).await;
    }

    async fn publish_evacuation_done(
        &self,
        mut plan: Plan,
        path: &std::path::Path,
        msg: Message,
        stop: &CancellationToken,
    ) {
        let rx = self
            .outbox
            .event_confirmed(self.event_message(msg, plan.event_corr.as_deref()));
        tokio::select! {
            r = rx => if r.is_ok() {
                plan.done_published = true;
                if let Err(e) = evacuate::save(&self.state, path, &plan).await {
                    tracing::warn!(error = %e, "cannot note that the evacuation's result was published");
                }
            },
            _ = stop.cancelled() => {}
        }
    }

    /// At start: resumes unfinished evacuations; publishes results that a
    /// crash kept from being published; forgets old finished checkpoints.
    pub(super) async fn resume_evacuations(self: Arc<Self>, stop: CancellationToken) {
        let files = match self.state.checkpoint_files() {
            Ok(f) => f,
            Err(e) => {
                tracing::error!(error = %e, "cannot list evacuation checkpoints");
                return;
            }
        };
        for path in files {
            let p = path.clone();
            let plan = match self.blocking(move || read_json::<Plan>(&p)).await {
                Ok(Some(plan)) => plan,
                Ok(None) => continue,
                Err(e) => {
                    tracing::error!(error = %e, "evacuation checkpoint unreadable; skipped");
                    continue;
                }
            };
            if !plan.finished {
                let (moved, failed, remaining, _) = plan.counts();
                tracing::info!(corr = %plan.corr, moved, failed, remaining, "resuming an interrupted evacuation");
                self.start_evacuation(plan);
            } else if !plan.done_published {
                let msg: Message = Done {
                    cmd: plan.cmd,
                    command: Kind::Evacuate.as_str().into(),
                    result: plan.result(),
                }
                .into();
                let me = self.clone();
                let stop = stop.clone();
                self.tracker.spawn(async move {
                    me.publish_evacuation_done(plan, &path, msg, &stop).await;
                });
            } else if Utc::now() - plan.updated_at > chrono::Duration::days(7) {
                let s = self.state.clone();
                let _ = self.blocking(move || s.remove(&path)).await;
            }
        }
    }

    async fn remove_command(
        self: &Arc<Self>,
        env: &Envelope,
        d: Delivery,
        entry: &JournalEntry,
        reason: &str,
    ) {
        if lock(&self.node_state).active {
            self.conclude(
                env,
                Self::failed(
                    env,
                    "the node is active: deactivate and evacuate it first",
                    true,
                    None,
                ),
            )
            .await;
            self.ack(d, Some(env.id)).await;
            return;
        }
        match self.runtime.inventory().await {
            Ok(inv) if !inv.gears.is_empty() => {
                let n = inv.gears.len();
                *lock(&self.inventory) = Some(inv);
                self.conclude(
                    env,
                    Self::failed(env, &format!("{n} gears are still on the node"), true, None),
                )
                .await;
                self.ack(d, Some(env.id)).await;
                return;
            }
            Ok(inv) => *lock(&self.inventory) = Some(inv),
            Err(e) => {
                self.conclude(
                    env,
                    Self::failed(
                        env,
                        &format!("cannot check that the node is empty: {e}"),
                        true,
                        None,
                    ),
                )
                .await;
                self.ack(d, Some(env.id)).await;
                return;
            }
        }
        let s = self.settings();
        let action = s.remove_action.heat_action();
        if entry.boot != self.boot && action.is_some_and(|a| !is_idempotent(a)) {
            let msg = Self::failed(
                env,
                "the agent restarted while this removal's Heat signal was in flight; it is not sent again \
                 (it could scale twice): check the stack, then send a new cmd.remove",
                false,
                None,
            );
            self.conclude(env, msg).await;
            self.ack(d, Some(env.id)).await;
            return;
        }
        self.ack_event(env);
        let reason = if reason.is_empty() {
            format!("gearshift: node {} removed (empty and inactive)", self.name)
        } else {
            reason.to_string()
        };
        let outcome = match (action, &s.signaller) {
            (None, _) => Ok((
                "none".to_string(),
                "no removal action configured; the node stops".to_string(),
            )),
            (Some(a), Some(sig)) => sig.signal(a, &reason).await.map(|o| {
                (
                    format!("heat:{}", a.as_str()),
                    format!("HTTP {}: {}", o.status, o.detail),
                )
            }),
            (Some(a), None) => Err(crate::heat::SignalError::config(format!(
                "remove_action {} needs Heat credentials, and none are configured",
                a.as_str()
            ))),
        };
        match outcome {
            Ok((action, detail)) => {
                if let Err(e) = self
                    .update_state(|st| st.removed_at = Some(Utc::now()))
                    .await
                {
                    tracing::warn!(error = %e, "cannot note the removal in the state file");
                }
                tracing::info!(%action, %detail, "node removed; the agent stops");
                let confirmed = self
                    .conclude_confirmed(
                        env,
                        Self::done(
                            env,
                            CommandResult::Removed {
                                action,
                                detail: clip(&detail),
                            },
                        ),
                    )
                    .await;
                // Acknowledge only once the result is on the bus.
                let stop = self.run_stop.clone();
                tokio::select! {
                    _ = confirmed => {}
                    _ = stop.cancelled() => {}
                }
                self.ack(d, Some(env.id)).await;
                self.removed.store(true, Ordering::SeqCst);
                self.stop_self.cancel();
            }
            Err(e) => {
                tracing::error!(error = %e, http_status = ?e.http_status, "removal action failed");
                self.conclude(
                    env,
                    Self::failed(env, &e.message, e.retryable, e.http_status),
                )
                .await;
                self.ack(d, Some(env.id)).await;
            }
        }
    }

    async fn heat_command(
        self: &Arc<Self>,
        env: &Envelope,
        d: Delivery,
        entry: &JournalEntry,
        action: HeatAction,
        reason: &str,
    ) {
        if entry.boot != self.boot && !is_idempotent(action) {
            let msg = Self::failed(
                env,
                "the agent restarted while this Heat signal was in flight; it is not sent again \
                 (it could scale twice): check the stack, then send a new command",
                false,
                None,
            );
            self.conclude(env, msg).await;
            self.ack(d, Some(env.id)).await;
            return;
        }
        let Some(sig) = self.settings().signaller else {
            self.conclude(
                env,
                Self::failed(
                    env,
                    "this node has no Heat configuration ([heat] in node.toml)",
                    false,
                    None,
                ),
            )
            .await;
            self.ack(d, Some(env.id)).await;
            return;
        };
        self.ack_event(env);
        let reason = if reason.is_empty() {
            format!("gearshift {} from node {}", action.as_str(), self.name)
        } else {
            reason.to_string()
        };
        let msg = match sig.signal(action, &reason).await {
            Ok(o) => {
                tracing::info!(
                    action = action.as_str(),
                    status = o.status,
                    "Heat signal sent"
                );
                Self::done(
                    env,
                    CommandResult::HeatSignalled {
                        action,
                        status: o.status,
                        detail: clip(&o.detail),
                    },
                )
            }
            Err(e) => {
                tracing::error!(action = action.as_str(), error = %e, http_status = ?e.http_status, "Heat signal failed");
                Self::failed(env, &e.message, e.retryable, e.http_status)
            }
        };
        self.conclude(env, msg).await;
        self.ack(d, Some(env.id)).await;
    }
}
