//! # gearshift-placement: where a gear goes
//!
//! The OpenShift gear-placement plugin (seed 003) as a library, a bus
//! service and the scale-down saga's evacuation planner. A request carries
//! the plugin's inputs (candidate nodes, application, its gears, the new
//! gear's components, the user, the request time); the answer is exactly one
//! of the candidates, or a refusal with its reason.
//!
//! ## Layout
//! - [`config`]: `[placement]` of `conf/broker.toml` and its validation.
//! - [`filter`]: the seed's seven filters, in order, one function each.
//! - [`strategy`]: the built-in strategies (the seed's examples and `default`).
//! - [`script`]: operator strategies in Rhai, sandboxed.
//! - [`command`]: operator strategies as an external command speaking JSON.
//! - [`engine`]: [`Engine`]: filters then strategy, for one request.
//! - [`evacuate`]: [`Engine::plan_evacuation`], targets for every gear of a node.
//! - [`service`]: `placement.request` / `placement.reply` on the bus.
//! - [`cli`]: `gearshift-broker place`, the operator's side of the service.
//! - [`error`]: typed errors.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod cli;
pub mod command;
pub mod config;
pub mod engine;
pub mod error;
pub mod evacuate;
pub mod filter;
pub mod script;
pub mod service;
pub mod strategy;

pub use config::{CommandConfig, DistrictMode, PlacementConfig, ScriptConfig, StrategyName};
pub use engine::{Engine, Inputs};
pub use error::{CommandError, PlacementError, PlanError, ScriptError};
pub use evacuate::EvacuationRequest;
pub use gearshift_proto::msg::Move;
