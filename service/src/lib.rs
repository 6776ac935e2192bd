//! # gearshift-service: one service skeleton for both agents
//!
//! ## Layout
//! - [`bootstrap`]: what both binaries do the same way: configuration
//!   load and `check-config`, exit codes (`2` for a bad configuration),
//!   `keygen`, logging, SIGHUP reloads that keep the running configuration
//!   when the new one is invalid, the bus's first connection, the metrics
//!   listener, `sd_notify`, and one [`shutdown`] tree for every task.
//! - [`config`]: load a TOML file plus `GEARSHIFT_<AGENT>_…` environment
//!   overrides into a typed, validated config; errors name the bad key.
//!   [`config::Invalid`] is the one validation error of both agents, the
//!   handlers and pull mode; [`config::Documented`] keeps the shipped
//!   files in step with the compiled defaults.
//! - [`sections`]: the `[bus]`, `[keys]`, `[log]` and `[metrics]` sections
//!   both agents share, with their defaults and checks; [`check`]: the
//!   simple value checks every section uses.
//! - [`bus`]: the bus's first connection, retried with backoff, and a bus
//!   usable before it is connected.
//! - [`atomic`]: replace a file atomically (temporary file, fsync, rename).
//! - [`keys`]: read signing keys and trusted public keys from files and
//!   directories; write new key pairs.
//! - [`logging`]: tracing in a human or JSON format (journald-friendly).
//! - [`shutdown`]: one cancellation tree plus SIGTERM/SIGINT/SIGHUP handling.
//! - [`notify`]: systemd `sd_notify` READY, STOPPING and the watchdog.
//! - [`lock`]: an exclusive `flock` on a state directory.
//! - [`http`]: the HTTP listener that serves `/metrics` (and the dashboard),
//!   movable to a new address by a reload.
//! - [`reload`]: which changed keys a reload can apply and which need a restart.
//! - [`ratelimit`]: per-key log budgets, so that floods do not drown the log;
//!   [`refusals`] the log of messages the signed-message gate refused.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod atomic;
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
pub mod reload;
pub mod sections;
pub mod shutdown;
