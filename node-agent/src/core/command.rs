//! Command intake: one command at a time; refusals; the journal's decision
//! (new, running, finished and redelivered, replayed); pings and inventory.

use chrono::{DateTime, Utc};
use gearshift_proto::msg::{CommandResult, Kind, Message, Pong};
use gearshift_proto::{AuthError, Envelope, Refusal, ReplayGuard, TimePolicy};

use super::{
    Action, Command, Current, Cx, NodeCore, Reply, Scan, ScanError, Tag, Wait, done, event, failed,
    outcome, stored,
};
use crate::state::journal::{EntryStatus, JournalEntry, Seen};

impl NodeCore {
    pub(super) fn on_command(
        &mut self,
        cx: Cx<'_>,
        c: Command,
        now: DateTime<Utc>,
        out: &mut Vec<Action>,
    ) {
        if self.stopping || self.removed {
            // Not acknowledged: the bus delivers it again to the next agent.
            return;
        }
        if self.current.is_some() {
            self.queue.push_back(c);
            return;
        }
        self.start(cx, c, now, out);
    }

    /// Starts the queued commands while nothing else is in progress.
    pub(super) fn next_command(&mut self, cx: Cx<'_>, now: DateTime<Utc>, out: &mut Vec<Action>) {
        while self.current.is_none() && !self.stopping && !self.removed {
            let Some(c) = self.queue.pop_front() else {
                return;
            };
            self.start(cx, c, now, out);
        }
    }

    fn start(&mut self, cx: Cx<'_>, c: Command, now: DateTime<Utc>, out: &mut Vec<Action>) {
        let env = match c.admitted {
            Ok(env) => env,
            Err(r) => return self.refuse(r, c.tag, now, out),
        };
        if matches!(env.msg, Message::Ping(_) | Message::Inventory(_)) {
            return self.read_only(cx, env, c.tag, c.reply, now, out);
        }
        let entry = self.journal.get(&env.id).cloned();
        match self.journal.seen(&env.id) {
            Seen::New => {
                if let Err(e) = TimePolicy::check(&policy(cx), &env, now) {
                    return self.refuse(Refusal::auth(&env, &e), c.tag, now, out);
                }
                if let Some(env) = self.fence(env, c.tag, now, out) {
                    self.begin_journal(cx, env, c.tag, now, out);
                }
            }
            Seen::Running => {
                tracing::info!(id = %env.id, kind = %env.kind(), "command seen before and not finished: resuming");
                self.current = Some(Box::new(Current {
                    env,
                    tag: c.tag,
                    entry,
                    wait: Wait::Journal,
                }));
                self.execute(cx, now, out);
            }
            Seen::FinishedUnacked => republish(&env, c.tag, entry, out),
            Seen::FinishedAcked if c.redelivered => republish(&env, c.tag, entry, out),
            Seen::FinishedAcked => {
                let e = AuthError::Replayed(env.id.to_string());
                self.refuse(Refusal::auth(&env, &e), c.tag, now, out)
            }
        }
    }

    /// Journals the new command `env`; it runs once the entry is durable.
    pub(super) fn begin_journal(
        &mut self,
        cx: Cx<'_>,
        env: Envelope,
        tag: Tag,
        now: DateTime<Utc>,
        out: &mut Vec<Action>,
    ) {
        let entry = JournalEntry {
            id: env.id,
            kind: env.kind().as_str().to_string(),
            corr: env.corr.clone(),
            ts: env.ts,
            received_at: now,
            status: EntryStatus::Running,
            result: None,
            acked: false,
            boot: cx.config.boot,
        };
        out.push(Action::JournalBegin(entry.clone()));
        self.current = Some(Box::new(Current {
            env,
            tag,
            entry: Some(entry),
            wait: Wait::Journal,
        }));
    }

    /// Scans the runtime for `cmd.inventory` `env`.
    pub(super) fn begin_inventory(&mut self, env: Envelope, tag: Tag, out: &mut Vec<Action>) {
        out.push(Action::Scan(Scan::Inventory));
        self.current = Some(Box::new(Current {
            env,
            tag,
            entry: None,
            wait: Wait::Scan,
        }));
    }

