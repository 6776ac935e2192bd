//! # gearshift-broker: the broker agent
//!
//! Learns fleet capacity from node reports, decides scale-up and scale-down,
//! publishes every decision and explanation on the bus, drives each
//! scale-down saga to its end and asks the cloud for new nodes.
//!
//! ## Layout
//! - [`config`]: `conf/broker.toml`, its defaults and checks (`[policy]`,
//!   `[saga]`, node groups and the agent's own `[bus]`/`[keys]` keys in
//!   `config/`; the shared sections come from `gearshift-service`);
//!   [`perkey`] the `"default, profile: value"` form of the seeds' advisor keys.
//! - [`fleet`]: the fleet model and the `oo-stats` figures.
//! - [`ops`]: the sagas' and groups' journaled state.
//! - [`core`]: the pure state machine `(state, input, now) -> (state,
//!   actions)`: reports, node events, handler results, deadlines, operator
//!   requests; [`policy`] its evaluation of every node group.
//! - [`planner`]: the evacuation planner interface.
//! - [`journal`]: the durable journal (redb).
//! - [`agent`]: the I/O driver: bus, timers, handlers, journal; [`status`]
//!   and [`metrics`] what it shows; [`dashboard`] the web page on the
//!   metrics listener.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod agent;
pub mod cli;
pub mod config;
pub mod core;
pub mod dashboard;
pub mod fleet;
pub mod journal;
pub mod metrics;
pub mod ops;
pub mod perkey;
pub mod planner;
pub mod policy;
pub mod status;

pub use agent::{Agent, AgentBuilder, AgentError, Observed};
pub use config::BrokerConfig;
