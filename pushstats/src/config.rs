//! `[push_stats]`: the section both agents embed in their configuration
//! files to push their figures for Heat/Aodh alarms (pull mode).
//!
//! ```toml
//! [push_stats]
//! enabled = true
//! interval = "60s"
//!
//! [push_stats.dimensions]
//! AutoScalingGroupName = "openshift-nodes"
//!
//! [push_stats.cloudwatch]
//! endpoint = "http://heat.example.com:8003/v1"
//! credential_file = "/etc/cfn/cfn-credentials"
//! alarm_names = ["openshift-NodeAlarmHigh-x1", "openshift-NodeAlarmLow-x1"]
//!
//! [push_stats.gnocchi]
//! resource_id = "0f6c5e3a-..."   # the node's Nova server id
//! archive_policy = "low"
//! ```
//!
//! Every key has a default (documented on each field); an empty or absent
//! section pushes nothing. [`PushStatsConfig::validate`] checks what can be
//! checked without the network and names the bad key
//! (`push_stats.cloudwatch.endpoint`, ...).
//!
//! `targets` holds the two targets' sections and the clients built from
//! them, `check` the checks, `samples` the figures an agent pushes.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use gearshift_service::config::duration;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::error::PushError;
use crate::metrics::PushMetrics;
use crate::pusher::{Pusher, PusherOptions};
use crate::sample::Unit;

mod check;
mod samples;
mod targets;
#[cfg(test)]
mod tests;

pub use targets::{CloudWatchConfig, GnocchiConfig};

/// The section name the agents use.
pub const SECTION: &str = "push_stats";

/// `[push_stats]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PushStatsConfig {
    /// Push at all. Default `false`.
    pub enabled: bool,
    /// Push the current figures this often (an alarm wants one datapoint
    /// per period: keep it at or below the alarm's period). Default `"60s"`.
    #[serde(with = "duration")]
    pub interval: Duration,
    /// Also push soon after a figure changes. Default `true`.
    pub on_change: bool,
    /// How long after a change to push, so that a burst makes one push.
    /// Default `"5s"`.
    #[serde(with = "duration")]
    pub debounce: Duration,
    /// Batches kept per target while it cannot be reached; the oldest is
    /// dropped (and counted) when full. Default `64`.
    pub queue_capacity: usize,
    /// Attempts per batch, the first included. Default `5`.
    pub max_attempts: u32,
    /// First retry delay (doubled each time, with jitter). Default `"1s"`.
    #[serde(with = "duration")]
    pub retry_min: Duration,
    /// Longest retry delay. Default `"60s"`.
    #[serde(with = "duration")]
    pub retry_max: Duration,
    /// Longest one HTTP request may take. Default `"10s"`.
    #[serde(with = "duration")]
    pub timeout: Duration,
    /// Metric names to push (see `gearshift_pushstats::sets`); empty means
    /// all of the agent's set. Default `[]`.
    pub metrics: Vec<String>,
    /// Dimensions added to every datum, for example
    /// `AutoScalingGroupName = "<the group's name>"` so that the alarm's
    /// dimensions match. Default none.
    pub dimensions: BTreeMap<String, String>,
    /// Adds an `InstanceId` dimension with this value (the Nova server id).
    /// Default none.
    pub instance_id: Option<String>,
    /// Broker only: extra dimensions per group, keyed `profile:<name>` or
    /// `district:<uuid>`, for example to give each profile its own
    /// `AutoScalingGroupName`. Default none.
    pub group_dimensions: BTreeMap<String, BTreeMap<String, String>>,
    /// Broker only: prefix of the Gnocchi resource ids of groups
    /// (`<prefix>profile-<name>`, `<prefix>district-<uuid>`). Default `"gearshift-"`.
    pub group_resource_prefix: String,
    /// Unit of `Heartbeat` and `ServiceFailure`: `Counter` as
    /// cfn-push-stats sent it (Heat's API takes any unit); use `Count` for
    /// AWS CloudWatch, which only takes its standard units. Default `"Counter"`.
    pub event_unit: Unit,
    /// The CloudWatch-compatible target. Default none.
    pub cloudwatch: Option<CloudWatchConfig>,
    /// The Gnocchi target. Default none.
    pub gnocchi: Option<GnocchiConfig>,
}

