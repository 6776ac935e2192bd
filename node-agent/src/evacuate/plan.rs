//! The evacuation plan and its checkpoint: pure state, no I/O.
//!
//! One plan per operation (`corr`). The runner writes it to
//! `<state>/evac/<key>.json` after every change that must survive a crash:
//! when it is created (before the command is acknowledged), when moves are
//! launched (`started`, so that a gear found gone after a crash counts as
//! already moved), and after every gear finishes.

use std::collections::HashSet;

use chrono::{DateTime, Utc};
use gearshift_proto::msg::{
    CommandResult, Evacuate, GearOutcome, GearResult, OperationStatus, Progress,
};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::runtime::MoveOutcome;

/// Version of the checkpoint format.
pub const PLAN_VERSION: u32 = 1;

/// Where one gear of the plan stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GearStatus {
    /// Not finished.
    Pending,
    /// Moved by this plan.
    Moved,
    /// Found at its target already.
    AlreadyMoved,
    /// Neither here nor at the target.
    Missing,
    /// Failed for good (retries exhausted, deadline, cancelled).
    Failed,
}

impl GearStatus {
    /// Whether the gear is finished one way or the other.
    pub fn is_final(self) -> bool {
        self != GearStatus::Pending
    }

    fn outcome(self) -> Option<GearOutcome> {
        match self {
            GearStatus::Pending => None,
            GearStatus::Moved => Some(GearOutcome::Moved),
            GearStatus::AlreadyMoved => Some(GearOutcome::AlreadyMoved),
            GearStatus::Missing => Some(GearOutcome::Missing),
            GearStatus::Failed => Some(GearOutcome::Failed),
        }
    }
}

/// One gear of the plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GearEntry {
    /// The gear.
    pub gear: String,
    /// Its target node.
    pub target: String,
    /// Where it stands.
    pub status: GearStatus,
    /// A move of it was launched at least once (maybe by a process that crashed).
    #[serde(default)]
    pub started: bool,
    /// Attempts made (of the finished run).
    #[serde(default)]
    pub attempts: u32,
    /// Last error, for failed gears.
    #[serde(default)]
    pub error: Option<String>,
}

/// A whole evacuation operation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Plan {
    /// Checkpoint format version.
    pub version: u32,
    /// The operation id.
    pub corr: String,
    /// The command currently driving the plan (events carry its id).
    pub cmd: Uuid,
    /// The `corr` the commands carried (events carry it); `None` when they had none.
    #[serde(default)]
    pub event_corr: Option<String>,
    /// When the plan was created.
    pub created_at: DateTime<Utc>,
    /// Last checkpoint.
    pub updated_at: DateTime<Utc>,
    /// Moves in flight at once.
    pub parallelism: u32,
    /// No move starts after this instant.
    #[serde(default)]
    pub deadline: Option<DateTime<Utc>>,
    /// The gears, in command order.
    pub gears: Vec<GearEntry>,
    /// Every gear is final and the result was computed.
    #[serde(default)]
    pub finished: bool,
    /// `event.done` of the finished plan was published (confirmed by the bus).
    #[serde(default)]
    pub done_published: bool,
    /// Gears left on the node when the plan finished.
    #[serde(default)]
    pub gears_left: u32,
    /// The moves are the broker agent's (`cmd.evacuate` with `watch`): each
    /// gear is watched until it leaves this node, never moved from here.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub watch: bool,
}

/// The operation id of an evacuation: its `corr`, or the command id when it has none.
pub fn operation_id(corr: Option<&str>, cmd: Uuid) -> String {
    corr.map_or_else(|| format!("cmd-{cmd}"), str::to_string)
}

impl Plan {
    /// A new plan for `cmd`.
    pub fn new(
        corr: &str,
        cmd: Uuid,
        evac: &Evacuate,
        default_parallelism: u32,
        now: DateTime<Utc>,
    ) -> Plan {
        Plan {
            version: PLAN_VERSION,
            corr: corr.to_string(),
            cmd,
            event_corr: Some(corr.to_string()),
            created_at: now,
            updated_at: now,
            parallelism: evac
                .parallelism
                .unwrap_or(default_parallelism)
                .clamp(1, 256),
            deadline: evac.deadline,
            gears: evac
                .moves
                .iter()
                .map(|m| GearEntry {
                    gear: m.gear.clone(),
                    target: m.target.clone(),
                    status: GearStatus::Pending,
                    started: false,
                    attempts: 0,
                    error: None,
                })
                .collect(),
            finished: false,
            done_published: false,
            gears_left: 0,
            watch: evac.watch,
        }
    }

