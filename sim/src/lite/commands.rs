//! Lite nodes' commands: the node agent's gate and [`NodeCore`], with an
//! in-memory "runtime" that carries out the core's actions at once.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use chrono::Utc;
use gearshift_bus::{Delivery, OutMessage};
use gearshift_node::core::{
    Action, Command, Cx, Event, Input, MoveDone, MoveResult, MoveStart, Reply, Tag,
};
use gearshift_node::heat::SignalError;
use gearshift_node::runtime::MoveOutcome;
use gearshift_proto::msg::{CommandResult, Kind, Message};
use gearshift_proto::{Envelope, Expect, Gate, TimePolicy, routing};
use tokio_util::sync::CancellationToken;

use super::{LiteFleet, gear_infos, lock};

/// What a node agent takes on its command queue (the core checks the time).
const COMMANDS: Expect = Expect::kinds(Kind::is_command).any_age();

impl LiteFleet {
    /// Answers the broker agent's commands until `stop`. Call once.
    pub async fn serve_commands(self: &Arc<Self>, stop: CancellationToken) -> anyhow::Result<()> {
        let mut sub = self.buses[0].subscribe("cmd.#").await?;
        loop {
            let d = tokio::select! {
                _ = stop.cancelled() => return Ok(()),
                d = sub.next() => match d {
                    Some(d) => d,
                    None => anyhow::bail!("the command subscription ended"),
                },
            };
            let me = self.clone();
            tokio::spawn(async move { me.on_command(d).await });
        }
    }

    async fn on_command(self: Arc<Self>, d: Delivery) {
        let Some(node) = d.key.strip_prefix("cmd.").and_then(routing::unsegment) else {
            return;
        };
        let Some(i) = self.index(&node) else {
            // Not ours (another fleet's node on the same bus).
            return;
        };
        let gate = Gate::new(&self.brokers, TimePolicy::default());
        let admitted = gate
            .admit(&d.payload, COMMANDS, Utc::now())
            .map(|a| a.envelope);
        if admitted.is_ok() {
            self.counters.commands.fetch_add(1, Ordering::Relaxed);
        }
        let c = Command {
            tag: Tag(0),
            redelivered: d.redelivered,
            reply: Reply {
                queue: d.reply_to.clone(),
                correlation_id: d.correlation_id.clone(),
            },
            admitted,
        };
        self.drive(i, Input::Command(c)).await;
        self.drive(i, Input::Prune).await;
    }

    /// Feeds `first` to node `i`'s core and carries out what follows.
    async fn drive(&self, i: usize, first: Input) {
        let name = self.nodes[i].name.as_str();
        let mut inputs = VecDeque::from([first]);
        while let Some(input) = inputs.pop_front() {
            let actions = {
                let cx = Cx {
                    name,
                    config: &self.core_config,
                };
                lock(&self.nodes[i].state)
                    .core
                    .handle(cx, input, Utc::now())
            };
            for a in actions {
                if let Some(next) = self.carry_out(i, a).await {
                    inputs.push_back(next);
                }
            }
        }
    }

    async fn carry_out(&self, i: usize, a: Action) -> Option<Input> {
        match a {
            Action::JournalBegin(_) => Some(Input::Journaled(Ok(()))),
            Action::PersistActive { .. } => Some(Input::Persisted(Ok(()))),
            Action::PersistEpoch(_) => Some(Input::EpochPersisted(Ok(()))),
            Action::Scan(scan) => {
                let gears = gear_infos(&lock(&self.nodes[i].state));
                Some(Input::Scanned {
                    scan,
                    result: Ok(gears),
                })
            }
            Action::LoadPlan(_) => Some(Input::PlanLoaded(Ok(None))),
            Action::SavePlan { accept, .. } => accept.then_some(Input::PlanSaved(Ok(()))),
            Action::Signal { .. } => Some(Input::Signalled(Err(SignalError::config(
                "a lite node sends no Heat signal",
            )))),
            Action::Emit(e) => self.emit_event(i, e).await,
            Action::Pong { pong, corr, reply } => {
                self.pong(i, pong, corr, reply).await;
                None
            }
            Action::Ack { journaled, .. } => journaled.map(Input::Acked),
            Action::StartMove(m) => Some(Input::Moved(self.move_gear(i, m))),
            Action::Refused { refusal, .. } => {
                tracing::warn!(node = %self.nodes[i].name, %refusal, "lite node: command refused");
                self.counters.refused.fetch_add(1, Ordering::Relaxed);
                None
            }
            Action::Count {
                outcome: "duplicate",
                ..
            } => {
                self.counters.duplicates.fetch_add(1, Ordering::Relaxed);
                None
            }
            Action::ReportNow => {
                self.changed(i);
                None
            }
            // Nothing to write, no runtime to tell, nothing to stop.
            _ => None,
        }
    }