impl Default for PushStatsConfig {
    fn default() -> Self {
        PushStatsConfig {
            enabled: false,
            interval: Duration::from_secs(60),
            on_change: true,
            debounce: Duration::from_secs(5),
            queue_capacity: 64,
            max_attempts: 5,
            retry_min: Duration::from_secs(1),
            retry_max: Duration::from_secs(60),
            timeout: Duration::from_secs(10),
            metrics: Vec::new(),
            dimensions: BTreeMap::new(),
            instance_id: None,
            group_dimensions: BTreeMap::new(),
            group_resource_prefix: "gearshift-".into(),
            event_unit: Unit::COUNTER,
            cloudwatch: None,
            gnocchi: None,
        }
    }
}

impl PushStatsConfig {
    /// The pusher's timing and bounds.
    pub fn pusher_options(&self) -> PusherOptions {
        PusherOptions {
            interval: self.interval,
            on_change: self.on_change,
            debounce: self.debounce,
            queue_capacity: self.queue_capacity,
            max_attempts: self.max_attempts,
            retry_min: self.retry_min,
            retry_max: self.retry_max,
            attempt_timeout: self.timeout.saturating_mul(4),
        }
    }

    /// Starts a [`Pusher`] for this section, or `None` when it is disabled.
    /// The agents call this once at start-up, then hand it samples with
    /// [`crate::PushHandle::update`] (and heartbeats with `send`).
    pub fn start(
        &self,
        default_resource: Option<&str>,
        metrics: PushMetrics,
        cancel: CancellationToken,
    ) -> Result<Option<Pusher>, PushError> {
        self.start_in(default_resource, metrics, cancel, &TaskTracker::new())
    }

    /// Like [`PushStatsConfig::start`], the pusher's tasks also tracked by
    /// `tracker` (the agent's shutdown tree).
    pub fn start_in(
        &self,
        default_resource: Option<&str>,
        metrics: PushMetrics,
        cancel: CancellationToken,
        tracker: &TaskTracker,
    ) -> Result<Option<Pusher>, PushError> {
        if !self.enabled {
            return Ok(None);
        }
        self.validate()
            .map_err(|i| PushError::Config(i.to_string()))?;
        let sinks = self.build_sinks(default_resource)?;
        tracing::info!(
            targets = ?sinks.iter().map(|s| s.target().to_string()).collect::<Vec<_>>(),
            interval = ?self.interval,
            "pushing capacity metrics for alarms (pull mode)"
        );
        Ok(Some(Pusher::spawn_in(
            self.pusher_options(),
            sinks,
            metrics,
            cancel,
            tracker,
        )))
    }

    /// Reads the `[push_stats]` table of an agent's TOML configuration file
    /// (the rest of the file is ignored). An absent table gives the defaults.
    pub fn from_agent_file(path: &Path) -> Result<Self, PushError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| PushError::Config(format!("cannot read {}: {e}", path.display())))?;
        Self::from_agent_toml(&text)
            .map_err(|e| PushError::Config(format!("{}: {e}", path.display())))
    }

    /// Like [`PushStatsConfig::from_agent_file`], from the file's text.
    pub fn from_agent_toml(text: &str) -> Result<Self, String> {
        let doc: toml::Table = toml::from_str(text).map_err(|e| e.to_string())?;
        let section = match doc.get(SECTION) {
            None => return Ok(PushStatsConfig::default()),
            Some(v) => v.clone(),
        };
        let cfg: PushStatsConfig = section
            .try_into()
            .map_err(|e: toml::de::Error| format!("[{SECTION}]: {}", e.message()))?;
        cfg.validate()
            .map_err(|i| format!("{}: {}", i.key, i.reason))?;
        Ok(cfg)
    }
}
