//! Evacuation: moving a list of gears off the node, crash-safely.
//!
//! The node core ([`crate::core`]) keeps the [`plan::Plan`] and decides
//! which gear starts when (bounded parallelism, checkpoints, resumption,
//! abort, deadline). The [`Mover`] carries out the moves it starts:
//!
//! - per-gear retries with exponential backoff, for retryable errors only
//!   ([`RuntimeError::is_retryable`](crate::runtime::RuntimeError::is_retryable)),
//!   never past the plan's deadline;
//! - gears that were in flight before a crash are handed to the runtime with
//!   [`MoveCtx::resumed`](crate::runtime::MoveCtx::resumed), so that it
//!   completes a half-done move rather than starting over;
//! - stopping (SIGTERM): moves in flight get the grace period to finish,
//!   then are interrupted at a safe point ([`crate::core::MoveResult::Interrupted`]);
//! - cancelling one evacuation (abort): its moves stop between attempts.

pub mod plan;

use std::collections::HashMap;
use std::time::Duration;

use chrono::Utc;
use futures::FutureExt;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::core::{MoveDone, MoveResult, MoveStart};
use crate::runtime::{MoveCtx, MoveOutcome, RuntimeError, SharedRuntime};

/// Retry and shutdown settings of the moves.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Attempts per gear.
    pub attempts: u32,
    /// First backoff delay.
    pub backoff_min: Duration,
    /// Longest backoff delay.
    pub backoff_max: Duration,
    /// How long moves in flight may take to finish once the agent stops.
    pub grace: Duration,
}

/// Delay before retry number `attempt` (1-based), exponential with jitter.
pub fn retry_delay(attempt: u32, min: Duration, max: Duration) -> Duration {
    gearshift_bus::backoff(attempt.saturating_sub(1), min, max)
}

struct MoveJob {
    runtime: SharedRuntime,
    gear: String,
    target: String,
    resumed: bool,
    attempts: u32,
    backoff_min: Duration,
    backoff_max: Duration,
    /// Stop between attempts (stopping, aborting).
    soft: CancellationToken,
    /// Stop now, at the runtime's next safe point.
    hard: CancellationToken,
    deadline: Option<chrono::DateTime<Utc>>,
    /// Watch the gear leave instead of moving it.
    watch: bool,
}

/// How often a watched gear is looked for.
const WATCH_POLL: Duration = Duration::from_millis(500);

impl MoveJob {
    /// A broker-side move, seen from this node: done when the gear's
    /// directory is gone; failed at the deadline while it is still here.
    /// Read errors are retried until the deadline.
    async fn watch(self) -> (Result<MoveOutcome, RuntimeError>, u32) {
        let mut looks = 0;
        loop {
            looks += 1;
            match self.runtime.holds(&self.gear).await {
                Ok(false) => return (Ok(MoveOutcome::Moved), 1),
                Ok(true) => {}
                Err(e) => {
                    tracing::warn!(gear = %self.gear, error = %e, "watching a gear: cannot look")
                }
            }
            if self.deadline.is_some_and(|d| Utc::now() >= d) {
                let still = RuntimeError::Conflict {
                    gear: self.gear.clone(),
                    reason: format!(
                        "still on this node at the deadline (the broker agent moves it to {})",
                        self.target
                    ),
                };
                return (Err(still), 1);
            }
            tracing::trace!(gear = %self.gear, looks, "watched gear still here");
            tokio::select! {
                _ = tokio::time::sleep(WATCH_POLL) => {}
                _ = self.soft.cancelled() => return (Err(RuntimeError::Interrupted), 1),
                _ = self.hard.cancelled() => return (Err(RuntimeError::Interrupted), 1),
            }
        }
    }

