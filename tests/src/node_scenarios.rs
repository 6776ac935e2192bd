//! Node agent scenarios, each a function of the bus URL, so that the same
//! checks run on the in-process bus (`node-agent/tests`) and on RabbitMQ
//! over AMQP and STOMP (`tests/tests/it/node_*.rs`).
//!
//! - `commands`: refusals, deactivation across a restart, pings,
//!   inventory, Heat signals and removal.
//! - `evacuation`: progress, retries, resumption after a restart.

// Explicit paths: this file is also compiled into `node-agent/tests` by
// `#[path]`, where nested modules would otherwise resolve beside it.
#[path = "node_scenarios/commands.rs"]
mod commands;
#[path = "node_scenarios/evacuation.rs"]
mod evacuation;

pub use commands::{deactivate_survives_restart, inventory_heat_and_remove, pings, refusals};
pub use evacuation::{evacuation_resumes_after_restart, evacuation_with_progress};

use std::path::PathBuf;
use std::sync::Arc;

use gearshift_node::agent::AgentConfig;
use gearshift_node::runtime::sim::{SimRuntime, SimWorld};
use gearshift_node::runtime::{NodeFacts, SharedRuntime};
use gearshift_proto::msg::{CommandResult, DistrictInfo, Message};
use gearshift_proto::{Envelope, KeyPair};

use crate::node_harness::*;

fn facts() -> NodeFacts {
    NodeFacts {
        profile: "small".into(),
        max_active_gears: 50,
        district: Some(DistrictInfo {
            uuid: "d1".into(),
            active: true,
            first_uid: Some(1000),
            max_uid: Some(6999),
        }),
    }
}

/// A simulated world with `node` holding `gears` gears and two empty targets.
pub fn sim_world(node: &str, gears: u32) -> (Arc<SimWorld>, SharedRuntime, [String; 2]) {
    let w = SimWorld::new();
    let targets = [format!("{node}-t1"), format!("{node}-t2")];
    w.add_node(node, facts());
    for t in &targets {
        w.add_node(t, facts());
    }
    w.populate(node, gears, 25);
    let rt: SharedRuntime = Arc::new(SimRuntime::new(w.clone(), node));
    (w, rt, targets)
}

fn refused_reason(e: &Envelope) -> String {
    match &e.msg {
        Message::Refused(r) => r.reason.clone(),
        other => panic!("expected event.refused, got {other:?}"),
    }
}

fn done(e: &Envelope) -> CommandResult {
    match &e.msg {
        Message::Done(d) => d.result.clone(),
        other => panic!("expected event.done, got {other:?}"),
    }
}

/// What every scenario starts from: keys, a controller on the bus, a node
/// name and key, a state directory, a simulated world with the node's gears
/// and two targets, and the node's queue declared.
struct Bed {
    url: String,
    keys: Keys,
    ctl: Controller,
    node: String,
    node_key: KeyPair,
    dir: tempfile::TempDir,
    world: Arc<SimWorld>,
    rt: SharedRuntime,
    targets: [String; 2],
}

impl Bed {
    async fn new(url: &str, prefix: &str, gears: u32) -> Bed {
        let keys = Keys::new();
        let ctl = Controller::connect(url, keys.clone()).await;
        let node = unique(prefix);
        let node_key = KeyPair::generate().unwrap();
        let dir = temp_dir();
        let (world, rt, targets) = sim_world(&node, gears);
        ctl.prepare(&node).await;
        Bed {
            url: url.to_string(),
            keys,
            ctl,
            node,
            node_key,
            dir,
            world,
            rt,
            targets,
        }
    }

    fn state_dir(&self) -> PathBuf {
        state_dir(self.dir.path(), &self.node)
    }

    /// The node's agent configuration on its state directory.
    fn config(&self) -> AgentConfig {
        agent_config(&self.node, &self.node_key, &self.keys, &self.state_dir())
    }

    /// Starts the node agent with `cfg` on a connection of its own.
    async fn start(&self, cfg: AgentConfig) -> Running {
        Running::start(cfg, connect(&self.url, &self.node).await, self.rt.clone())
    }

    /// The node's events, verified.
    async fn events(&self) -> Verified {
        self.ctl.events(&self.node, &self.node_key).await
    }

    /// The node's reports, verified.
    async fn reports(&self) -> Verified {
        self.ctl.reports(&self.node, &self.node_key).await
    }
}