    /// Publishes an event; counts finished evacuations.
    async fn emit_event(&self, i: usize, e: Event) -> Option<Input> {
        if let Message::Done(d) = &e.msg
            && let CommandResult::Evacuated { gears_left, .. } = d.result
        {
            self.counters.evacuations.fetch_add(1, Ordering::Relaxed);
            if gears_left == 0 {
                self.counters.drained.fetch_add(1, Ordering::Relaxed);
            }
        }
        let ok = self.emit(i, e.msg, e.corr.as_deref()).await;
        e.confirm.map(|confirm| Input::Confirmed { confirm, ok })
    }

    /// Moves a gear at no cost: it leaves node `i` and joins its target.
    fn move_gear(&self, i: usize, m: MoveStart) -> MoveDone {
        let target = self.index(&m.target);
        let gear = m.gear.strip_prefix('g').and_then(|s| s.parse::<u32>().ok());
        let outcome = match (gear, target) {
            (Some(g), Some(t)) if t != i => {
                let taken = {
                    let mut st = lock(&self.nodes[i].state);
                    match st.gears.iter().position(|x| *x == g) {
                        Some(p) => {
                            st.gears.swap_remove(p);
                            let n = st.gears.len() as u32;
                            st.started = st.started.min(n);
                            true
                        }
                        None => false,
                    }
                };
                if taken {
                    {
                        let mut ts = lock(&self.nodes[t].state);
                        ts.gears.push(g);
                        ts.started += 1;
                    }
                    self.changed(t);
                    MoveOutcome::Moved
                } else {
                    MoveOutcome::AlreadyMoved
                }
            }
            _ => MoveOutcome::Missing,
        };
        if outcome == MoveOutcome::Moved {
            self.counters.moves.fetch_add(1, Ordering::Relaxed);
            let now = Instant::now();
            let mut w = lock(&self.window);
            w.first.get_or_insert(now);
            w.last = Some(now);
        }
        MoveDone {
            op: m.op,
            idx: m.idx,
            result: MoveResult::Done(outcome),
            attempts: 1,
        }
    }

    /// Node `i` must report soon (once, however many changes come first).
    pub(super) fn changed(&self, i: usize) {
        let first = {
            let mut st = lock(&self.nodes[i].state);
            !std::mem::replace(&mut st.dirty, true)
        };
        if first {
            let _ = self.dirty.send(i);
        }
    }

    async fn emit(&self, i: usize, msg: Message, corr: Option<&str>) -> bool {
        let n = &self.nodes[i];
        let mut env = Envelope::new(&n.name, msg);
        if let Some(c) = corr {
            env = env.with_corr(c);
        }
        let m = OutMessage::new(routing::event(&n.name), n.key.seal(env));
        match self.buses[n.conn].publish(m).await {
            Ok(()) => {
                self.counters.events.fetch_add(1, Ordering::Relaxed);
                true
            }
            Err(e) => {
                tracing::warn!(node = %n.name, error = %e, "lite node: event not published");
                self.counters.event_errors.fetch_add(1, Ordering::Relaxed);
                false
            }
        }
    }

    async fn pong(
        &self,
        i: usize,
        pong: gearshift_proto::msg::Pong,
        corr: Option<String>,
        reply: Reply,
    ) {
        let n = &self.nodes[i];
        let mut env = Envelope::new(&n.name, pong);
        if let Some(c) = corr {
            env = env.with_corr(c);
        }
        let payload = n.key.seal(env);
        let bus = &self.buses[n.conn];
        let r = match &reply.queue {
            Some(q) => {
                let mut m = OutMessage::new(q.clone(), payload).transient();
                m.correlation_id = reply.correlation_id.clone();
                bus.send_to_queue(q, m).await
            }
            None => {
                let mut m = OutMessage::new(routing::event(&n.name), payload).transient();
                m.correlation_id = reply.correlation_id;
                bus.publish(m).await
            }
        };
        if let Err(e) = r {
            tracing::debug!(node = %n.name, error = %e, "lite node: pong not sent");
        }
    }
}
