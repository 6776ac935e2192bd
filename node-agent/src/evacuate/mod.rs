//! Evacuation: move a list of gears off the node, crash-safely.
//!
//! - Bounded parallelism (the command's `parallelism`, else the configured
//!   default of 4).
//! - Per-gear retries with exponential backoff, for retryable errors only
//!   ([`RuntimeError::is_retryable`](crate::runtime::RuntimeError::is_retryable)).
//! - A checkpoint ([`plan::Plan`]) after every gear, and before launching
//!   gears the plan had not started yet; a progress event after every gear.
//! - After SIGKILL and restart the plan is loaded and resumed: finished gears
//!   are never moved again, and gears that were in flight are handed to the
//!   runtime with [`MoveCtx::resumed`](crate::runtime::MoveCtx::resumed) so
//!   that it completes a half-done move rather than starting over.
//! - Stopping (SIGTERM): no new move starts; moves in flight get the grace
//!   period to finish and be checkpointed, then are interrupted at a safe
//!   point and stay pending for the next start.
//! - Aborting (`cmd.activate` during an evacuation) or passing the deadline:
//!   no new move starts, moves in flight finish, pending gears are reported
//!   failed with the reason.

pub mod plan;

use std::collections::HashSet;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::Utc;
use gearshift_proto::msg::GearResult;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::runtime::{MoveCtx, MoveOutcome, RuntimeError, SharedRuntime};
use crate::state::{StateDir, StateError};
use plan::Plan;

/// Retry and shutdown settings of a run.
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

/// What a run reports as it goes.
pub trait Sink: Send + Sync {
    /// Gear results were recorded and checkpointed.
    fn progress(&self, plan: &Plan, results: Vec<GearResult>);
    /// A checkpoint could not be written (the run goes on; moves are idempotent).
    fn checkpoint_failed(&self, err: &StateError);
}

/// Asks a running evacuation to stop early, with a reason.
#[derive(Debug, Default)]
pub struct Abort {
    token: CancellationToken,
    reason: Mutex<Option<String>>,
}

impl Abort {
    /// A fresh abort handle.
    pub fn new() -> Arc<Abort> {
        Arc::new(Abort::default())
    }

    /// Stops the evacuation: no new move starts; pending gears fail with `reason`.
    pub fn abort(&self, reason: &str) {
        if let Ok(mut r) = self.reason.lock()
            && r.is_none()
        {
            *r = Some(reason.to_string());
        }
        self.token.cancel();
    }

    fn reason(&self) -> Option<String> {
        self.reason.lock().ok().and_then(|r| r.clone())
    }
}

/// How a run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunEnd {
    /// Every gear is final; the plan is marked finished (and checkpointed).
    Finished,
    /// The agent is stopping; pending gears resume at the next start.
    Interrupted,
}

/// Writes the checkpoint (off the async threads).
pub async fn save(state: &Arc<StateDir>, path: &Path, plan: &Plan) -> Result<(), StateError> {
    let state = state.clone();
    let path = path.to_path_buf();
    let plan = plan.clone();
    tokio::task::spawn_blocking(move || state.write(&path, &plan))
        .await
        .map_err(|e| StateError::Io {
            path: "(checkpoint task)".into(),
            reason: e.to_string(),
        })?
}

async fn checkpoint(state: &Arc<StateDir>, path: &Path, plan: &mut Plan, sink: &dyn Sink) {
    plan.updated_at = Utc::now();
    if let Err(e) = save(state, path, plan).await {
        sink.checkpoint_failed(&e);
    }
}

/// Delay before retry number `attempt` (1-based), exponential with jitter.
pub fn retry_delay(attempt: u32, min: Duration, max: Duration) -> Duration {
    gearshift_bus::backoff(attempt.saturating_sub(1), min, max)
}

/// A move's outcome and the attempts it took.
type MoveResult = (Result<MoveOutcome, RuntimeError>, u32);

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
}

