//! The core task with real moves: a [`Driver`] on a sim runtime and a state
//! directory, the bus left out (events stay in the outbox).

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use gearshift_proto::msg::{Evacuate, GearResult, Message, Move};
use gearshift_proto::{Envelope, KeyPair, Keyring, Role};
use tokio::time::Instant;
use uuid::Uuid;

use super::driver::Driver;
use super::{Agent, AgentConfig};
use crate::core::Input;
use crate::evacuate::plan::{self, Plan};
use crate::runtime::sim::{SimRuntime, SimWorld};
use crate::runtime::{MoveCtx, MoveOutcome, NodeFacts, RuntimeError, SharedRuntime};

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
        watch: false,
        epoch: 0,
    }
}

/// A core task for node `src` on `dir`, with fast retries.
fn driver(dir: &std::path::Path, rt: SharedRuntime) -> (Agent, Driver) {
    let broker = KeyPair::from_seed(&[9; 32]);
    let mut ring = Keyring::new();
    ring.add(broker.public(), Role::Broker, "broker");
    let mut cfg = AgentConfig::new("src", KeyPair::from_seed(&[8; 32]), ring, dir);
    cfg.evacuation.attempts = 3;
    cfg.evacuation.backoff_min = Duration::from_millis(1);
    cfg.evacuation.backoff_max = Duration::from_millis(5);
    cfg.shutdown_grace = Duration::from_secs(5);
    cfg.write_status_file = false;
    let bus = gearshift_bus::memory::MemoryBroker::new().connect("t");
    let agent = Agent::new(cfg, bus, rt).unwrap();
    let (core, _) = agent.start.lock().unwrap().take().unwrap();
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    let d = Driver::new(agent.shared.clone(), core, tx, rx);
    (agent, d)
}

/// Runs the plan until nothing is in flight; feeds `at` (after its delay)
/// on the way: [`Input::Stop`] also stops the mover.
async fn run(d: &mut Driver, plan: Plan, at: Option<(Duration, Input)>) {
    d.step(Input::Resume(vec![plan])).await;
    let mut at = at.map(|(after, i)| (Instant::now() + after, i));
    while d.mover.in_flight() > 0 {
        let when = at.as_ref().map(|(t, _)| *t);
        tokio::select! {
            m = d.mover.next() => d.step(Input::Moved(m)).await,
            _ = sleep_until(when) => {
                let Some((_, input)) = at.take() else { continue };
                if matches!(input, Input::Stop) {
                    d.mover.stop(Duration::from_secs(5));
                }
                d.step(input).await;
            }
        }
    }
}

