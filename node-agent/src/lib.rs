//! # gearshift-node: the node agent
//!
//! Runs on every node host. It reports the node's capacity on the bus,
//! marks itself inactive when told (and stays so across restarts), evacuates
//! its gears with progress and crash-safe checkpoints, and sends
//! cfn-push-stats-style signals to OpenStack Heat.
//!
//! The crate is a library first: the `gearshift-node` binary, the fleet
//! simulator and the tests all build an [`Agent`] from an [`AgentConfig`],
//! a [`gearshift_bus::SharedBus`] and a [`runtime::SharedRuntime`], and
//! call [`Agent::run`] until a cancellation token fires.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::Arc;
//! use gearshift_node::runtime::{NodeFacts, sim::{SimRuntime, SimWorld}};
//! use gearshift_node::{Agent, AgentConfig};
//! use gearshift_proto::{KeyPair, Keyring, msg::Role};
//!
//! let broker_key = KeyPair::generate()?;
//! let mut trusted = Keyring::new();
//! trusted.add(broker_key.public(), Role::Broker, "broker");
//! let world = SimWorld::new();
//! world.add_node("node-1", NodeFacts { profile: "small".into(), max_active_gears: 100, district: None });
//! world.populate("node-1", 20, 50);
//! let mut cfg = AgentConfig::new("node-1", KeyPair::generate()?, trusted, "/tmp/node-1-state");
//! cfg.report.interval = std::time::Duration::from_millis(100);
//! cfg.fsync = false; // simulation only
//! let bus = gearshift_bus::connect("memory://fleet", Default::default()).await?;
//! let agent = Agent::new(cfg, bus, Arc::new(SimRuntime::new(world.clone(), "node-1")))?;
//! let token = tokio_util::sync::CancellationToken::new();
//! let exit = agent.run(token.clone()).await; // until token.cancel() or cmd.remove
//! # let _ = exit; Ok(()) }
//! ```
//!
//! ## Layout
//! - [`core`]: the node's decisions without I/O: [`core::NodeCore`] takes
//!   commands, completions and move results and returns the actions to carry
//!   out (accept or refuse, journal, persist, evacuation scheduling and
//!   checkpoints, replies, when to acknowledge). Unit-tested without a bus
//!   or a clock; the simulator's lite nodes run it too.
//! - [`agent`]: the agent around it: the core task that owns the core and
//!   carries out its actions, the intake loops (command queue and broadcast
//!   pings through the [`gearshift_proto::Gate`]), the reporter, and the
//!   outbox that keeps events while the bus is away. Every task is spawned
//!   on one `TaskTracker` ([`AgentConfig::tracker`]).
//! - [`runtime`]: where gears live and how they move: `openshift`, `dir`,
//!   `exec`, `sim`.
//! - [`evacuate`]: the checkpointed [`evacuate::plan::Plan`] and the
//!   [`evacuate::Mover`] that runs the core's moves with retries.
//! - [`state`]: the flock-locked state directory: active flag, command
//!   journal (the persisted replay guard: a pure index and its files),
//!   report sequence, atomic writes.
//! - [`heat`]: Heat signals (alarm URLs, signal URL with a Keystone token,
//!   mark-unhealthy), sent with `gearshift-cloud`'s Heat client.
//! - [`config`]: `node.toml`, validated before any network access (the
//!   `[bus]`, `[keys]`, `[log]` and `[metrics]` sections are the ones both
//!   agents share, from `gearshift-service`); [`setup`]: from the file to
//!   an [`AgentConfig`].
//! - [`status`]: `gearshift-node status`, read from the state directory.
//! - The binary's bootstrap (configuration, exit codes, signals, reload, the
//!   bus that connects in the background, one shutdown tree) is
//!   `gearshift_service::bootstrap`, shared with the broker agent.
//! - [`metrics`]: Prometheus counters and gauges.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod agent;
pub mod config;
pub mod core;
pub mod enroll;
pub mod evacuate;
pub mod heat;
pub mod metrics;
pub mod runtime;
pub mod setup;
pub mod state;
pub mod status;

pub use agent::{Agent, AgentConfig, AgentError, RunExit};
pub use config::NodeConfig;
