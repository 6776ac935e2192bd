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
//! - [`fleet`]: the fleet model and the `oo-stats` figures (`fleet/sums.rs`:
//!   the remembered sums that keep them cheap at fleet scale).
//! - [`core`]: the brain without I/O, as small machines `(state, input,
//!   now) -> (state, actions)`: [`core::scale_up`], [`core::scale_down`],
//!   [`core::exhaustion`], [`core::operator`], and the coordinator
//!   ([`core::Core`]) that routes reports, node events, handler results,
//!   ticks and operator requests to them.
//! - [`policy`]: the read-only evaluation of every node group,
//!   `evaluate(facts, config, memory, now) -> verdicts`; the coordinator
//!   applies the verdicts.
//! - [`enroll`]: node enrollment decided without I/O (a token's uses, a
//!   host's key) and its ledger in the state directory; the agent's
//!   `agent/enroll.rs` verifies, writes `nodes.d/<host>.pub` and answers.
//! - [`explain`]: which explanations are published (changed content, or
//!   the keep-alive).
//! - [`history`]: the durable, rotating JSON-lines history of decisions,
//!   saga steps, changed explanations and operator requests.
//! - [`trace`]: the report trace `[trace]` records (JSON lines: receive
//!   time and verified report) and its bounded reader, for what-if replays.
//! - [`ops`]: the journaled records (operations, group state) and their
//!   on-disk format; [`journal`]: the durable journal (redb).
//! - [`lead`]: leader election among the broker agents of one cluster
//!   (a machine without I/O) and the replicated journal standbys take
//!   over from (`docs/ha.md`).
//! - [`planner`]: the evacuation planner interface.
//! - [`paas`]: the PaaS adapter the sagas call to change OpenShift's
//!   districts and move gears (`[paas]`: `oo-admin-ctl-district`,
//!   `oo-admin-move`, or `none`), with the tools' output parsed into typed
//!   outcomes.
//! - [`agent`]: the I/O driver: bus (through the signed-message gate),
//!   timers, handlers, journal, history, one task tracker; [`status`] and
//!   [`metrics`] what it shows (capacity gauges included); [`dashboard`] the
//!   web page on the metrics listener.
//! - [`cli`]: the operator commands as library functions (`status`, `watch`,
//!   `ping`, the admin requests, `history`); `main.rs` only parses them.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod agent;
pub mod cli;
pub mod config;
pub mod core;
pub mod dashboard;
pub mod enroll;
pub mod explain;
pub mod fleet;
pub mod history;
pub mod journal;
pub mod lead;
pub mod metrics;
pub mod ops;
pub mod paas;
pub mod perkey;
pub mod planner;
pub mod policy;
pub mod status;
pub mod trace;

pub use agent::{Agent, AgentBuilder, AgentError, Observed};
pub use config::BrokerConfig;