async fn sleep_until(t: Option<Instant>) {
    match t {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
}

/// The plan the core holds for `op`.
fn plan_of(d: &Driver, op: &str) -> Plan {
    d.core
        .evacuations()
        .iter()
        .map(|e| e.plan())
        .find(|p| p.corr == op)
        .cloned()
        .expect("the core holds the plan")
}

/// (moved, failed, remaining, results) of each progress event queued.
type Seen = (u32, u32, u32, Vec<GearResult>);

fn progress(agent: &Agent) -> Vec<Seen> {
    agent
        .shared
        .outbox
        .take_events()
        .iter()
        .filter_map(|m| match Envelope::decode(&m.payload).ok()?.envelope.msg {
            Message::Progress(p) => Some((p.moved, p.failed, p.remaining, p.results)),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn moves_everything_with_progress_after_every_gear_and_retries() {
    let d = tempfile::tempdir().unwrap();
    let (w, rt) = world(12);
    w.fail_next_moves("src-g3", 2);
    w.fail_next_moves("src-g5", 10);
    let (agent, mut drv) = driver(d.path(), rt);
    let p = Plan::new("op", Uuid::new_v4(), &evac(&w, Some(3)), 4, Utc::now());
    run(&mut drv, p, None).await;
    let p = plan_of(&drv, "op");
    assert!(p.finished);
    assert_eq!(p.counts(), (11, 1, 0, 12));
    let events = progress(&agent);
    assert_eq!(events.len(), 12, "one progress event per gear");
    assert_eq!(events.last().unwrap().2, 0);
    let g3 = p.gears.iter().find(|g| g.gear == "src-g3").unwrap();
    assert_eq!((g3.status, g3.attempts), (plan::GearStatus::Moved, 3));
    let g5 = p.gears.iter().find(|g| g.gear == "src-g5").unwrap();
    assert_eq!((g5.status, g5.attempts), (plan::GearStatus::Failed, 3));
    assert_eq!(w.gears_of("src").len(), 1);
    let path = agent.shared.state.checkpoint_path("op");
    let saved: Plan = crate::state::read_json(&path).unwrap().unwrap();
    assert_eq!(saved, p, "the checkpoint holds the final plan");
}

#[tokio::test]
async fn parallelism_is_bounded() {
    let d = tempfile::tempdir().unwrap();
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
    let (_agent, mut drv) = driver(d.path(), rt);
    let p = Plan::new("op", Uuid::new_v4(), &evac(&w, Some(3)), 4, Utc::now());
    run(&mut drv, p, None).await;
    assert_eq!(plan_of(&drv, "op").counts(), (20, 0, 0, 20));
    assert_eq!(counting.max.load(std::sync::atomic::Ordering::SeqCst), 3);
}

#[tokio::test]
async fn shutdown_keeps_pending_gears_for_the_next_start() {
    let d = tempfile::tempdir().unwrap();
    let (w, rt) = world(10);
    w.set_move_time(Duration::from_millis(20));
    let (agent, mut drv) = driver(d.path(), rt.clone());
    let p = Plan::new("op", Uuid::new_v4(), &evac(&w, Some(2)), 4, Utc::now());
    run(&mut drv, p, Some((Duration::from_millis(50), Input::Stop))).await;
    assert!(drv.core.settled());
    let p = plan_of(&drv, "op");
    assert!(!p.finished, "interrupted");
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
    let path = agent.shared.state.checkpoint_path("op");
    let resumed: Plan = crate::state::read_json(&path).unwrap().unwrap();
    assert_eq!(resumed, p);
    agent.shared.state.unlock();
    drop((agent, drv));
    let (_agent, mut drv) = driver(d.path(), rt);
    run(&mut drv, resumed, None).await;
    let resumed = plan_of(&drv, "op");
    assert!(resumed.finished);
    assert_eq!(resumed.counts(), (10, 0, 0, 10));
    for g in resumed.gears.iter() {
        assert_eq!(w.locate(&g.gear), vec![g.target.clone()]);
        assert_eq!(g.status, plan::GearStatus::Moved, "no gear moved twice");
    }
}

#[tokio::test]
async fn abort_and_deadline_fail_the_rest() {
    let d = tempfile::tempdir().unwrap();
    let (w, rt) = world(10);
    w.set_move_time(Duration::from_millis(20));
    let (_agent, mut drv) = driver(d.path(), rt);
    let p = Plan::new("op", Uuid::new_v4(), &evac(&w, Some(1)), 4, Utc::now());
    let abort = Input::Abort("node re-activated".into());
    run(&mut drv, p, Some((Duration::from_millis(50), abort))).await;
    let p = plan_of(&drv, "op");
    assert!(p.finished);
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

    let d = tempfile::tempdir().unwrap();
    let (w, rt) = world(3);
    let (_agent, mut drv) = driver(d.path(), rt);
    let mut e = evac(&w, None);
    e.deadline = Some(Utc::now() - chrono::Duration::seconds(1));
    let p = Plan::new("op2", Uuid::new_v4(), &e, 4, Utc::now());
    run(&mut drv, p, None).await;
    assert_eq!(plan_of(&drv, "op2").counts(), (0, 3, 0, 3));
    assert_eq!(
        w.gears_of("src").len(),
        3,
        "nothing moved after the deadline"
    );
}