    /// The same operation was sent again (same `corr`, new command `cmd`):
    /// finished gears stay finished; failed ones are retried, towards the
    /// target the new command names; gears new to the plan are added.
    /// Returns true when there is work to do.
    pub fn resend(
        &mut self,
        cmd: Uuid,
        evac: &Evacuate,
        default_parallelism: u32,
        now: DateTime<Utc>,
    ) -> bool {
        let mut work = false;
        for m in &evac.moves {
            match self.gears.iter_mut().find(|g| g.gear == m.gear) {
                Some(g) if matches!(g.status, GearStatus::Failed | GearStatus::Pending) => {
                    if g.status == GearStatus::Failed {
                        g.attempts = 0;
                        g.error = None;
                    }
                    g.status = GearStatus::Pending;
                    g.target = m.target.clone();
                    work = true;
                }
                Some(_) => {}
                None => {
                    self.gears.push(GearEntry {
                        gear: m.gear.clone(),
                        target: m.target.clone(),
                        status: GearStatus::Pending,
                        started: false,
                        attempts: 0,
                        error: None,
                    });
                    work = true;
                }
            }
        }
        work |= self.gears.iter().any(|g| g.status == GearStatus::Pending);
        self.cmd = cmd;
        self.updated_at = now;
        self.parallelism = evac
            .parallelism
            .unwrap_or(default_parallelism)
            .clamp(1, 256);
        self.deadline = evac.deadline;
        if work {
            self.finished = false;
            self.done_published = false;
        }
        work
    }

    /// The next pending gear not already in flight.
    pub fn next_to_start(&self, in_flight: &HashSet<usize>) -> Option<usize> {
        self.gears
            .iter()
            .enumerate()
            .find(|(i, g)| g.status == GearStatus::Pending && !in_flight.contains(i))
            .map(|(i, _)| i)
    }

    /// Records how gear `idx` ended; returns its result for the progress event.
    pub fn record(
        &mut self,
        idx: usize,
        outcome: Result<MoveOutcome, String>,
        attempts: u32,
        now: DateTime<Utc>,
    ) -> GearResult {
        let g = &mut self.gears[idx];
        g.attempts = attempts;
        match outcome {
            Ok(MoveOutcome::Moved) => g.status = GearStatus::Moved,
            Ok(MoveOutcome::AlreadyMoved) => g.status = GearStatus::AlreadyMoved,
            Ok(MoveOutcome::Missing) => g.status = GearStatus::Missing,
            Err(e) => {
                g.status = GearStatus::Failed;
                g.error = Some(truncate(&e));
            }
        }
        self.updated_at = now;
        result_of(g).unwrap_or_else(|| unreachable_result(g))
    }

    /// Marks every pending gear failed with `reason` (deadline passed, cancelled).
    pub fn fail_pending(&mut self, reason: &str, now: DateTime<Utc>) -> Vec<GearResult> {
        let mut out = Vec::new();
        for g in self
            .gears
            .iter_mut()
            .filter(|g| g.status == GearStatus::Pending)
        {
            g.status = GearStatus::Failed;
            g.error = Some(truncate(reason));
            out.extend(result_of(g));
        }
        self.updated_at = now;
        out
    }

    /// Whether no gear is pending.
    pub fn is_complete(&self) -> bool {
        self.gears.iter().all(|g| g.status.is_final())
    }

    /// (moved, failed, remaining, total); moved includes already-moved and missing gears.
    pub fn counts(&self) -> (u32, u32, u32, u32) {
        let mut moved = 0;
        let mut failed = 0;
        let mut remaining = 0;
        for g in &self.gears {
            match g.status {
                GearStatus::Pending => remaining += 1,
                GearStatus::Failed => failed += 1,
                _ => moved += 1,
            }
        }
        (moved, failed, remaining, self.gears.len() as u32)
    }

    /// Every finished gear's result.
    pub fn results(&self) -> Vec<GearResult> {
        self.gears.iter().filter_map(result_of).collect()
    }

    /// The progress event after `results` finished.
    pub fn progress(&self, results: Vec<GearResult>) -> Progress {
        let (moved, failed, remaining, total) = self.counts();
        Progress {
            cmd: self.cmd,
            moved,
            failed,
            remaining,
            total,
            results,
        }
    }

    /// The operation as reports show it.
    pub fn status(&self) -> OperationStatus {
        let (moved, failed, remaining, total) = self.counts();
        OperationStatus {
            corr: self.corr.clone(),
            command: "cmd.evacuate".into(),
            moved,
            failed,
            remaining,
            total,
        }
    }

    /// The `event.done` result of a finished plan.
    pub fn result(&self) -> CommandResult {
        let (moved, failed, _, _) = self.counts();
        CommandResult::Evacuated {
            moved,
            failed,
            results: self.results(),
            gears_left: self.gears_left,
        }
    }
}

