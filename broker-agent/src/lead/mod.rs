//! Leader election among the broker agents of one deployment, through the
//! bus itself, as a machine without I/O: `(state, input, now) -> (state,
//! actions)`.
//!
//! Every agent consumes one durable queue declared with a single active
//! consumer ([`gearshift_bus::QueueSpec::single_active_consumer`]) and
//! publishes a small signed candidate token to it every `lead_period`.
//! The broker hands every token to its one active consumer, so an agent that
//! receives one of its *own* tokens, published since its last bus
//! (re)connection, is that consumer: it leads. Tokens published before a
//! reconnection prove nothing (they may have been buffered on the way), and
//! a leader that receives none of its own for `lead_lease` steps down, as it
//! does at once when its connection is lost or a newer leader shows itself.
//!
//! A new leader's epoch is strictly greater than any epoch the agent has
//! seen (its journal, announcements, replicated journals) and than the wall
//! clock in milliseconds, so that epochs grow across agents without a
//! shared counter. `replica.rs` holds the replicated journal.
//!
//! Layout: this file the machine; `replica.rs` the journal snapshot the
//! leader publishes and standbys keep; `tests.rs` the machine's tests.

pub mod replica;
#[cfg(test)]
mod tests;

use std::time::Duration;

use chrono::{DateTime, Utc};

/// Timing of the election.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeadTiming {
    /// How often a candidate token (and the leader's announcement) goes out.
    pub period: Duration,
    /// A leader that received none of its own tokens for this long steps down.
    pub lease: Duration,
}

/// Who this agent is in the election.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Role {
    /// Consumes reports and the leader's journal, decides nothing.
    Standby,
    /// The deciding agent, since `since`, with its `epoch`.
    Leader {
        /// Strictly greater than every epoch seen before taking over.
        epoch: u64,
        /// When it took over.
        since: DateTime<Utc>,
    },
}

/// What the driver tells the machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Input {
    /// A candidate token arrived on the leader queue: `own` when this agent
    /// published it, `seq` its sequence number.
    Token {
        /// Published by this agent.
        own: bool,
        /// The token's sequence number (meaningful for own tokens).
        seq: u64,
    },
    /// Time passes.
    Tick,
    /// The bus connection was lost or re-established, or the leader queue's
    /// consumer ended: leadership must be proved again.
    BusReset,
    /// An epoch seen elsewhere: another agent's announcement (`other_leader`)
    /// or a replicated journal, or a node's refusal of a stale epoch.
    EpochSeen {
        /// The epoch.
        epoch: u64,
        /// Someone else claims to lead with it (an announcement or a refusal
        /// naming a newer epoch): a leader with an older epoch steps down.
        other_leader: bool,
    },
}

/// Why a leader stepped down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepDown {
    /// No own token came back within the lease.
    LeaseLost,
    /// The bus connection (or the leader queue's consumer) was lost.
    BusLost,
    /// Another agent leads with a newer epoch.
    Deposed,
}

impl StepDown {
    /// For logs and the status.
    pub fn as_str(self) -> &'static str {
        match self {
            StepDown::LeaseLost => "lease_lost",
            StepDown::BusLost => "bus_lost",
            StepDown::Deposed => "deposed",
        }
    }
}

/// What the driver must do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeadAction {
    /// Publish a candidate token with this sequence number.
    PublishToken {
        /// The token's sequence number.
        seq: u64,
    },
    /// Take over with `epoch`: persist it, load the newest journal, resume
    /// the sagas, consume the shared queues.
    BecomeLeader {
        /// The new epoch.
        epoch: u64,
    },
    /// Stop deciding at once: drop the shared queues, stand by.
    StepDown(StepDown),
    /// Publish the leader announcement (the leader, every period).
    Announce,
}

/// The election machine.
#[derive(Debug, Clone)]
pub struct Lead {
    timing: LeadTiming,
    role: Role,
    /// Sequence number of the next token.
    next_seq: u64,
    /// Only own tokens from this sequence number on (published since the
    /// last reset) prove that this agent is the active consumer.
    valid_from: u64,
    /// When the next token goes out (`None`: at the next tick).
    next_token: Option<DateTime<Utc>>,
    /// When the last valid own token arrived.
    last_own: Option<DateTime<Utc>>,
    /// The greatest epoch seen anywhere (own included).
    seen_epoch: u64,
}

impl Lead {
    /// A standby that has seen `seen_epoch` (its journal's).
    pub fn new(timing: LeadTiming, seen_epoch: u64) -> Self {
        Lead {
            timing,
            role: Role::Standby,
            next_seq: 0,
            valid_from: 0,
            next_token: None,
            last_own: None,
            seen_epoch,
        }
    }

    /// The current role.
    pub fn role(&self) -> &Role {
        &self.role
    }

