//! The scripted workload: gears are created where the placement service
//! says (a signed `placement.request` on the bus, answered by the placement
//! engine with the broker agent's view of the fleet) until the fleet must
//! grow; once the new node has joined, new applications land on it while
//! old ones retire (usage stays under the threshold); then old gears are
//! deleted until the fleet must shrink, and the demo waits for the
//! scale-down saga to finish.

use std::time::{Duration, Instant};

use chrono::Utc;
use gearshift_bus::SharedBus;
use gearshift_node::runtime::sim::SimWorld;
use gearshift_placement::cli::request_placement;
use gearshift_proto::msg::{ApplicationProperties, GearState, PlacementRequest, UserProperties};
use gearshift_proto::{KeyPair, Keyring};
use rand::rngs::StdRng;

use super::ledger::Ledger;

/// Where the script is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Phase {
    /// Waiting for every initial node's first report.
    Warmup,
    /// Creating gears until the fleet is over the scale-up threshold.
    Rise,
    /// Waiting for the new node to join.
    AwaitJoin,
    /// New gears, which land on the new node, while old ones retire.
    TopUp,
    /// Deleting gears until the fleet is under the compact threshold.
    Fall,
    /// Waiting for the scale-down saga to remove a node.
    AwaitScaleDown,
    /// Letting the last reports arrive.
    Settle,
    /// Finished.
    Done,
}

impl Phase {
    /// A short name for messages and the summary.
    pub fn name(self) -> &'static str {
        match self {
            Phase::Warmup => "warm-up",
            Phase::Rise => "rise",
            Phase::AwaitJoin => "waiting for the new node",
            Phase::TopUp => "top-up",
            Phase::Fall => "fall",
            Phase::AwaitScaleDown => "waiting for the scale-down",
            Phase::Settle => "settle",
            Phase::Done => "done",
        }
    }
}

/// What the workload needs to know about the fleet at each step.
#[derive(Debug, Clone, Copy, Default)]
pub struct FleetView {
    /// Initial nodes that the broker agent sees reporting.
    pub initial_reporting: usize,
    /// Nodes that joined after a scale-up.
    pub joined: usize,
    /// Scale-down sagas that removed their node.
    pub removed: usize,
    /// Operations in flight.
    pub in_flight: usize,
    /// Nodes in the world (booted, not deleted).
    pub world_nodes: usize,
}

/// How the workload reaches the placement service.
pub struct Placement {
    /// The client's bus.
    pub bus: SharedBus,
    /// The routing key the demo's placement service is bound to.
    pub key: String,
    /// The client's key (an operator key).
    pub signer: KeyPair,
    /// Who may answer (the broker key).
    pub trusted: Keyring,
    /// Requests sent.
    pub requests: u64,
    /// Requests refused (no node fits) or unanswered.
    pub refused: u64,
    /// The last refusal, for the summary.
    pub last_refusal: Option<String>,
}

impl std::fmt::Debug for Placement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Placement")
            .field("key", &self.key)
            .field("requests", &self.requests)
            .field("refused", &self.refused)
            .finish_non_exhaustive()
    }
}

impl Placement {
    /// Asks where a new gear of `app` goes.
    async fn place(&mut self, app: &str, profile: &str) -> Option<String> {
        self.requests += 1;
        let req = PlacementRequest {
            nodes: vec![],
            app: ApplicationProperties {
                id: app.to_string(),
                name: app.to_string(),
                web_cartridge: Some("php-5.4".into()),
                scalable: false,
                ha: false,
            },
            current_gears: vec![],
            components: vec![],
            user: UserProperties {
                id: "demo".into(),
                login: "demo".into(),
                ..Default::default()
            },
            request_time: Utc::now(),
            profile: Some(profile.to_string()),
            region: None,
            moving: None,
            strategy: None,
        };
        let r = request_placement(
            &self.bus,
            &self.key,
            &self.signer,
            "demo-workload",
            &self.trusted,
            req,
            Duration::from_secs(10),
        )
        .await;
        match r {
            Ok(reply) => match reply.node {
                Some(n) => Some(n),
                None => {
                    self.refused += 1;
                    self.last_refusal = reply.refused;
                    None
                }
            },
            Err(e) => {
                self.refused += 1;
                tracing::warn!(error = %e, "placement request failed");
                self.last_refusal = Some(e.to_string());
                None
            }
        }
    }
}