    /// `cmd.ping` and `cmd.inventory`: no journal, an in-memory replay guard.
    fn read_only(
        &mut self,
        cx: Cx<'_>,
        env: Envelope,
        tag: Tag,
        reply: Reply,
        now: DateTime<Utc>,
        out: &mut Vec<Action>,
    ) {
        if let Err(e) = self.check_fresh(cx, &env, now) {
            return self.refuse(Refusal::auth(&env, &e), tag, now, out);
        }
        if matches!(env.msg, Message::Ping(_)) {
            out.push(self.pong(cx, &env, reply, now));
            out.push(Action::Count {
                kind: Kind::Ping.as_str(),
                outcome: "done",
            });
            out.push(Action::Ack {
                tag,
                journaled: None,
            });
            return;
        }
        if let Some(env) = self.fence(env, tag, now, out) {
            self.begin_inventory(env, tag, out);
        }
    }

    /// Time window, then the ping guard (shared by directed and broadcast pings).
    fn check_fresh(
        &mut self,
        cx: Cx<'_>,
        env: &Envelope,
        now: DateTime<Utc>,
    ) -> Result<(), AuthError> {
        policy(cx).check(env, now)?;
        let window = cx.config.time_window * 2;
        let capacity = cx.config.journal_capacity.max(16);
        self.pings
            .get_or_insert_with(|| Box::new(ReplayGuard::new(window, capacity)))
            .check_and_record(env.id, env.ts, now)
    }

    fn pong(&self, cx: Cx<'_>, ping: &Envelope, reply: Reply, now: DateTime<Utc>) -> Action {
        Action::Pong {
            pong: Pong {
                agent: cx.name.to_string(),
                role: "node".into(),
                version: env!("CARGO_PKG_VERSION").into(),
                started_at: cx.config.started_at,
                received_at: now,
                ping: ping.id,
                active: Some(self.active),
            },
            corr: ping.corr.clone(),
            reply,
        }
    }

    /// Broadcast pings are never answered with `event.refused`: a rogue
    /// publisher must not make the whole fleet talk.
    pub(super) fn on_broadcast_ping(
        &mut self,
        cx: Cx<'_>,
        reply: Reply,
        admitted: Result<Envelope, Refusal>,
        now: DateTime<Utc>,
        out: &mut Vec<Action>,
    ) {
        let checked = admitted.and_then(|env| match self.check_fresh(cx, &env, now) {
            Ok(()) => Ok(env),
            Err(e) => Err(Refusal::auth(&env, &e)),
        });
        match checked {
            Ok(env) => out.push(self.pong(cx, &env, reply, now)),
            Err(refusal) => out.push(Action::Refused {
                refusal,
                broadcast: true,
            }),
        }
    }

    pub(super) fn on_journaled(
        &mut self,
        cx: Cx<'_>,
        r: Result<(), String>,
        now: DateTime<Utc>,
        out: &mut Vec<Action>,
    ) {
        let Some(c) = self
            .current
            .as_mut()
            .filter(|c| matches!(c.wait, Wait::Journal))
        else {
            return tracing::warn!("journal completion without a command waiting for it");
        };
        match r {
            Ok(()) => {
                if let Some(e) = &c.entry {
                    self.journal.insert(e.clone());
                }
                self.execute(cx, now, out);
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot write the command journal; command not executed");
                let env = &c.env;
                let msg = failed(
                    env,
                    &format!("node cannot persist the command: {e}"),
                    true,
                    None,
                );
                out.push(event(msg, env.corr.as_deref()));
                out.push(Action::Count {
                    kind: env.kind().as_str(),
                    outcome: "failed",
                });
                self.finish(false, out);
            }
        }
    }

    /// Runs the current journaled command.
    fn execute(&mut self, cx: Cx<'_>, now: DateTime<Utc>, out: &mut Vec<Action>) {
        let Some(c) = self.current.as_ref() else {
            return;
        };
        match &c.env.msg {
            Message::Deactivate(m) => {
                let reason = m.reason.clone();
                self.activation(false, &reason, now, out)
            }
            Message::Activate(m) => {
                let reason = m.reason.clone();
                self.activation(true, &reason, now, out)
            }
            Message::Evacuate(_) => self.evacuate_command(cx, out),
            Message::Remove(_) => self.remove_command(out),
            Message::HeatSignal(m) => {
                let (action, reason) = (m.action, m.reason.clone());
                self.heat_command(cx, action, &reason, out)
            }
            // Ping and inventory never reach the journal.
            _ => self.finish(false, out),
        }
    }