    /// Whether this agent leads.
    pub fn is_leader(&self) -> bool {
        matches!(self.role, Role::Leader { .. })
    }

    /// The epoch this agent leads with, if it leads.
    pub fn epoch(&self) -> Option<u64> {
        match self.role {
            Role::Leader { epoch, .. } => Some(epoch),
            Role::Standby => None,
        }
    }

    /// The greatest epoch seen.
    pub fn seen_epoch(&self) -> u64 {
        self.seen_epoch
    }

    /// Changes the timing (a reload).
    pub fn set_timing(&mut self, timing: LeadTiming) {
        self.timing = timing;
    }

    /// One input at `now`.
    pub fn step(&mut self, input: Input, now: DateTime<Utc>) -> Vec<LeadAction> {
        match input {
            Input::Tick => self.on_tick(now),
            Input::Token { own, seq } => self.on_token(own, seq, now),
            Input::BusReset => {
                self.valid_from = self.next_seq;
                self.last_own = None;
                // Prove it again at once rather than a period later.
                self.next_token = None;
                self.step_down(StepDown::BusLost)
            }
            Input::EpochSeen {
                epoch,
                other_leader,
            } => {
                self.seen_epoch = self.seen_epoch.max(epoch);
                match self.epoch() {
                    Some(mine) if other_leader && epoch > mine => {
                        // Prove it again: a token published from now on.
                        self.valid_from = self.next_seq;
                        self.last_own = None;
                        self.step_down(StepDown::Deposed)
                    }
                    _ => vec![],
                }
            }
        }
    }

    fn on_tick(&mut self, now: DateTime<Utc>) -> Vec<LeadAction> {
        let mut out = vec![];
        if let Some(since) = self.last_own
            && self.is_leader()
            && elapsed(since, now) > self.timing.lease
        {
            self.last_own = None;
            out.extend(self.step_down(StepDown::LeaseLost));
        }
        if self.next_token.is_none_or(|t| now >= t) {
            out.push(LeadAction::PublishToken { seq: self.next_seq });
            self.next_seq += 1;
            self.next_token = Some(now + crate::core::dur(self.timing.period));
            if self.is_leader() {
                out.push(LeadAction::Announce);
            }
        }
        out
    }

    fn on_token(&mut self, own: bool, seq: u64, now: DateTime<Utc>) -> Vec<LeadAction> {
        if !own || seq < self.valid_from || seq >= self.next_seq {
            return vec![];
        }
        self.last_own = Some(now);
        if self.is_leader() {
            return vec![];
        }
        let wall = u64::try_from(now.timestamp_millis()).unwrap_or(0);
        let epoch = self.seen_epoch.saturating_add(1).max(wall);
        self.seen_epoch = epoch;
        self.role = Role::Leader { epoch, since: now };
        vec![LeadAction::BecomeLeader { epoch }, LeadAction::Announce]
    }

    fn step_down(&mut self, why: StepDown) -> Vec<LeadAction> {
        if !self.is_leader() {
            return vec![];
        }
        self.role = Role::Standby;
        vec![LeadAction::StepDown(why)]
    }
}

fn elapsed(since: DateTime<Utc>, now: DateTime<Utc>) -> Duration {
    (now - since).to_std().unwrap_or_default()
}

/// What `status` and the dashboard show of the election.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct HaStatus {
    /// `leader` or `standby`.
    pub role: String,
    /// The cluster (`[agent] cluster`).
    pub cluster: String,
    /// The leader's name: this agent's when it leads, else the last
    /// announcement's (absent when none was seen).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leader: Option<String>,
    /// The leader's epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epoch: Option<u64>,
    /// Since when the leader leads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<DateTime<Utc>>,
    /// When the last announcement of another leader arrived.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub announced_at: Option<DateTime<Utc>>,
    /// The replicated journal held (standby): `epoch.seq`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replica: Option<String>,
}

impl HaStatus {
    /// One line: `leader of cluster main (epoch N) since T` or `standby in
    /// cluster main: broker-a leads (epoch N)`.
    pub fn describe(&self) -> String {
        let epoch = self
            .epoch
            .map(|e| format!(" (epoch {e})"))
            .unwrap_or_default();
        let since = self
            .since
            .map(|t| format!(" since {}", t.format("%Y-%m-%d %H:%M:%S UTC")))
            .unwrap_or_default();
        match (self.role.as_str(), &self.leader) {
            ("leader", _) => format!("leader of cluster {}{epoch}{since}", self.cluster),
            (_, Some(l)) => format!(
                "standby in cluster {}: {l} leads{epoch}{since}",
                self.cluster
            ),
            _ => format!("standby in cluster {}: no leader heard", self.cluster),
        }
    }
}
