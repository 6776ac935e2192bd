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
//! - [`fleet`]: the simulated fleet (node agents built from `node.toml`
//!   text through the node agent's own configuration checks) and the
//!   simulated cloud, a [`gearshift_handlers::Handler`].
//! - [`demo`]: `gearshift-sim demo`: embedded configurations, the scripted
//!   workload, the live display, the independent gear inventory and the
//!   summary.
//! - [`bench`]: `gearshift-sim bench`: the fleet-scale benchmark (the real
//!   broker agent's process against [`lite`] nodes on a real bus); its
//!   helpers for child processes, memory and metrics in [`bench_proc`].
//! - [`chaos`]: `gearshift-sim chaos`: the fault campaign (SIGKILLs, closed
//!   connections, a bus outage) over real RabbitMQ with invariant checks.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod bench;
pub mod chaos;
pub mod demo;
pub mod fleet;
pub mod harness;
pub mod lite;
