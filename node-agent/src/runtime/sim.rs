//! The `sim` runtime: gears in memory, in a [`SimWorld`] shared by every
//! simulated node of a process, so that simulated nodes move gears to each
//! other and a test can check that every gear exists exactly once.
//!
//! The fleet simulator builds one world, adds its nodes and gears, and gives
//! each node agent a [`SimRuntime`] for its own name:
//!
//! ```
//! use gearshift_node::runtime::sim::{SimWorld, SimRuntime};
//! use gearshift_node::runtime::NodeFacts;
//! let world = SimWorld::new();
//! let facts = NodeFacts { profile: "small".into(), max_active_gears: 100, district: None };
//! world.add_node("node-1", facts.clone());
//! world.add_node("node-2", facts);
//! world.populate("node-1", 10, 50);
//! let rt = SimRuntime::new(world.clone(), "node-1");
//! # let _ = rt;
//! ```

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use gearshift_proto::msg::{GearInfo, GearState};

use super::{GearRuntime, Inventory, MemInfo, MoveCtx, MoveOutcome, NodeFacts, RuntimeError};

#[derive(Debug, Clone)]
struct SimNode {
    facts: NodeFacts,
    gears: BTreeMap<String, GearInfo>,
    active: bool,
    mem_total_mb: u64,
    mb_per_active_gear: u64,
}

#[derive(Debug, Default)]
struct World {
    nodes: BTreeMap<String, SimNode>,
    move_time: Duration,
    /// Gear id -> failures still to inject on its next moves.
    failures: HashMap<String, u32>,
    moves: u64,
}

/// The simulated fleet's gears, shared by every [`SimRuntime`] of a process.
#[derive(Debug, Default)]
pub struct SimWorld {
    inner: Mutex<World>,
}

impl SimWorld {
    /// An empty world.
    pub fn new() -> Arc<SimWorld> {
        Arc::new(SimWorld::default())
    }

    fn lock(&self) -> MutexGuard<'_, World> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds (or replaces the facts of) a node.
    pub fn add_node(&self, name: &str, facts: NodeFacts) {
        let mut w = self.lock();
        match w.nodes.get_mut(name) {
            Some(n) => n.facts = facts,
            None => {
                w.nodes.insert(
                    name.to_string(),
                    SimNode {
                        facts,
                        gears: BTreeMap::new(),
                        active: true,
                        mem_total_mb: 8192,
                        mb_per_active_gear: 64,
                    },
                );
            }
        }
    }

    /// Removes a node and its gears (the cloud deleted the host); returns its gears.
    pub fn remove_node(&self, name: &str) -> Vec<GearInfo> {
        self.lock()
            .nodes
            .remove(name)
            .map(|n| n.gears.into_values().collect())
            .unwrap_or_default()
    }

    /// Names of every node.
    pub fn nodes(&self) -> Vec<String> {
        self.lock().nodes.keys().cloned().collect()
    }

    /// Adds a gear to a node; false if the node does not exist or the id is taken anywhere.
    pub fn add_gear(&self, node: &str, gear: GearInfo) -> bool {
        let mut w = self.lock();
        if w.nodes.values().any(|n| n.gears.contains_key(&gear.id)) {
            return false;
        }
        match w.nodes.get_mut(node) {
            Some(n) => {
                n.gears.insert(gear.id.clone(), gear);
                true
            }
            None => false,
        }
    }

    /// Deletes a gear wherever it is; true if it existed.
    pub fn remove_gear(&self, gear: &str) -> bool {
        let mut w = self.lock();
        w.nodes.values_mut().any(|n| n.gears.remove(gear).is_some())
    }

    /// Sets a gear's state; true if it exists.
    pub fn set_gear_state(&self, gear: &str, state: GearState) -> bool {
        let mut w = self.lock();
        for n in w.nodes.values_mut() {
            if let Some(g) = n.gears.get_mut(gear) {
                g.state = state;
                return true;
            }
        }
        false
    }

    /// Adds `count` gears named `<node>-g<i>` to a node, `idle_percent` of them idle.
    pub fn populate(&self, node: &str, count: u32, idle_percent: u8) {
        let idle_every = if idle_percent == 0 {
            u32::MAX
        } else {
            (100 / u32::from(idle_percent.min(100))).max(1)
        };
        for i in 0..count {
            let state = if idle_percent > 0 && i % idle_every == 0 {
                GearState::Idle
            } else {
                GearState::Started
            };
            self.add_gear(
                node,
                GearInfo {
                    id: format!("{}-g{i}", node.replace('.', "-")),
                    app: None,
                    state,
                    uid: None,
                    bytes: None,
                    do_not_disrupt: false,
                },
            );
        }
    }

    /// The gears of a node (empty if unknown).
    pub fn gears_of(&self, node: &str) -> Vec<GearInfo> {
        self.lock()
            .nodes
            .get(node)
            .map(|n| n.gears.values().cloned().collect())
            .unwrap_or_default()
    }