fn truncate(s: &str) -> String {
    const MAX: usize = 1024;
    if s.len() <= MAX {
        return s.to_string();
    }
    let mut end = MAX;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

fn result_of(g: &GearEntry) -> Option<GearResult> {
    Some(GearResult {
        gear: g.gear.clone(),
        target: g.target.clone(),
        outcome: g.status.outcome()?,
        attempts: g.attempts,
        error: g.error.clone(),
    })
}

fn unreachable_result(g: &GearEntry) -> GearResult {
    // `record` always leaves the gear final; keep a total function anyway.
    GearResult {
        gear: g.gear.clone(),
        target: g.target.clone(),
        outcome: GearOutcome::Failed,
        attempts: g.attempts,
        error: g.error.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gearshift_proto::msg::Move;

    fn evac(moves: &[(&str, &str)], parallelism: Option<u32>) -> Evacuate {
        Evacuate {
            moves: moves
                .iter()
                .map(|(g, t)| Move {
                    gear: g.to_string(),
                    target: t.to_string(),
                })
                .collect(),
            parallelism,
            deadline: None,
            watch: false,
            epoch: 0,
        }
    }

    #[test]
    fn lifecycle_and_counts() {
        let now = Utc::now();
        let mut p = Plan::new(
            "op",
            Uuid::new_v4(),
            &evac(&[("a", "n2"), ("b", "n2"), ("c", "n3")], None),
            4,
            now,
        );
        assert_eq!(p.parallelism, 4);
        assert_eq!(p.counts(), (0, 0, 3, 3));
        let mut flight = HashSet::new();
        assert_eq!(p.next_to_start(&flight), Some(0));
        flight.insert(0);
        assert_eq!(p.next_to_start(&flight), Some(1));
        let r = p.record(0, Ok(MoveOutcome::Moved), 1, now);
        assert_eq!(r.outcome, GearOutcome::Moved);
        p.record(1, Err("disk full".into()), 3, now);
        assert_eq!(p.counts(), (1, 1, 1, 3));
        assert!(!p.is_complete());
        let prog = p.progress(vec![r]);
        assert_eq!(
            (prog.moved, prog.failed, prog.remaining, prog.total),
            (1, 1, 1, 3)
        );
        p.record(2, Ok(MoveOutcome::Missing), 1, now);
        assert!(p.is_complete());
        match p.result() {
            CommandResult::Evacuated {
                moved,
                failed,
                results,
                ..
            } => {
                assert_eq!((moved, failed, results.len()), (2, 1, 3));
                assert_eq!(results[1].error.as_deref(), Some("disk full"));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn checkpoint_round_trips() {
        let now = Utc::now();
        let mut p = Plan::new(
            "op",
            Uuid::new_v4(),
            &evac(&[("a", "n2"), ("b", "n3")], Some(2)),
            4,
            now,
        );
        p.gears[0].started = true;
        p.record(1, Ok(MoveOutcome::AlreadyMoved), 2, now);
        let text = serde_json::to_string(&p).unwrap();
        let back: Plan = serde_json::from_str(&text).unwrap();
        assert_eq!(back, p);
        assert_eq!(back.next_to_start(&HashSet::new()), Some(0));
        assert!(
            back.gears[0].started,
            "resumed gears know a move may have begun"
        );
    }

    #[test]
    fn resend_resumes_and_retries_failed_gears_only() {
        let now = Utc::now();
        let first = Uuid::new_v4();
        let mut p = Plan::new(
            "op",
            first,
            &evac(&[("a", "n2"), ("b", "n2")], None),
            4,
            now,
        );
        p.record(0, Ok(MoveOutcome::Moved), 1, now);
        p.record(1, Err("boom".into()), 3, now);
        p.finished = true;
        p.done_published = true;
        let second = Uuid::new_v4();
        // Same moves again: only the failed gear is retried, to its (new) target.
        assert!(p.resend(second, &evac(&[("a", "n9"), ("b", "n3")], Some(2)), 4, now));
        assert_eq!(p.cmd, second);
        assert!(!p.finished && !p.done_published);
        assert_eq!(p.gears[0].status, GearStatus::Moved);
        assert_eq!(p.gears[0].target, "n2", "a finished gear keeps its target");
        assert_eq!(p.gears[1].status, GearStatus::Pending);
        assert_eq!(p.gears[1].target, "n3");
        assert_eq!(p.parallelism, 2);
        p.record(1, Ok(MoveOutcome::Moved), 1, now);
        p.finished = true;
        // Nothing left to do: a resend does not reopen the plan.
        assert!(!p.resend(
            Uuid::new_v4(),
            &evac(&[("a", "n2"), ("b", "n3")], None),
            4,
            now
        ));
        assert!(p.finished);
    }

    #[test]
    fn deadline_fails_what_is_pending() {
        let now = Utc::now();
        let mut p = Plan::new(
            "op",
            Uuid::new_v4(),
            &evac(&[("a", "n2"), ("b", "n2")], None),
            4,
            now,
        );
        p.record(0, Ok(MoveOutcome::Moved), 1, now);
        let r = p.fail_pending("deadline passed", now);
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].gear, "b");
        assert_eq!(p.counts(), (1, 1, 0, 2));
        assert_eq!(
            operation_id(None, Uuid::nil()),
            format!("cmd-{}", Uuid::nil())
        );
        assert_eq!(operation_id(Some("op"), Uuid::nil()), "op");
    }
}