    async fn run(self) -> (Result<MoveOutcome, RuntimeError>, u32) {
        if self.watch {
            return self.watch().await;
        }
        let mut attempt = 0;
        loop {
            attempt += 1;
            let ctx = MoveCtx {
                resumed: self.resumed || attempt > 1,
                cancel: self.hard.clone(),
            };
            let err = match self.runtime.move_gear(&self.gear, &self.target, &ctx).await {
                Ok(o) => return (Ok(o), attempt),
                Err(e) => e,
            };
            if err == RuntimeError::Interrupted || !err.is_retryable() || attempt >= self.attempts {
                return (Err(err), attempt);
            }
            let delay = retry_delay(attempt, self.backoff_min, self.backoff_max);
            if let Some(d) = self.deadline
                && Utc::now() + chrono::Duration::from_std(delay).unwrap_or_default() >= d
            {
                return (Err(err), attempt);
            }
            tracing::warn!(gear = %self.gear, target = %self.target, attempt, error = %err,
                retry_in = ?delay, "move failed; retrying");
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = self.soft.cancelled() => return (Err(RuntimeError::Interrupted), attempt),
            }
        }
    }
}

/// Runs the moves the core starts, each as a tracked task, and hands their
/// results back in the order they end.
pub struct Mover {
    runtime: SharedRuntime,
    tracker: TaskTracker,
    tx: mpsc::UnboundedSender<MoveDone>,
    rx: mpsc::UnboundedReceiver<MoveDone>,
    in_flight: usize,
    /// Per evacuation: its soft-cancel token and moves in flight.
    ops: HashMap<String, (CancellationToken, usize)>,
    soft_all: CancellationToken,
    hard: CancellationToken,
    grace_until: Option<tokio::time::Instant>,
}

impl std::fmt::Debug for Mover {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mover")
            .field("in_flight", &self.in_flight)
            .finish_non_exhaustive()
    }
}

impl Mover {
    /// A mover on `runtime` whose tasks `tracker` tracks.
    pub fn new(runtime: SharedRuntime, tracker: TaskTracker) -> Mover {
        let (tx, rx) = mpsc::unbounded_channel();
        Mover {
            runtime,
            tracker,
            tx,
            rx,
            in_flight: 0,
            ops: HashMap::new(),
            soft_all: CancellationToken::new(),
            hard: CancellationToken::new(),
            grace_until: None,
        }
    }

    /// Moves in flight.
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// Starts one move.
    pub fn start(&mut self, m: MoveStart, settings: &Settings) {
        let entry = self
            .ops
            .entry(m.op.clone())
            .or_insert_with(|| (self.soft_all.child_token(), 0));
        entry.1 += 1;
        self.in_flight += 1;
        let job = MoveJob {
            runtime: self.runtime.clone(),
            gear: m.gear,
            target: m.target,
            resumed: m.resumed,
            attempts: settings.attempts.max(1),
            backoff_min: settings.backoff_min,
            backoff_max: settings.backoff_max,
            soft: entry.0.clone(),
            hard: self.hard.clone(),
            deadline: m.deadline,
            watch: m.watch,
        };
        let tx = self.tx.clone();
        let (op, idx) = (m.op, m.idx);
        self.tracker.spawn(async move {
            let (result, attempts) =
                match std::panic::AssertUnwindSafe(job.run()).catch_unwind().await {
                    Ok((Ok(o), attempts)) => (MoveResult::Done(o), attempts),
                    Ok((Err(RuntimeError::Interrupted), attempts)) => {
                        (MoveResult::Interrupted, attempts)
                    }
                    Ok((Err(e), attempts)) => (MoveResult::Failed(e.to_string()), attempts),
                    Err(_) => {
                        tracing::error!(op = %op, idx, "move task panicked");
                        (MoveResult::Failed("(move task): panicked".into()), 1)
                    }
                };
            let _ = tx.send(MoveDone {
                op,
                idx,
                result,
                attempts,
            });
        });
    }

    /// Stops the moves of evacuation `op` between attempts.
    pub fn cancel(&mut self, op: &str) {
        if let Some((t, _)) = self.ops.get(op) {
            t.cancel();
        }
    }

