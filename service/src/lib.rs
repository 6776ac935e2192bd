//! # gearshift-service: what both agents need to run as a service
//!
//! ## Layout
//! - [`config`]: load a TOML file plus `GEARSHIFT_<AGENT>_…` environment
//!   overrides into a typed, validated config; errors name the bad key.
//! - [`keys`]: read signing keys and trusted public keys from files;
//!   write new key pairs.
//! - [`logging`]: tracing in a human or JSON format (journald-friendly).
//! - [`shutdown`]: one cancellation tree plus SIGTERM/SIGINT/SIGHUP handling.
//! - [`notify`]: systemd `sd_notify` READY, STOPPING and the watchdog.
//! - [`lock`]: an exclusive `flock` on a state directory.
//! - [`http`]: the HTTP listener that serves `/metrics` (and the dashboard).
//! - [`ratelimit`]: per-key log budgets, so that floods do not drown the log;
//!   [`refusals`] the log of messages the signed-message gate refused.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod bootstrap;
pub mod bus;
pub mod check;
pub mod config;
pub mod http;
pub mod keys;
pub mod lock;
pub mod logging;
pub mod notify;
pub mod ratelimit;
pub mod refusals;
pub mod sections;
pub mod shutdown;
