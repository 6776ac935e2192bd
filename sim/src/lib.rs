//! # gearshift-sim: the fleet simulator
//!
//! Runs the real agents on a simulated fleet: the broker agent
//! ([`gearshift_broker::Agent`]) and node agents ([`gearshift_node::Agent`]
//! with the `sim` gear runtime, sharing one
//! [`gearshift_node::runtime::sim::SimWorld`] so that gears move between
//! them and can be counted), a simulated cloud that boots and stops node
//! agents, on the in-process bus or a real broker.
//!
//! ## Layout
//! - [`fleet`]: the one simulated fleet (real node agents built from
//!   `node.toml` text through the node agent's own configuration checks, on
//!   a shared world of gears), its key files, and the simulated cloud, a
//!   [`gearshift_handlers::Handler`]. The demo and the broker agent's
//!   integration tests run on it.
//! - [`harness`]: what the scenarios share around it: runtime and printed
//!   outcome, run directory, bus connections and queue cleanup, the broker
//!   agent's binary with its admin channel, the `exec` handler's request
//!   log read like a cloud, child processes, Prometheus scrapes.
//! - [`demo`]: `gearshift-sim demo`: embedded configurations, the scripted
//!   workload, the live display, the independent gear inventory and the
//!   summary.
//! - [`bench`](mod@bench): `gearshift-sim bench`: the fleet-scale benchmark (the real
//!   broker agent's process against [`lite`] nodes on a real bus), phase by
//!   phase.
//! - [`chaos`]: `gearshift-sim chaos`: the fault campaign (SIGKILLs, closed
//!   connections, a bus outage) over real RabbitMQ with invariant checks.
//! - [`lite`]: thousands of light simulated nodes for the benchmark.
//! - [`replay`]: `gearshift-sim replay`: the broker agent's real policy and
//!   sagas in virtual time against a recorded or synthetic report trace
//!   (what-if), with the replay's own nodes (the node agent's core, lite
//!   nodes' gears) and cloud.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod bench;
pub mod chaos;
pub mod demo;
pub mod fleet;
pub mod harness;
pub mod lite;
pub mod replay;