    /// The agent stops: no move retries; moves in flight get `grace` to
    /// finish, then are interrupted at their next safe point.
    pub fn stop(&mut self, grace: Duration) {
        if self.grace_until.is_none() {
            tracing::info!(
                in_flight = self.in_flight,
                ?grace,
                "stopping: letting moves in flight finish"
            );
            self.soft_all.cancel();
            self.grace_until = Some(tokio::time::Instant::now() + grace);
        }
    }

    /// The next move that ends; never returns while nothing is in flight.
    pub async fn next(&mut self) -> MoveDone {
        loop {
            let grace = self.grace_until.filter(|_| !self.hard.is_cancelled());
            tokio::select! {
                Some(done) = self.rx.recv(), if self.in_flight > 0 => {
                    self.in_flight -= 1;
                    if let Some(e) = self.ops.get_mut(&done.op) {
                        e.1 -= 1;
                        if e.1 == 0 {
                            self.ops.remove(&done.op);
                        }
                    }
                    return done;
                }
                _ = sleep_until(grace) => {
                    tracing::warn!(in_flight = self.in_flight,
                        "grace period over: interrupting moves in flight (they resume at the next start)");
                    self.hard.cancel();
                }
                else => std::future::pending::<()>().await,
            }
        }
    }
}

async fn sleep_until(t: Option<tokio::time::Instant>) {
    match t {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::NodeFacts;
    use crate::runtime::sim::{SimRuntime, SimWorld};

    fn start(w: &std::sync::Arc<SimWorld>, gear: &str, deadline_ms: i64) -> Mover {
        let rt: SharedRuntime = std::sync::Arc::new(SimRuntime::new(w.clone(), "a"));
        let mut mover = Mover::new(rt, TaskTracker::new());
        let settings = Settings {
            attempts: 3,
            backoff_min: Duration::from_millis(10),
            backoff_max: Duration::from_millis(10),
            grace: Duration::from_secs(1),
        };
        mover.start(
            MoveStart {
                op: "op".into(),
                idx: 0,
                gear: gear.into(),
                target: "b".into(),
                resumed: false,
                deadline: Some(Utc::now() + chrono::Duration::milliseconds(deadline_ms)),
                watch: true,
            },
            &settings,
        );
        mover
    }

    fn world() -> std::sync::Arc<SimWorld> {
        let w = SimWorld::new();
        for n in ["a", "b"] {
            w.add_node(
                n,
                NodeFacts {
                    profile: "small".into(),
                    max_active_gears: 10,
                    district: None,
                },
            );
        }
        w.populate("a", 2, 0);
        w
    }

    #[tokio::test]
    async fn a_watched_gear_is_moved_when_it_leaves_and_never_moved_from_here() {
        let w = world();
        let mut mover = start(&w, "a-g0", 30_000);
        tokio::time::sleep(Duration::from_millis(700)).await;
        assert_eq!(
            w.locate("a-g0"),
            vec!["a".to_string()],
            "the node moves nothing"
        );
        assert_eq!(w.moves(), 0);
        // Elsewhere (the broker agent's oo-admin-move) the gear leaves.
        assert!(w.remove_gear("a-g0"));
        let done = tokio::time::timeout(Duration::from_secs(10), mover.next())
            .await
            .expect("the watch ends");
        assert_eq!(done.result, MoveResult::Done(MoveOutcome::Moved));
    }

    #[tokio::test]
    async fn a_watched_gear_still_here_at_the_deadline_fails() {
        let w = world();
        let mut mover = start(&w, "a-g1", 200);
        let done = tokio::time::timeout(Duration::from_secs(10), mover.next())
            .await
            .expect("the watch ends");
        let MoveResult::Failed(e) = done.result else {
            panic!("{:?}", done.result)
        };
        assert!(e.contains("still on this node at the deadline"), "{e}");
        assert_eq!(w.locate("a-g1"), vec!["a".to_string()]);
    }
}