    /// A runtime scan for the current command ended.
    pub(super) fn on_scanned(
        &mut self,
        cx: Cx<'_>,
        scan: Scan,
        result: Result<Vec<gearshift_proto::msg::GearInfo>, ScanError>,
        now: DateTime<Utc>,
        out: &mut Vec<Action>,
    ) {
        let Some(c) = self
            .current
            .as_ref()
            .filter(|c| matches!(c.wait, Wait::Scan))
        else {
            return tracing::warn!(?scan, "scan result without a command waiting for it");
        };
        let env = &c.env;
        match scan {
            Scan::Deactivated => {
                let msg = match result {
                    Ok(gears) => done(env, CommandResult::Deactivated { gears }),
                    Err(e) => failed(
                        env,
                        &format!(
                            "node deactivated, but its gears cannot be listed: {}",
                            e.message
                        ),
                        true,
                        None,
                    ),
                };
                // The state file is fsynced: the effect is durable.
                self.conclude(msg, out);
                self.finish(true, out);
            }
            Scan::Inventory => {
                let msg = match result {
                    Ok(gears) => done(env, CommandResult::Inventory { gears }),
                    Err(e) => failed(
                        env,
                        &format!("cannot list gears: {}", e.message),
                        e.retryable,
                        None,
                    ),
                };
                out.push(Action::Count {
                    kind: env.kind().as_str(),
                    outcome: outcome(&msg),
                });
                out.push(event(msg, env.corr.as_deref()));
                self.finish(false, out);
            }
            Scan::Remove => self.remove_scanned(cx, result, now, out),
            Scan::Evacuated(_) => {}
        }
    }

    /// Records the current command's terminal event in the journal, counts
    /// it and queues it.
    pub(super) fn conclude(&mut self, msg: Message, out: &mut Vec<Action>) {
        self.conclude_with(msg, None, out);
    }

    /// Like [`NodeCore::conclude`], waiting for the bus to confirm when `confirm` is set.
    pub(super) fn conclude_with(
        &mut self,
        msg: Message,
        confirm: Option<super::Confirm>,
        out: &mut Vec<Action>,
    ) {
        let Some(c) = self.current.as_ref() else {
            return;
        };
        let env = &c.env;
        if let Some(e) = self.journal.finish(&env.id, stored(&msg)) {
            out.push(Action::JournalWrite(e));
        }
        out.push(Action::Count {
            kind: env.kind().as_str(),
            outcome: outcome(&msg),
        });
        out.push(Action::Emit(super::Event {
            msg,
            corr: env.corr.clone(),
            droppable: false,
            confirm,
        }));
    }

    /// Ends the current command: acknowledges its delivery (noting it in the
    /// journal when `journaled`).
    pub(super) fn finish(&mut self, journaled: bool, out: &mut Vec<Action>) {
        if let Some(c) = self.current.take() {
            out.push(Action::Ack {
                tag: c.tag,
                journaled: journaled.then_some(c.env.id),
            });
        }
    }

    /// `event.ack` of the current command: accepted, the result follows.
    pub(super) fn accepted(&self, out: &mut Vec<Action>) {
        if let Some(c) = &self.current {
            out.push(event(
                gearshift_proto::msg::Ack {
                    cmd: c.env.id,
                    command: c.env.kind().as_str().into(),
                },
                c.env.corr.as_deref(),
            ));
        }
    }
}

fn policy(cx: Cx<'_>) -> TimePolicy {
    TimePolicy {
        window: cx.config.time_window,
    }
}

/// A redelivered command whose work finished: publish its result again.
fn republish(env: &Envelope, tag: Tag, entry: Option<JournalEntry>, out: &mut Vec<Action>) {
    tracing::info!(id = %env.id, kind = %env.kind(), "redelivered command already done: publishing its result again");
    if let Some(s) = entry.and_then(|e| e.result) {
        let body = s.body.to_value().map_err(|e| e.to_string());
        let msg = body.and_then(|b| {
            Kind::parse(&s.kind)
                .and_then(|k| Message::from_parts(k, b))
                .map_err(|e| e.to_string())
        });
        match msg {
            Ok(msg) => out.push(event(msg, env.corr.as_deref())),
            Err(e) => tracing::error!(error = %e, "stored result unreadable"),
        }
    }
    out.push(Action::Count {
        kind: env.kind().as_str(),
        outcome: "duplicate",
    });
    out.push(Action::Ack {
        tag,
        journaled: Some(env.id),
    });
}
