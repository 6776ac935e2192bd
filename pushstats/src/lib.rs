//! # gearshift-pushstats: pull mode
//!
//! In *push* mode the broker agent decides when to scale. In *pull* mode
//! (seed 000) gearshift only supplies figures and OpenStack's alarms decide:
//! Heat's CloudWatch-compatible watch rules in the OpenShift templates' day
//! (fed by heat-cfntools' `cfn-push-stats`), Aodh's Gnocchi alarms today.
//! This crate is that feed: both agents push their capacity figures, and
//! heartbeats fire alarms on demand as the templates' `notify-scale-up`
//! scripts did. `docs/pull-mode.md` explains both modes and the templates.
//!
//! ## Layout
//! - [`sample`]: [`Sample`] (one figure) and [`Unit`] (CloudWatch's units).
//! - [`sets`]: the node set (from a `NodeReport`) and the fleet set (from
//!   `GroupStats` per profile and district).
//! - [`sigv4`]: AWS Signature Version 4, pure, tested on AWS's vectors.
//! - [`credentials`]: `cfn-credentials` files and access keys.
//! - [`cloudwatch`]: `PutMetricData` over the AWS query API.
//! - [`gnocchi`]: measures to Gnocchi with a Keystone token (via `gearshift-cloud`).
//! - `http`: both targets' HTTP, `gearshift_cloud::http`'s client (no second setup).
//! - [`pusher`]: the background [`Pusher`] (interval, on-change with
//!   debounce, bounded queue, retries with the bus's backoff) and its [`Sink`] trait.
//! - [`metrics`]: the pusher's Prometheus counters, for the agents' `/metrics`.
//! - [`config`]: the `[push_stats]` section the agents embed (its targets,
//!   checks and sample sets in `config/`).
//! - [`cli`]: the `push-stats` subcommand (cfn-push-stats-style options).
//! - [`error`]: [`PushError`], classified by `is_retryable()`.
//!
//! ## For the agents
//! ```ignore
//! let pusher = cfg.push_stats.start(Some(&node_name), push_metrics.clone(), cancel.child_token())?;
//! // on every report (never blocks):
//! if let Some(p) = &pusher { p.handle().update(cfg.push_stats.node_samples(&report)); }
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod cli;
pub mod cloudwatch;
pub mod config;
pub mod credentials;
pub mod error;
pub mod gnocchi;
mod http;
pub mod metrics;
pub mod pusher;
pub mod sample;
pub mod sets;
pub mod sigv4;

pub use cli::{PushReport, PushStatsArgs, run_push_stats};
pub use config::PushStatsConfig;
pub use credentials::AwsCredentials;
pub use error::PushError;
pub use metrics::PushMetrics;
pub use pusher::{PushHandle, Pusher, PusherOptions, Sink};
pub use sample::{Sample, Unit};
