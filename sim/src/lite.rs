//! A lightweight simulated node fleet for the benchmark: thousands of nodes
//! that speak the real protocol at a fraction of a node agent's cost.
//!
//! Every lite node has its own Ed25519 key and signs real `report` envelopes
//! and real events. Its commands go through the node agent's own code: the
//! [`gearshift_proto::Gate`] with the node's expectations, then one
//! [`gearshift_node::core::NodeCore`] per node (the same decisions, journal
//! and evacuation bookkeeping as a node agent), whose actions a cheap
//! in-memory "runtime" carries out (`commands`): moves cost nothing (a gear
//! leaves the victim and joins its target in the same step), nothing is
//! written to disk. What a lite node does not have is what costs memory and
//! time in a real one: a process, a state directory, a gear runtime, its own
//! connection, its own tasks. The nodes share a few bus connections (one
//! command subscription, `cmd.#`, for all of them), so that RabbitMQ and the
//! broker agent see the message rates of a real fleet of that size.

mod commands;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use chrono::Utc;
use gearshift_bus::{OutMessage, SharedBus};
use gearshift_node::core::{CoreConfig, NodeCore};
use gearshift_node::state::journal::Journal;
use gearshift_proto::msg::{DistrictInfo, GearCounts, GearInfo, GearState, NodeReport};
use gearshift_proto::{Envelope, KeyPair, Keyring, routing};
use tokio_util::sync::CancellationToken;

/// First UID of every simulated district.
const FIRST_UID: u32 = 1000;
/// UIDs per simulated district: room for every gear the benchmark creates.
const DISTRICT_UIDS: u32 = 50_000;

/// The shape of a lite fleet.
#[derive(Debug, Clone)]
pub struct LiteSpec {
    /// Number of nodes.
    pub nodes: usize,
    /// Nodes per district.
    pub per_district: usize,
    /// Profiles, assigned round robin by district.
    pub profiles: Vec<String>,
    /// `max_active_gears` of every node.
    pub max_active: u32,
    /// Gears per node at the start (all started).
    pub gears: u32,
    /// Report interval the nodes announce (`interval_secs`).
    pub interval: Duration,
    /// Prefix of node names and districts (unique per run).
    pub tag: String,
}

/// One simulated node's mutable state (a lite node's, and a replayed
/// node's in `gearshift-sim replay`).
#[derive(Debug)]
pub(crate) struct NodeState {
    pub(crate) seq: u64,
    pub(crate) gears: Vec<u32>,
    /// Of the gears, how many are started; the rest are idle.
    pub(crate) started: u32,
    /// A report is due (coalesces the changes of one evacuation).
    pub(crate) dirty: bool,
    /// The node's decisions, as a node agent takes them.
    pub(crate) core: NodeCore,
}

/// One simulated node.
#[derive(Debug)]
pub struct LiteNode {
    /// Host name.
    pub name: String,
    /// District UUID.
    pub district: String,
    /// Profile.
    pub profile: String,
    key: KeyPair,
    conn: usize,
    state: Mutex<NodeState>,
}

/// Counters of what the fleet did.
#[derive(Debug, Default)]
pub struct LiteCounters {
    /// Reports published (confirmed).
    pub reports: AtomicU64,
    /// Reports that could not be published.
    pub report_errors: AtomicU64,
    /// Commands received and verified, by any node.
    pub commands: AtomicU64,
    /// Commands refused (bad signature, stale, replayed).
    pub refused: AtomicU64,
    /// Redelivered or repeated commands answered from the journal.
    pub duplicates: AtomicU64,
    /// Evacuate commands executed.
    pub evacuations: AtomicU64,
    /// Evacuations that ended with the node empty.
    pub drained: AtomicU64,
    /// Gears moved.
    pub moves: AtomicU64,
    /// Events published.
    pub events: AtomicU64,
    /// Events that could not be published.
    pub event_errors: AtomicU64,
}

/// Times of the first and last gear move (for the orchestration throughput).
#[derive(Debug, Default)]
struct MoveWindow {
    first: Option<Instant>,
    last: Option<Instant>,
}