impl MoveJob {
    async fn run(self) -> MoveResult {
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

/// Runs `plan` until every gear is final or the agent stops.
#[allow(clippy::too_many_arguments)]
pub async fn run(
    plan: &mut Plan,
    path: &Path,
    state: &Arc<StateDir>,
    runtime: &SharedRuntime,
    settings: &Settings,
    sink: &dyn Sink,
    shutdown: &CancellationToken,
    abort: &Abort,
) -> RunEnd {
    let soft = CancellationToken::new();
    let hard = CancellationToken::new();
    let mut jobs: JoinSet<(usize, MoveResult)> = JoinSet::new();
    let mut in_flight: HashSet<usize> = HashSet::new();
    let mut task_gear: std::collections::HashMap<tokio::task::Id, usize> = Default::default();
    let mut grace_deadline: Option<tokio::time::Instant> = None;
    let mut hard_cancelled = false;
    let mut aborted = false;

    loop {
        let stopping = shutdown.is_cancelled();
        let past_deadline = plan.deadline.is_some_and(|d| Utc::now() >= d);
        if !stopping && !aborted && !past_deadline {
            let mut launch = Vec::new();
            while in_flight.len() + launch.len() < plan.parallelism as usize {
                let mut taken: HashSet<usize> = in_flight.clone();
                taken.extend(launch.iter().map(|(i, _)| *i));
                let Some(i) = plan.next_to_start(&taken) else {
                    break;
                };
                launch.push((i, plan.gears[i].started));
            }
            if launch.iter().any(|(_, was_started)| !was_started) {
                for (i, _) in &launch {
                    plan.gears[*i].started = true;
                }
                checkpoint(state, path, plan, sink).await;
            }
            for (i, was_started) in launch {
                in_flight.insert(i);
                let job = MoveJob {
                    runtime: runtime.clone(),
                    gear: plan.gears[i].gear.clone(),
                    target: plan.gears[i].target.clone(),
                    resumed: was_started,
                    attempts: settings.attempts.max(1),
                    backoff_min: settings.backoff_min,
                    backoff_max: settings.backoff_max,
                    soft: soft.clone(),
                    hard: hard.clone(),
                    deadline: plan.deadline,
                };
                let handle = jobs.spawn(async move { (i, job.run().await) });
                task_gear.insert(handle.id(), i);
            }
        }
        if in_flight.is_empty() {
            break;
        }
        let deadline_sleep = async {
            match plan.deadline {
                Some(d) if !past_deadline => {
                    let left = (d - Utc::now()).to_std().unwrap_or_default();
                    tokio::time::sleep(left).await
                }
                _ => std::future::pending().await,
            }
        };
        let gd = if hard_cancelled { None } else { grace_deadline };
        let grace = async move {
            match gd {
                Some(t) => tokio::time::sleep_until(t).await,
                None => std::future::pending().await,
            }
        };
        let shutdown_seen = grace_deadline.is_some();
        tokio::select! {
            joined = jobs.join_next_with_id() => {
                let (i, result, attempts) = match joined {
                    None => continue,
                    Some(Ok((id, (i, (result, attempts))))) => {
                        task_gear.remove(&id);
                        (i, result, attempts)
                    }
                    Some(Err(e)) => {
                        // A move task panicked: that gear failed.
                        let Some(i) = task_gear.remove(&e.id()) else { continue };
                        tracing::error!(gear = %plan.gears[i].gear, error = %e, "move task failed");
                        (i, Err(RuntimeError::Io { path: "(move task)".into(), reason: e.to_string() }), 1)
                    }
                };
                in_flight.remove(&i);
                if result == Err(RuntimeError::Interrupted) {
                    // Stays pending; resumes at the next start (or fails below if aborted).
                    continue;
                }
                let r = plan.record(i, result.map_err(|e| e.to_string()), attempts, Utc::now());
                checkpoint(state, path, plan, sink).await;
                sink.progress(plan, vec![r]);
            }
            _ = shutdown.cancelled(), if !shutdown_seen => {
                tracing::info!(in_flight = in_flight.len(), grace = ?settings.grace,
                    "stopping: letting moves in flight finish");
                soft.cancel();
                grace_deadline = Some(tokio::time::Instant::now() + settings.grace);
            }
            _ = grace => {
                tracing::warn!(in_flight = in_flight.len(),
                    "grace period over: interrupting moves in flight (they resume at the next start)");
                hard.cancel();
                hard_cancelled = true;
            }
            _ = abort.token.cancelled(), if !aborted => {
                aborted = true;
                soft.cancel();
            }
            _ = deadline_sleep => {}
        }
    }

    if shutdown.is_cancelled() && !plan.is_complete() {
        checkpoint(state, path, plan, sink).await;
        return RunEnd::Interrupted;
    }
    if !plan.is_complete() {
        let reason = if aborted {
            format!(
                "cancelled: {}",
                abort
                    .reason()
                    .unwrap_or_else(|| "evacuation aborted".into())
            )
        } else {
            "deadline passed before the move started".to_string()
        };
        let results = plan.fail_pending(&reason, Utc::now());
        checkpoint(state, path, plan, sink).await;
        sink.progress(plan, results);
    }
    RunEnd::Finished
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::NodeFacts;
    use crate::runtime::sim::{SimRuntime, SimWorld};
    use gearshift_proto::msg::{Evacuate, Move};
    use uuid::Uuid;

    /// (moved, failed, remaining, results) of one progress event.
    type Seen = (u32, u32, u32, Vec<GearResult>);

    #[derive(Default)]
    struct Recorder {
        events: Mutex<Vec<Seen>>,
    }

    impl Sink for Recorder {
        fn progress(&self, plan: &Plan, results: Vec<GearResult>) {
            let (m, f, r, _) = plan.counts();
            self.events.lock().unwrap().push((m, f, r, results));
        }
        fn checkpoint_failed(&self, err: &StateError) {
            panic!("checkpoint failed: {err}");
        }
    }

    fn world(n: u32) -> (Arc<SimWorld>, SharedRuntime) {
        let w = SimWorld::new();
        let facts = NodeFacts {
            profile: "small".into(),
            max_active_gears: 100,
            district: None,
        };
        for node in ["src", "t1", "t2"] {
            w.add_node(node, facts.clone());
        }
        w.populate("src", n, 0);
        let rt: SharedRuntime = Arc::new(SimRuntime::new(w.clone(), "src"));
        (w, rt)
    }

    fn evac(w: &SimWorld, parallelism: Option<u32>) -> Evacuate {
        Evacuate {
            moves: w
                .gears_of("src")
                .iter()
                .enumerate()
                .map(|(i, g)| Move {
                    gear: g.id.clone(),
                    target: if i % 2 == 0 { "t1" } else { "t2" }.into(),
                })
                .collect(),
            parallelism,
            deadline: None,
        }
    }

    fn settings() -> Settings {
        Settings {
            attempts: 3,
            backoff_min: Duration::from_millis(1),
            backoff_max: Duration::from_millis(5),
            grace: Duration::from_secs(5),
        }
    }

    #[tokio::test]
    async fn moves_everything_with_progress_after_every_gear_and_retries() {
        let d = tempfile::tempdir().unwrap();
        let state = Arc::new(StateDir::open(d.path(), true).unwrap());
        let (w, rt) = world(12);
        w.fail_next_moves("src-g3", 2);
        w.fail_next_moves("src-g5", 10);
        let mut p = Plan::new("op", Uuid::new_v4(), &evac(&w, Some(3)), 4, Utc::now());
        let path = state.checkpoint_path("op");
        let rec = Recorder::default();
        let end = run(
            &mut p,
            &path,
            &state,
            &rt,
            &settings(),
            &rec,
            &CancellationToken::new(),
            &Abort::default(),
        )
        .await;
        assert_eq!(end, RunEnd::Finished);
        assert_eq!(p.counts(), (11, 1, 0, 12));
        let events = rec.events.lock().unwrap();
        assert_eq!(events.len(), 12, "one progress event per gear");
        assert_eq!(events.last().unwrap().2, 0);
        let g3 = p.gears.iter().find(|g| g.gear == "src-g3").unwrap();
        assert_eq!((g3.status, g3.attempts), (plan::GearStatus::Moved, 3));
        let g5 = p.gears.iter().find(|g| g.gear == "src-g5").unwrap();
        assert_eq!((g5.status, g5.attempts), (plan::GearStatus::Failed, 3));
        assert_eq!(w.gears_of("src").len(), 1);
        let saved: Plan = crate::state::read_json(&path).unwrap().unwrap();
        assert_eq!(saved, p, "the checkpoint holds the final plan");
    }

    #[tokio::test]
    async fn parallelism_is_bounded() {
        let d = tempfile::tempdir().unwrap();
        let state = Arc::new(StateDir::open(d.path(), false).unwrap());
        let (w, _) = world(20);
        struct Counting {
            inner: SharedRuntime,
            now: std::sync::atomic::AtomicUsize,
            max: std::sync::atomic::AtomicUsize,
        }
        #[async_trait::async_trait]
        impl crate::runtime::GearRuntime for Counting {
            fn kind(&self) -> &'static str {
                "counting"
            }
            async fn inventory(&self) -> Result<crate::runtime::Inventory, RuntimeError> {
                self.inner.inventory().await
            }
            async fn move_gear(
                &self,
                g: &str,
                t: &str,
                c: &MoveCtx,
            ) -> Result<MoveOutcome, RuntimeError> {
                use std::sync::atomic::Ordering::SeqCst;
                let n = self.now.fetch_add(1, SeqCst) + 1;
                self.max.fetch_max(n, SeqCst);
                tokio::time::sleep(Duration::from_millis(5)).await;
                let r = self.inner.move_gear(g, t, c).await;
                self.now.fetch_sub(1, SeqCst);
                r
            }
        }
        let counting = Arc::new(Counting {
            inner: Arc::new(SimRuntime::new(w.clone(), "src")),
            now: Default::default(),
            max: Default::default(),
        });
        let rt: SharedRuntime = counting.clone();
        let mut p = Plan::new("op", Uuid::new_v4(), &evac(&w, Some(3)), 4, Utc::now());
        let rec = Recorder::default();
        run(
            &mut p,
            &state.checkpoint_path("op"),
            &state,
            &rt,
            &settings(),
            &rec,
            &CancellationToken::new(),
            &Abort::default(),
        )
        .await;
        assert_eq!(p.counts(), (20, 0, 0, 20));
        assert_eq!(counting.max.load(std::sync::atomic::Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn shutdown_keeps_pending_gears_for_the_next_start() {
        let d = tempfile::tempdir().unwrap();
        let state = Arc::new(StateDir::open(d.path(), true).unwrap());
        let (w, rt) = world(10);
        w.set_move_time(Duration::from_millis(20));
        let mut p = Plan::new("op", Uuid::new_v4(), &evac(&w, Some(2)), 4, Utc::now());
        let path = state.checkpoint_path("op");
        let rec = Recorder::default();
        let shutdown = CancellationToken::new();
        let s2 = shutdown.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            s2.cancel();
        });
        let end = run(
            &mut p,
            &path,
            &state,
            &rt,
            &settings(),
            &rec,
            &shutdown,
            &Abort::default(),
        )
        .await;
        assert_eq!(end, RunEnd::Interrupted);
        let (moved, failed, remaining, _) = p.counts();
        assert!(
            moved > 0 && remaining > 0 && failed == 0,
            "{:?}",
            p.counts()
        );
        assert_eq!(
            w.gears_of("src").len() as u32,
            remaining,
            "in-flight moves finished and were recorded"
        );
        // Resume from the checkpoint, as a restarted agent does.
        let mut resumed: Plan = crate::state::read_json(&path).unwrap().unwrap();
        assert_eq!(resumed, p);
        let end = run(
            &mut resumed,
            &path,
            &state,
            &rt,
            &settings(),
            &rec,
            &CancellationToken::new(),
            &Abort::default(),
        )
        .await;
        assert_eq!(end, RunEnd::Finished);
        assert_eq!(resumed.counts(), (10, 0, 0, 10));
        for g in resumed.gears.iter() {
            assert_eq!(w.locate(&g.gear), vec![g.target.clone()]);
            assert_eq!(g.status, plan::GearStatus::Moved, "no gear moved twice");
        }
    }

    #[tokio::test]
    async fn abort_and_deadline_fail_the_rest() {
        let d = tempfile::tempdir().unwrap();
        let state = Arc::new(StateDir::open(d.path(), false).unwrap());
        let (w, rt) = world(10);
        w.set_move_time(Duration::from_millis(20));
        let mut p = Plan::new("op", Uuid::new_v4(), &evac(&w, Some(1)), 4, Utc::now());
        let abort = Abort::new();
        let a2 = abort.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            a2.abort("node re-activated");
        });
        let rec = Recorder::default();
        let end = run(
            &mut p,
            &state.checkpoint_path("op"),
            &state,
            &rt,
            &settings(),
            &rec,
            &CancellationToken::new(),
            &abort,
        )
        .await;
        assert_eq!(end, RunEnd::Finished);
        let (moved, failed, remaining, _) = p.counts();
        assert!(
            moved >= 1 && failed >= 1 && remaining == 0,
            "{:?}",
            p.counts()
        );
        let failed_gear = p
            .gears
            .iter()
            .find(|g| g.status == plan::GearStatus::Failed)
            .unwrap();
        assert_eq!(
            failed_gear.error.as_deref(),
            Some("cancelled: node re-activated")
        );

        let (w, rt) = world(3);
        let mut e = evac(&w, None);
        e.deadline = Some(Utc::now() - chrono::Duration::seconds(1));
        let mut p = Plan::new("op2", Uuid::new_v4(), &e, 4, Utc::now());
        run(
            &mut p,
            &state.checkpoint_path("op2"),
            &state,
            &rt,
            &settings(),
            &rec,
            &CancellationToken::new(),
            &Abort::default(),
        )
        .await;
        assert_eq!(p.counts(), (0, 3, 0, 3));
        assert_eq!(
            w.gears_of("src").len(),
            3,
            "nothing moved after the deadline"
        );
    }
}