/// The script's state.
#[derive(Debug)]
pub struct Workload {
    /// Where it is.
    pub phase: Phase,
    /// Its record of every gear.
    pub ledger: Ledger,
    rng: StdRng,
    /// How the gears are placed.
    pub placement: Placement,
    nodes: usize,
    max_active: u32,
    profile: String,
    up_per_sec: f64,
    down_per_sec: f64,
    due: f64,
    last: Instant,
    target: usize,
    cap: usize,
    churn_left: usize,
    settle: Duration,
    settle_until: Option<Instant>,
    /// Highest active usage of the world seen, in percent.
    pub peak_usage: f64,
}

/// Share of the initial capacity the rise goes up to (above the 80 %
/// profile threshold).
const RISE_TO: f64 = 0.85;
/// Share of the grown capacity the top-up may reach (below the 80 % threshold).
const TOP_UP_TO: f64 = 0.76;
/// Share of the grown capacity the fall goes down to (below the 50 %
/// compact threshold, and low enough that one node's gears fit elsewhere).
const FALL_TO: f64 = 0.45;

impl Workload {
    /// A workload over `nodes` initial nodes of `max_active` active gears,
    /// creating `up_per_sec` and deleting `down_per_sec` gears a second.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        ledger: Ledger,
        rng: StdRng,
        placement: Placement,
        nodes: usize,
        max_active: u32,
        profile: &str,
        up_per_sec: f64,
        down_per_sec: f64,
        settle: Duration,
    ) -> Workload {
        Workload {
            phase: Phase::Warmup,
            ledger,
            rng,
            placement,
            nodes,
            max_active,
            profile: profile.to_string(),
            up_per_sec,
            down_per_sec,
            due: 0.0,
            last: Instant::now(),
            target: 0,
            cap: 0,
            churn_left: 0,
            settle,
            settle_until: None,
            peak_usage: 0.0,
        }
    }

    fn capacity(&self, nodes: usize) -> usize {
        nodes * self.max_active as usize
    }

    /// Active usage of the world in percent.
    pub fn usage(&self, world_nodes: usize) -> f64 {
        let cap = self.capacity(world_nodes);
        if cap == 0 {
            0.0
        } else {
            100.0 * self.ledger.expected_active() as f64 / cap as f64
        }
    }

    /// One step: creates or deletes what is due, moves to the next phase
    /// when its goal is reached. Returns a line for each phase change.
    pub async fn step(&mut self, world: &SimWorld, f: FleetView) -> Vec<String> {
        let now = Instant::now();
        let dt = now.duration_since(self.last).as_secs_f64().min(1.0);
        self.last = now;
        self.peak_usage = self.peak_usage.max(self.usage(f.world_nodes));
        let said = match self.phase {
            Phase::Warmup => self.warmup(f),
            Phase::Rise => self.rise(world, dt, f).await,
            Phase::AwaitJoin => self.await_join(f),
            Phase::TopUp => self.top_up(world, dt, f).await,
            Phase::Fall => self.fall(world, dt, f),
            Phase::AwaitScaleDown => {
                if f.removed > 0 && f.in_flight == 0 && f.world_nodes <= self.nodes {
                    self.phase = Phase::Settle;
                    self.settle_until = Some(now + self.settle);
                }
                None
            }
            Phase::Settle => {
                if self.settle_until.is_none_or(|t| now >= t) {
                    self.phase = Phase::Done;
                }
                None
            }
            Phase::Done => None,
        };
        said.into_iter().collect()
    }

    /// Every initial node reports: the rise begins.
    fn warmup(&mut self, f: FleetView) -> Option<String> {
        if f.initial_reporting < self.nodes {
            return None;
        }
        let active = self.ledger.expected_active();
        self.target = (RISE_TO * self.capacity(self.nodes) as f64).ceil() as usize;
        self.phase = Phase::Rise;
        Some(format!(
            "workload rises: new gears placed by the placement service, {active} -> {} active gears ({:.0} % of the {} initial nodes' capacity)",
            self.target,
            RISE_TO * 100.0,
            self.nodes
        ))
    }

    async fn rise(&mut self, world: &SimWorld, dt: f64, f: FleetView) -> Option<String> {
        self.create_due(world, dt, self.target).await;
        if self.ledger.expected_active() < self.target {
            return None;
        }
        self.phase = Phase::AwaitJoin;
        Some(format!(
            "workload holds at {} active gears ({:.1} % of {} nodes' capacity) until the new node joins",
            self.ledger.expected_active(),
            self.usage(f.world_nodes),
            f.world_nodes
        ))
    }

    fn await_join(&mut self, f: FleetView) -> Option<String> {
        if f.joined == 0 {
            return None;
        }
        // New applications arrive while old ones retire: the new gears land
        // on the new, empty node, and usage stays under the scale-up
        // threshold.
        self.cap = (TOP_UP_TO * self.capacity(f.world_nodes) as f64).floor() as usize;
        self.churn_left = (self.max_active as usize / 2).max(1);
        self.phase = Phase::TopUp;
        Some(format!(
            "workload: {} new applications (placement prefers the new, empty node) while old ones retire above {} active gears",
            self.churn_left, self.cap
        ))
    }

    async fn top_up(&mut self, world: &SimWorld, dt: f64, f: FleetView) -> Option<String> {
        self.due += self.up_per_sec * dt;
        while self.due >= 1.0 && self.churn_left > 0 {
            self.due -= 1.0;
            if !self.create_one(world).await {
                break;
            }
            self.churn_left -= 1;
            while self.ledger.expected_active() > self.cap {
                if self.ledger.delete_old(world, &mut self.rng).is_none() {
                    break;
                }
            }
        }
        if self.churn_left > 0 {
            return None;
        }
        self.due = 0.0;
        self.target = (FALL_TO * self.capacity(f.world_nodes) as f64).floor() as usize;
        self.phase = Phase::Fall;
        Some(format!(
            "workload falls: old applications retired (gears deleted at random among the oldest half), {} -> {} active gears ({:.0} % of {} nodes' capacity)",
            self.ledger.expected_active(),
            self.target,
            FALL_TO * 100.0,
            f.world_nodes
        ))
    }

    fn fall(&mut self, world: &SimWorld, dt: f64, f: FleetView) -> Option<String> {
        self.due += self.down_per_sec * dt;
        while self.due >= 1.0 && self.ledger.expected_active() > self.target {
            self.due -= 1.0;
            if self.ledger.delete_old(world, &mut self.rng).is_none() {
                break;
            }
        }
        if self.ledger.expected_active() > self.target {
            return None;
        }
        self.due = 0.0;
        self.phase = Phase::AwaitScaleDown;
        Some(format!(
            "workload holds at {} active gears ({:.1} % of {} nodes' capacity): the fleet should shrink",
            self.ledger.expected_active(),
            self.usage(f.world_nodes),
            f.world_nodes
        ))
    }

    /// Places and creates one gear; false when placement found no node.
    async fn create_one(&mut self, world: &SimWorld) -> bool {
        let app = format!("app-{}", self.placement.requests + 1);
        let Some(node) = self.placement.place(&app, &self.profile).await else {
            // Nothing fits now: try again at the next step.
            self.due = 0.0;
            return false;
        };
        if !self.ledger.create(world, &node, GearState::Started) {
            tracing::warn!(node, "placement chose a node that is not in the world");
        }
        true
    }

    async fn create_due(&mut self, world: &SimWorld, dt: f64, target: usize) {
        self.due += self.up_per_sec * dt;
        while self.due >= 1.0 && self.ledger.expected_active() < target {
            self.due -= 1.0;
            if !self.create_one(world).await {
                break;
            }
        }
        if self.ledger.expected_active() >= target {
            self.due = 0.0;
        }
    }
}