/// A fleet of lite nodes on a few shared bus connections.
pub struct LiteFleet {
    /// The nodes, by index.
    pub nodes: Vec<Arc<LiteNode>>,
    by_name: HashMap<String, usize>,
    buses: Vec<SharedBus>,
    brokers: Keyring,
    core_config: CoreConfig,
    spec: LiteSpec,
    next_gear: AtomicU64,
    /// What the fleet did.
    pub counters: LiteCounters,
    window: Mutex<MoveWindow>,
    dirty: tokio::sync::mpsc::UnboundedSender<usize>,
    dirty_rx: Mutex<Option<tokio::sync::mpsc::UnboundedReceiver<usize>>>,
}

impl std::fmt::Debug for LiteFleet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LiteFleet")
            .field("nodes", &self.nodes.len())
            .field("connections", &self.buses.len())
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The deterministic key of lite node `i` of a run (so the benchmark can
/// write the public keys for the broker agent before the nodes start).
pub fn node_key(tag: &str, i: usize) -> KeyPair {
    use std::hash::{Hash, Hasher};
    let mut seed = [0u8; 32];
    for (chunk, salt) in seed.chunks_mut(8).zip(0u64..) {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        (tag, i, salt).hash(&mut h);
        chunk.copy_from_slice(&h.finish().to_le_bytes());
    }
    KeyPair::from_seed(&seed)
}

/// The name of lite node `i`.
pub fn node_name(tag: &str, i: usize) -> String {
    format!("{tag}-n{i:06}")
}

/// The district of lite node `i`.
pub fn district_name(tag: &str, spec: &LiteSpec, i: usize) -> String {
    format!("{tag}-d{:04}", i / spec.per_district.max(1))
}

impl LiteFleet {
    /// Builds the fleet: keys, names and gears; nothing is sent yet.
    /// `brokers` are the keys whose commands the nodes obey.
    pub fn new(spec: LiteSpec, buses: Vec<SharedBus>, brokers: Keyring) -> Arc<LiteFleet> {
        assert!(!buses.is_empty(), "a lite fleet needs a bus connection");
        let seq0 = Utc::now().timestamp_micros().max(0) as u64;
        let mut next_gear = 0u32;
        let mut nodes = Vec::with_capacity(spec.nodes);
        let mut by_name = HashMap::with_capacity(spec.nodes);
        for i in 0..spec.nodes {
            let name = node_name(&spec.tag, i);
            let district_index = i / spec.per_district.max(1);
            let profile = spec.profiles[district_index % spec.profiles.len()].clone();
            let gears: Vec<u32> = (0..spec.gears).map(|k| next_gear + k).collect();
            next_gear += spec.gears;
            by_name.insert(name.clone(), i);
            nodes.push(Arc::new(LiteNode {
                name,
                district: district_name(&spec.tag, &spec, i),
                profile,
                key: node_key(&spec.tag, i),
                conn: i % buses.len(),
                state: Mutex::new(NodeState {
                    seq: seq0,
                    started: spec.gears,
                    gears,
                    dirty: false,
                    core: NodeCore::new(true, Journal::default()),
                }),
            }));
        }
        let (dirty, dirty_rx) = tokio::sync::mpsc::unbounded_channel();
        Arc::new(LiteFleet {
            nodes,
            by_name,
            buses,
            brokers,
            core_config: lite_core_config(Utc::now()),
            spec,
            next_gear: AtomicU64::new(u64::from(next_gear)),
            counters: LiteCounters::default(),
            window: Mutex::new(MoveWindow::default()),
            dirty,
            dirty_rx: Mutex::new(Some(dirty_rx)),
        })
    }

    /// The fleet's shape.
    pub fn spec(&self) -> &LiteSpec {
        &self.spec
    }

    /// Index of a node by name.
    pub fn index(&self, name: &str) -> Option<usize> {
        self.by_name.get(name).copied()
    }

    /// Every district, in node order.
    pub fn districts(&self) -> Vec<String> {
        let mut v: Vec<String> = self.nodes.iter().map(|n| n.district.clone()).collect();
        v.dedup();
        v
    }

    /// Sets node `i` to `total` gears of which `started` are started (the
    /// rest idle), creating or dropping gears as needed.
    pub fn set_load(&self, i: usize, total: u32, started: u32) {
        let mut st = lock(&self.nodes[i].state);
        while (st.gears.len() as u32) < total {
            let id = self.next_gear.fetch_add(1, Ordering::Relaxed) as u32;
            st.gears.push(id);
        }
        st.gears.truncate(total as usize);
        st.started = started.min(total);
    }

    /// Gears on node `i`.
    pub fn gears_of(&self, i: usize) -> usize {
        lock(&self.nodes[i].state).gears.len()
    }

    /// Every gear of the fleet with its node: the inventory a check counts.
    pub fn inventory(&self) -> HashMap<u32, usize> {
        let mut m = HashMap::new();
        for (i, n) in self.nodes.iter().enumerate() {
            for g in &lock(&n.state).gears {
                *m.entry(*g).or_insert(0) += 1;
                let _ = i;
            }
        }
        m
    }

    /// Total gears in the fleet.
    pub fn total_gears(&self) -> usize {
        self.nodes.iter().map(|n| lock(&n.state).gears.len()).sum()
    }

    /// Nodes that are inactive (deactivated by the broker agent).
    pub fn inactive(&self) -> usize {
        self.nodes
            .iter()
            .filter(|n| !lock(&n.state).core.active())
            .count()
    }

    /// Seconds between the first and the last gear move, and the moves.
    pub fn move_window(&self) -> (Duration, u64) {
        let w = lock(&self.window);
        let d = match (w.first, w.last) {
            (Some(a), Some(b)) => b - a,
            _ => Duration::ZERO,
        };
        (d, self.counters.moves.load(Ordering::Relaxed))
    }

    /// Forgets the move window (a new phase starts).
    pub fn reset_move_window(&self) {
        *lock(&self.window) = MoveWindow::default();
        self.counters.moves.store(0, Ordering::Relaxed);
    }

    /// The signed report of node `i`, with a fresh `seq`.
    pub fn report_message(&self, i: usize) -> OutMessage {
        let n = &self.nodes[i];
        let report = {
            let mut st = lock(&n.state);
            st.dirty = false;
            let now_us = Utc::now().timestamp_micros().max(0) as u64;
            st.seq = (st.seq + 1).max(now_us);
            let total = st.gears.len() as u32;
            let started = st.started.min(total);
            NodeReport {
                node: n.name.clone(),
                seq: st.seq,
                profile: n.profile.clone(),
                district: Some(DistrictInfo {
                    uuid: n.district.clone(),
                    active: true,
                    first_uid: Some(FIRST_UID),
                    max_uid: Some(FIRST_UID + DISTRICT_UIDS - 1),
                }),
                max_active_gears: self.spec.max_active,
                gears: GearCounts {
                    started,
                    idle: total - started,
                    ..Default::default()
                },
                active: st.core.active(),
                region: None,
                zone: None,
                mem_free_mb: 4096,
                mem_total_mb: 8192,
                started_at: Utc::now(),
                booted_at: None,
                booted_for: None,
                do_not_disrupt: false,
                pinned_gears: 0,
                operation: st.core.operation(),
                interval_secs: self.spec.interval.as_secs().max(1) as u32,
                agent_version: concat!("lite-", env!("CARGO_PKG_VERSION")).into(),
            }
        };
        let env = Envelope::new(&n.name, report);
        OutMessage::new(routing::report(Some(&n.district), &n.name), n.key.seal(env)).transient()
    }

    /// Publishes node `i`'s report on its connection and waits for the confirm.
    pub async fn report(&self, i: usize) -> bool {
        let m = self.report_message(i);
        let bus = &self.buses[self.nodes[i].conn];
        match bus.publish(m).await {
            Ok(()) => {
                self.counters.reports.fetch_add(1, Ordering::Relaxed);
                true
            }
            Err(e) => {
                tracing::debug!(error = %e, "lite report not published");
                self.counters.report_errors.fetch_add(1, Ordering::Relaxed);
                false
            }
        }
    }

    /// Reports every node in `nodes` with up to `in_flight` confirms pending.
    pub async fn report_all(self: &Arc<Self>, nodes: &[usize], in_flight: usize) {
        use futures::StreamExt;
        futures::stream::iter(nodes.iter().copied())
            .for_each_concurrent(in_flight.max(1), |i| {
                let me = self.clone();
                async move {
                    me.report(i).await;
                }
            })
            .await;
    }

    /// Publishes reports until `stop`: `per_conn` publishers per
    /// connection, each cycling over its share of the nodes, as fast as the
    /// connections confirm, or at `rate` reports per second in all when
    /// given. Returns the reports published.
    pub async fn flood(
        self: &Arc<Self>,
        per_conn: usize,
        rate: Option<f64>,
        stop: CancellationToken,
    ) -> u64 {
        let workers = self.buses.len() * per_conn.max(1);
        let before = self.counters.reports.load(Ordering::Relaxed);
        let mut tasks = Vec::with_capacity(workers);
        for w in 0..workers {
            let me = self.clone();
            let stop = stop.clone();
            // Each publisher's share of the rate, started at staggered instants.
            let every = rate
                .filter(|r| *r > 0.0)
                .map(|r| Duration::from_secs_f64(workers as f64 / r));
            tasks.push(tokio::spawn(async move {
                let n = me.nodes.len();
                let mut i = w;
                let mut next = tokio::time::Instant::now()
                    + every.map_or(Duration::ZERO, |e| e.mul_f64(w as f64 / workers as f64));
                while !stop.is_cancelled() {
                    if let Some(e) = every {
                        tokio::select! {
                            _ = stop.cancelled() => break,
                            _ = tokio::time::sleep_until(next) => {}
                        }
                        next += e;
                    }
                    if i >= n {
                        i = w % n.max(1);
                    }
                    me.report(i).await;
                    i += workers;
                }
            }));
        }
        for t in tasks {
            let _ = t.await;
        }
        self.counters.reports.load(Ordering::Relaxed) - before
    }

    /// Reports every node once per `interval`, spread evenly, plus every node
    /// whose state changed (at once), until `stop`.
    pub async fn pace(self: &Arc<Self>, interval: Duration, stop: CancellationToken) {
        let n = self.nodes.len().max(1);
        let tick = Duration::from_millis(20);
        let per_tick = ((n as f64) * tick.as_secs_f64() / interval.as_secs_f64()).ceil() as usize;
        let mut dirty = lock(&self.dirty_rx).take();
        let mut next = 0usize;
        let mut t = tokio::time::interval(tick);
        t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            let mut batch: Vec<usize> = vec![];
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = t.tick() => {
                    for _ in 0..per_tick.max(1) {
                        batch.push(next);
                        next = (next + 1) % n;
                    }
                }
                Some(i) = async {
                    match dirty.as_mut() {
                        Some(d) => d.recv().await,
                        None => std::future::pending().await,
                    }
                } => batch.push(i),
            }
            if let Some(d) = dirty.as_mut() {
                while let Ok(i) = d.try_recv() {
                    batch.push(i);
                }
            }
            let me = self.clone();
            tokio::spawn(async move { me.report_all(&batch, 64).await });
        }
        *lock(&self.dirty_rx) = dirty;
    }
}

/// The core settings of every lite node: a node agent's defaults, a small
/// journal (no lite node is sent more than a few commands), no Heat.
pub(crate) fn lite_core_config(now: chrono::DateTime<Utc>) -> CoreConfig {
    let mut c = CoreConfig::new(now);
    c.journal_capacity = 16;
    c
}

fn gear_name(id: u32) -> String {
    format!("g{id:08}")
}

pub(crate) fn gear_infos(st: &NodeState) -> Vec<GearInfo> {
    st.gears
        .iter()
        .enumerate()
        .map(|(k, g)| GearInfo {
            id: gear_name(*g),
            app: None,
            state: if (k as u32) < st.started {
                GearState::Started
            } else {
                GearState::Idle
            },
            uid: Some(FIRST_UID + (*g % DISTRICT_UIDS)),
            bytes: None,
            do_not_disrupt: false,
        })
        .collect()
}
