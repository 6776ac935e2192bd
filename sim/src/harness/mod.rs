//! What the scenarios share around the fleet: demo, bench and chaos (and the
//! integration tests that run the agents' binaries) set up and tear down
//! through these instead of each writing its own.
//!
//! - [`scenario`]: runtime, printed outcome, run directory.
//! - [`bus`]: bus connections and the removal of a run's durable queues.
//! - [`broker`]: the broker agent's binary, its run configuration and the
//!   operator's admin channel to it.
//! - [`requests`]: the `exec` handler's request log, read like a cloud.
//! - [`process`]: child processes and what `/proc` says of them.
//! - [`metrics`]: Prometheus scrapes, quantiles, the machine.
//!
//! The simulated fleet and cloud themselves are in [`crate::fleet`].

pub mod broker;
pub mod bus;
pub mod metrics;
pub mod process;
pub mod requests;
pub mod scenario;