    /// Every node holding `gear` (exactly one, when nothing was lost or duplicated).
    pub fn locate(&self, gear: &str) -> Vec<String> {
        self.lock()
            .nodes
            .iter()
            .filter(|(_, n)| n.gears.contains_key(gear))
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// Whether the node was last told it is active.
    pub fn is_active(&self, node: &str) -> Option<bool> {
        self.lock().nodes.get(node).map(|n| n.active)
    }

    /// Simulated time each move takes.
    pub fn set_move_time(&self, t: Duration) {
        self.lock().move_time = t;
    }

    /// Simulated memory of a node.
    pub fn set_memory(&self, node: &str, total_mb: u64) {
        if let Some(n) = self.lock().nodes.get_mut(node) {
            n.mem_total_mb = total_mb;
        }
    }

    /// Makes the next `n` moves of `gear` fail with a retryable error.
    pub fn fail_next_moves(&self, gear: &str, n: u32) {
        self.lock().failures.insert(gear.to_string(), n);
    }

    /// Moves performed so far (successful ones).
    pub fn moves(&self) -> u64 {
        self.lock().moves
    }
}

/// One simulated node's view of a [`SimWorld`].
#[derive(Debug, Clone)]
pub struct SimRuntime {
    world: Arc<SimWorld>,
    node: String,
}

impl SimRuntime {
    /// The runtime of node `node` (which should exist in `world`).
    pub fn new(world: Arc<SimWorld>, node: &str) -> Self {
        SimRuntime {
            world,
            node: node.to_string(),
        }
    }

    /// The shared world.
    pub fn world(&self) -> &Arc<SimWorld> {
        &self.world
    }
}

#[async_trait]
impl GearRuntime for SimRuntime {
    fn kind(&self) -> &'static str {
        "sim"
    }

    async fn inventory(&self) -> Result<Inventory, RuntimeError> {
        let w = self.world.lock();
        let n = w.nodes.get(&self.node).ok_or_else(|| RuntimeError::Io {
            path: format!("sim:{}", self.node).into(),
            reason: "node not in the simulated world".into(),
        })?;
        Ok(Inventory {
            facts: n.facts.clone(),
            gears: n.gears.values().cloned().collect(),
        })
    }

    async fn move_gear(
        &self,
        gear: &str,
        target: &str,
        ctx: &MoveCtx,
    ) -> Result<MoveOutcome, RuntimeError> {
        let delay = self.world.lock().move_time;
        if !delay.is_zero() {
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = ctx.cancel.cancelled() => return Err(RuntimeError::Interrupted),
            }
        }
        let mut w = self.world.lock();
        if let Some(left) = w.failures.get_mut(gear)
            && *left > 0
        {
            *left -= 1;
            return Err(RuntimeError::Io {
                path: format!("sim:{gear}").into(),
                reason: "injected failure".into(),
            });
        }
        if target == self.node {
            return Err(RuntimeError::InvalidName {
                what: "target",
                name: target.into(),
                reason: "is this node".into(),
            });
        }
        if !w.nodes.contains_key(target) {
            return Err(RuntimeError::UnknownTarget(target.into()));
        }
        if w.nodes
            .get(target)
            .is_some_and(|n| n.gears.contains_key(gear))
        {
            return Ok(MoveOutcome::AlreadyMoved);
        }
        let Some(g) = w
            .nodes
            .get_mut(&self.node)
            .and_then(|n| n.gears.remove(gear))
        else {
            return Ok(MoveOutcome::Missing);
        };
        if let Some(t) = w.nodes.get_mut(target) {
            t.gears.insert(gear.to_string(), g);
        }
        w.moves += 1;
        Ok(MoveOutcome::Moved)
    }

    /// Simulated nodes share the host: no boot time of their own.
    async fn booted_at(&self) -> Option<chrono::DateTime<chrono::Utc>> {
        None
    }

    async fn memory(&self) -> Option<MemInfo> {
        let w = self.world.lock();
        let n = w.nodes.get(&self.node)?;
        let active = super::counts(&n.gears.values().cloned().collect::<Vec<_>>()).active();
        let used = 512 + u64::from(active) * n.mb_per_active_gear;
        Some(MemInfo {
            total_mb: n.mem_total_mb,
            free_mb: n.mem_total_mb.saturating_sub(used),
        })
    }

    async fn set_active(&self, active: bool) -> Result<(), RuntimeError> {
        if let Some(n) = self.world.lock().nodes.get_mut(&self.node) {
            n.active = active;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts() -> NodeFacts {
        NodeFacts {
            profile: "small".into(),
            max_active_gears: 10,
            district: None,
        }
    }

    #[tokio::test]
    async fn gears_move_between_simulated_nodes_exactly_once() {
        let w = SimWorld::new();
        w.add_node("a", facts());
        w.add_node("b", facts());
        w.populate("a", 4, 50);
        let a = SimRuntime::new(w.clone(), "a");
        let inv = a.inventory().await.unwrap();
        assert_eq!(inv.gears.len(), 4);
        assert_eq!(inv.counts().idle, 2);
        let ctx = MoveCtx::default();
        assert_eq!(
            a.move_gear("a-g0", "b", &ctx).await.unwrap(),
            MoveOutcome::Moved
        );
        assert_eq!(
            a.move_gear("a-g0", "b", &ctx).await.unwrap(),
            MoveOutcome::AlreadyMoved
        );
        assert_eq!(
            a.move_gear("zz", "b", &ctx).await.unwrap(),
            MoveOutcome::Missing
        );
        assert_eq!(w.locate("a-g0"), vec!["b".to_string()]);
        assert!(matches!(
            a.move_gear("a-g1", "c", &ctx).await,
            Err(RuntimeError::UnknownTarget(_))
        ));
        w.fail_next_moves("a-g1", 1);
        assert!(
            a.move_gear("a-g1", "b", &ctx)
                .await
                .unwrap_err()
                .is_retryable()
        );
        assert_eq!(
            a.move_gear("a-g1", "b", &ctx).await.unwrap(),
            MoveOutcome::Moved
        );
        assert_eq!(w.moves(), 2);
        assert!(
            !w.add_gear("b", w.gears_of("b")[0].clone()),
            "ids are unique fleet-wide"
        );
        a.set_active(false).await.unwrap();
        assert_eq!(w.is_active("a"), Some(false));
        let m = a.memory().await.unwrap();
        assert!(m.free_mb < m.total_mb);
    }
}
