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

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use gearshift_proto::msg::{GroupStats, NodeReport};
use gearshift_service::config::{Invalid, duration};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::cloudwatch::{
    CloudWatchClient, CloudWatchOptions, DEFAULT_MAX_PER_REQUEST, SIGNING_SERVICE,
};
use crate::credentials::{AwsCredentials, CredentialSource, DEFAULT_CFN_CREDENTIALS, SecretString};
use crate::error::PushError;
use crate::gnocchi::{GnocchiClient, GnocchiOptions};
use crate::metrics::PushMetrics;
use crate::pusher::{Pusher, PusherOptions, Sink};
use crate::sample::{Sample, Unit, check_dimension_value, check_name};
use crate::sets;

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

/// `[push_stats.cloudwatch]`: a CloudWatch-compatible `PutMetricData` endpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CloudWatchConfig {
    /// Endpoint URL: Heat's `http://<heat host>:8003/v1`, AWS's
    /// `https://monitoring.<region>.amazonaws.com/`. Required.
    pub endpoint: String,
    /// Region in the signature scope. Default `"us-east-1"` (Heat accepts any).
    pub region: String,
    /// Namespace. Default `"system/linux"` (cfn-push-stats').
    pub namespace: String,
    /// A cfn-credentials file (`AWSAccessKeyId=`, `AWSSecretKey=`), used
    /// unless both keys below are set. Default `"/etc/cfn/cfn-credentials"`.
    pub credential_file: PathBuf,
    /// Access key id, instead of the file. Default none.
    pub access_key_id: Option<String>,
    /// Secret key, instead of the file. Default none.
    pub secret_access_key: Option<SecretString>,
    /// `AlarmName` dimension values (cfn-push-stats' `--watch`): each datum
    /// is sent once per name. Default none.
    pub alarm_names: Vec<String>,
    /// Data per request. Default `20` (Heat's and old CloudWatch's limit).
    pub max_per_request: usize,
    /// Signing service name. Default `"monitoring"`.
    pub service: String,
}

impl Default for CloudWatchConfig {
    fn default() -> Self {
        CloudWatchConfig {
            endpoint: String::new(),
            region: "us-east-1".into(),
            namespace: "system/linux".into(),
            credential_file: PathBuf::from(DEFAULT_CFN_CREDENTIALS),
            access_key_id: None,
            secret_access_key: None,
            alarm_names: Vec::new(),
            max_per_request: DEFAULT_MAX_PER_REQUEST,
            service: SIGNING_SERVICE.into(),
        }
    }
}

impl CloudWatchConfig {
    /// Where the credentials come from.
    pub fn credential_source(&self) -> Result<CredentialSource, PushError> {
        match (&self.access_key_id, &self.secret_access_key) {
            (Some(id), Some(secret)) => Ok(CredentialSource::Explicit(AwsCredentials::new(
                id,
                secret.expose(),
            )?)),
            (None, None) => Ok(CredentialSource::File(self.credential_file.clone())),
            _ => Err(PushError::Config(
                "access_key_id and secret_access_key go together".into(),
            )),
        }
    }
}

/// `[push_stats.gnocchi]`: Gnocchi measures with a Keystone token.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GnocchiConfig {
    /// Gnocchi's base URL (without `/v1`). Default none: the catalog's
    /// `metric` endpoint.
    pub endpoint: Option<String>,
    /// Cloud name in `clouds.yaml`. Default none (then `auth_env_file`,
    /// then the process's `OS_*` variables).
    pub cloud: Option<String>,
    /// `clouds.yaml` path (with `cloud`). Default: the standard search path.
    pub clouds_yaml: Option<PathBuf>,
    /// A file of `export OS_X=value` lines (the seeds' `auth.env`). Default none.
    pub auth_env_file: Option<PathBuf>,
    /// The resource of node samples: the node's Nova server id, so that an
    /// Aodh alarm can aggregate the group's servers by `server_group`.
    /// Default none: the node agent uses its node name.
    pub resource_id: Option<String>,
    /// Type of resources created when missing. Default `"generic"`.
    pub resource_type: String,
    /// Archive policy of metrics created when missing. Default none
    /// (Gnocchi's archive policy rules decide).
    pub archive_policy: Option<String>,
    /// Create a missing metric or resource on 404. Default `true`.
    pub create_missing: bool,
    /// Prefix of metric names. Default `"gearshift."`.
    pub metric_prefix: String,
}

impl Default for GnocchiConfig {
    fn default() -> Self {
        GnocchiConfig {
            endpoint: None,
            cloud: None,
            clouds_yaml: None,
            auth_env_file: None,
            resource_id: None,
            resource_type: "generic".into(),
            archive_policy: None,
            create_missing: true,
            metric_prefix: "gearshift.".into(),
        }
    }
}

impl GnocchiConfig {
    /// Keystone credentials: `cloud` in clouds.yaml, else `auth_env_file`,
    /// else the process's `OS_*` variables.
    pub fn credentials(&self) -> Result<gearshift_cloud::Credentials, PushError> {
        gearshift_cloud::Credentials::load(gearshift_cloud::CredentialsFrom::first_of(
            self.cloud.as_deref(),
            self.clouds_yaml.as_deref(),
            self.auth_env_file.as_deref(),
        ))
        .map_err(|e| PushError::Config(format!("gnocchi credentials: {e}")))
    }
}

fn invalid(key: &str, reason: impl Into<String>) -> Invalid {
    Invalid::new(format!("{SECTION}.{key}"), reason)
}

fn check_url(key: &str, s: &str) -> Result<(), Invalid> {
    let u = url::Url::parse(s).map_err(|e| invalid(key, format!("{s:?} is not a URL: {e}")))?;
    if !matches!(u.scheme(), "http" | "https") || u.host_str().is_none() {
        return Err(invalid(
            key,
            format!("{s:?}: expected an http(s) URL with a host"),
        ));
    }
    Ok(())
}

fn check_dims(key: &str, dims: &BTreeMap<String, String>) -> Result<(), Invalid> {
    for (k, v) in dims {
        check_name("dimension name", k).map_err(|e| invalid(&format!("{key}.{k}"), e))?;
        check_dimension_value(k, v).map_err(|e| invalid(&format!("{key}.{k}"), e))?;
    }
    Ok(())
}

impl PushStatsConfig {
    /// Checks the section; keys in errors start with `push_stats.`.
    pub fn validate(&self) -> Result<(), Invalid> {
        if !self.enabled {
            return Ok(());
        }
        if self.cloudwatch.is_none() && self.gnocchi.is_none() {
            return Err(invalid(
                "enabled",
                "push_stats is enabled but neither [push_stats.cloudwatch] nor [push_stats.gnocchi] is set",
            ));
        }
        if self.interval < Duration::from_secs(1) {
            return Err(invalid("interval", "must be at least 1s"));
        }
        if self.debounce > self.interval {
            return Err(invalid("debounce", "must not be longer than interval"));
        }
        if self.queue_capacity == 0 || self.queue_capacity > 100_000 {
            return Err(invalid("queue_capacity", "must be between 1 and 100000"));
        }
        if self.max_attempts == 0 || self.max_attempts > 100 {
            return Err(invalid("max_attempts", "must be between 1 and 100"));
        }
        if self.retry_min.is_zero() || self.retry_min > self.retry_max {
            return Err(invalid(
                "retry_min",
                "must be above zero and at most retry_max",
            ));
        }
        if self.timeout.is_zero() || self.timeout > Duration::from_secs(300) {
            return Err(invalid("timeout", "must be between 1ms and 5m"));
        }
        let known: Vec<&str> = sets::NODE_METRICS
            .iter()
            .chain(sets::FLEET_METRICS)
            .chain(sets::EVENT_METRICS)
            .copied()
            .collect();
        for m in &self.metrics {
            if !known.contains(&m.as_str()) {
                return Err(invalid(
                    "metrics",
                    format!(
                        "unknown metric {m:?}: expected some of {}",
                        known.join(", ")
                    ),
                ));
            }
        }
        if self.dimensions.len() + 2 > crate::sample::MAX_DIMENSIONS {
            return Err(invalid("dimensions", "too many dimensions"));
        }
        check_dims("dimensions", &self.dimensions)?;
        if let Some(id) = &self.instance_id {
            check_dimension_value("InstanceId", id).map_err(|e| invalid("instance_id", e))?;
        }
        for (group, dims) in &self.group_dimensions {
            let ok = group
                .split_once(':')
                .is_some_and(|(k, v)| matches!(k, "profile" | "district") && !v.is_empty());
            if !ok {
                return Err(invalid(
                    &format!("group_dimensions.{group}"),
                    "keys are profile:<name> or district:<uuid>",
                ));
            }
            check_dims(&format!("group_dimensions.{group}"), dims)?;
        }
        check_name(
            "resource prefix",
            &format!("{}x", self.group_resource_prefix),
        )
        .map_err(|e| invalid("group_resource_prefix", e))?;
        if let Some(cw) = &self.cloudwatch {
            check_url("cloudwatch.endpoint", &cw.endpoint)?;
            if cw.region.is_empty() {
                return Err(invalid("cloudwatch.region", "must not be empty"));
            }
            if cw.service.is_empty() {
                return Err(invalid("cloudwatch.service", "must not be empty"));
            }
            if cw.namespace.is_empty() || cw.namespace.len() > 255 || cw.namespace.starts_with(':')
            {
                return Err(invalid("cloudwatch.namespace", "must have 1 to 255 bytes"));
            }
            if cw.max_per_request == 0 || cw.max_per_request > 1000 {
                return Err(invalid(
                    "cloudwatch.max_per_request",
                    "must be between 1 and 1000",
                ));
            }
            for a in &cw.alarm_names {
                check_dimension_value("AlarmName", a)
                    .map_err(|e| invalid("cloudwatch.alarm_names", e))?;
            }
            cw.credential_source()
                .map_err(|e| invalid("cloudwatch.secret_access_key", e.to_string()))?;
        }
        if let Some(g) = &self.gnocchi {
            if let Some(ep) = &g.endpoint {
                check_url("gnocchi.endpoint", ep)?;
            }
            if g.resource_type.is_empty()
                || !g
                    .resource_type
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
            {
                return Err(invalid(
                    "gnocchi.resource_type",
                    "must be a resource type name",
                ));
            }
            if let Some(r) = &g.resource_id {
                check_name("resource id", r).map_err(|e| invalid("gnocchi.resource_id", e))?;
            }
            if g.metric_prefix.contains('/') {
                return Err(invalid("gnocchi.metric_prefix", "must not contain '/'"));
            }
            if g.cloud.is_none() && g.clouds_yaml.is_some() {
                return Err(invalid("gnocchi.clouds_yaml", "needs gnocchi.cloud"));
            }
        }
        Ok(())
    }

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

    fn wanted(&self, name: &str) -> bool {
        self.metrics.is_empty() || self.metrics.iter().any(|m| m == name)
    }

    fn decorate(&self, mut s: Sample) -> Sample {
        for (k, v) in &self.dimensions {
            s.dimensions.entry(k.clone()).or_insert_with(|| v.clone());
        }
        if let Some(id) = &self.instance_id {
            s.dimensions
                .entry("InstanceId".into())
                .or_insert_with(|| id.clone());
        }
        s
    }

    /// The node set for `report`, filtered and with the configured dimensions.
    pub fn node_samples(&self, report: &NodeReport) -> Vec<Sample> {
        sets::node_samples(report)
            .into_iter()
            .filter(|s| self.wanted(&s.name))
            .map(|s| self.decorate(s))
            .collect()
    }

    /// The fleet set, filtered and with the configured (and per-group) dimensions.
    pub fn fleet_samples(
        &self,
        profiles: &BTreeMap<String, GroupStats>,
        districts: &BTreeMap<String, GroupStats>,
    ) -> Vec<Sample> {
        sets::fleet_samples(profiles, districts, &self.group_resource_prefix)
            .into_iter()
            .filter(|s| self.wanted(&s.name))
            .map(|mut s| {
                let key = if let Some(p) = s.dimensions.get("Profile") {
                    format!("profile:{p}")
                } else if let Some(d) = s.dimensions.get("District") {
                    format!("district:{d}")
                } else {
                    String::new()
                };
                if let Some(extra) = self.group_dimensions.get(&key) {
                    for (k, v) in extra {
                        s.dimensions.insert(k.clone(), v.clone());
                    }
                }
                self.decorate(s)
            })
            .collect()
    }

    /// A heartbeat (cfn-push-stats `--heartbeat`) with the configured
    /// dimensions: with `alarm_names`, it fires those alarms.
    pub fn heartbeat(&self) -> Vec<Sample> {
        vec![self.decorate(Sample::heartbeat(self.event_unit))]
    }

    /// Builds the targets (reads credentials files; no network).
    /// `default_resource` is the Gnocchi resource of samples that name none
    /// when `gnocchi.resource_id` is not set (the node agent passes its name).
    pub fn build_sinks(
        &self,
        default_resource: Option<&str>,
    ) -> Result<Vec<Arc<dyn Sink>>, PushError> {
        let mut sinks: Vec<Arc<dyn Sink>> = Vec::new();
        if let Some(cw) = &self.cloudwatch {
            let endpoint = url::Url::parse(&cw.endpoint)
                .map_err(|e| PushError::Config(format!("cloudwatch.endpoint: {e}")))?;
            let creds = cw.credential_source()?.load()?;
            sinks.push(Arc::new(CloudWatchClient::new(
                CloudWatchOptions {
                    endpoint,
                    region: cw.region.clone(),
                    service: cw.service.clone(),
                    namespace: cw.namespace.clone(),
                    alarm_names: cw.alarm_names.clone(),
                    max_per_request: cw.max_per_request,
                    timeout: self.timeout,
                },
                creds,
            )?));
        }
        if let Some(g) = &self.gnocchi {
            let session = gearshift_cloud::Session::new(
                g.credentials()?,
                gearshift_cloud::SessionOptions::default(),
            )?;
            sinks.push(Arc::new(GnocchiClient::new(
                session,
                self.gnocchi_options(g, default_resource),
            )?));
        }
        Ok(sinks)
    }

    pub(crate) fn gnocchi_options(
        &self,
        g: &GnocchiConfig,
        default_resource: Option<&str>,
    ) -> GnocchiOptions {
        GnocchiOptions {
            endpoint: g.endpoint.clone(),
            default_resource: g
                .resource_id
                .clone()
                .or_else(|| default_resource.map(str::to_string)),
            resource_type: g.resource_type.clone(),
            archive_policy: g.archive_policy.clone(),
            create_missing: g.create_missing,
            metric_prefix: g.metric_prefix.clone(),
            timeout: self.timeout,
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

#[cfg(test)]
mod tests {
    use super::*;
    use gearshift_service::config::{Validate, load_str};

    #[derive(Debug, Deserialize, Default)]
    #[serde(deny_unknown_fields, default)]
    struct Agent {
        push_stats: PushStatsConfig,
    }

    impl Validate for Agent {
        fn validate(&self) -> Result<(), Invalid> {
            self.push_stats.validate()
        }
    }

    fn load(
        text: &str,
        env: &[(&str, &str)],
    ) -> Result<Agent, gearshift_service::config::ConfigError> {
        load_str(
            text,
            Path::new("node.toml"),
            "GEARSHIFT_NODE",
            env.iter().map(|(k, v)| (k.to_string(), v.to_string())),
        )
    }

    const FULL: &str = r#"
[push_stats]
enabled = true
interval = "30s"
debounce = "2s"
metrics = ["NodeUtilization", "ActiveGears"]
instance_id = "i-0001"

[push_stats.dimensions]
AutoScalingGroupName = "openshift-nodes"

[push_stats.cloudwatch]
endpoint = "http://heat.example.com:8003/v1"
alarm_names = ["NodeAlarmHigh", "NodeAlarmLow"]
access_key_id = "AKID"
secret_access_key = "sek"

[push_stats.gnocchi]
endpoint = "http://gnocchi:8041"
resource_id = "0f6c5e3a-1111-2222-3333-444455556666"
archive_policy = "low"
"#;

    #[test]
    fn defaults_are_disabled_and_valid() {
        let a = load("", &[]).unwrap();
        assert_eq!(a.push_stats, PushStatsConfig::default());
        assert!(!a.push_stats.enabled);
        assert!(
            a.push_stats
                .start(None, PushMetrics::new(), CancellationToken::new())
                .unwrap()
                .is_none()
        );
    }

    #[test]
    fn full_section_loads_with_case_kept_in_dimension_names() {
        let a = load(FULL, &[("GEARSHIFT_NODE_PUSH_STATS__INTERVAL", "45s")]).unwrap();
        let c = a.push_stats;
        assert_eq!(c.interval, Duration::from_secs(45));
        assert_eq!(
            c.dimensions.get("AutoScalingGroupName").map(String::as_str),
            Some("openshift-nodes")
        );
        let cw = c.cloudwatch.as_ref().unwrap();
        assert_eq!(cw.namespace, "system/linux");
        assert_eq!(cw.alarm_names.len(), 2);
        assert!(!format!("{cw:?}").contains("sek"));
        assert_eq!(
            c.gnocchi.as_ref().unwrap().archive_policy.as_deref(),
            Some("low")
        );
        let toml_cfg = PushStatsConfig::from_agent_toml(FULL).unwrap();
        assert_eq!(toml_cfg.interval, Duration::from_secs(30));
    }

    #[test]
    fn errors_name_the_key() {
        let e = load("[push_stats]\nenabled = true\n", &[])
            .unwrap_err()
            .to_string();
        assert!(e.contains("push_stats.enabled"), "{e}");
        let e = load("[push_stats]\nintervall = \"1s\"\n", &[])
            .unwrap_err()
            .to_string();
        assert!(e.contains("intervall"), "{e}");
        let e = load(
            "[push_stats]\nenabled = true\n[push_stats.cloudwatch]\nendpoint = \"heat:8003\"\n",
            &[],
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("push_stats.cloudwatch.endpoint"), "{e}");
        let e = load(
            "[push_stats]\nenabled = true\nmetrics = [\"Bogus\"]\n[push_stats.gnocchi]\n",
            &[],
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("push_stats.metrics") && e.contains("Bogus"),
            "{e}"
        );
        let e = load(
            "[push_stats]\nenabled = true\n[push_stats.cloudwatch]\nendpoint = \"http://h/\"\naccess_key_id = \"a\"\n",
            &[],
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("push_stats.cloudwatch"), "{e}");
        let e = load("[push_stats]\nevent_unit = \"Parsecs\"\n", &[])
            .unwrap_err()
            .to_string();
        assert!(e.contains("push_stats.event_unit"), "{e}");
        let e = load(
            "[push_stats]\nenabled = true\n[push_stats.gnocchi]\n[push_stats.group_dimensions.small]\nA = \"b\"\n",
            &[],
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("push_stats.group_dimensions.small"), "{e}");
    }

    #[test]
    fn node_samples_are_filtered_and_decorated() {
        let c = PushStatsConfig::from_agent_toml(FULL).unwrap();
        let r = crate::sets::tests::report();
        let s = c.node_samples(&r);
        assert_eq!(s.len(), 2);
        for x in &s {
            assert_eq!(
                x.dimensions.get("AutoScalingGroupName").map(String::as_str),
                Some("openshift-nodes")
            );
            assert_eq!(
                x.dimensions.get("InstanceId").map(String::as_str),
                Some("i-0001")
            );
        }
        let hb = c.heartbeat();
        assert_eq!(hb[0].name, "Heartbeat");
        assert_eq!(hb[0].unit, Unit::COUNTER);
    }

    #[test]
    fn fleet_samples_get_group_dimensions() {
        let c = PushStatsConfig::from_agent_toml(
            "[push_stats]\n[push_stats.group_dimensions.\"profile:small\"]\nAutoScalingGroupName = \"asg-small\"\n",
        )
        .unwrap();
        let profiles = BTreeMap::from([
            ("small".to_string(), GroupStats::default()),
            ("large".to_string(), GroupStats::default()),
        ]);
        let s = c.fleet_samples(&profiles, &BTreeMap::new());
        let small = s
            .iter()
            .find(|x| x.dimensions.get("Profile").map(String::as_str) == Some("small"))
            .unwrap();
        assert_eq!(
            small
                .dimensions
                .get("AutoScalingGroupName")
                .map(String::as_str),
            Some("asg-small")
        );
        let large = s
            .iter()
            .find(|x| x.dimensions.get("Profile").map(String::as_str) == Some("large"))
            .unwrap();
        assert!(!large.dimensions.contains_key("AutoScalingGroupName"));
    }

    #[test]
    fn build_sinks_reads_the_credentials_file() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("cfn-credentials");
        std::fs::write(&f, "AWSAccessKeyId=AK\nAWSSecretKey=SK\n").unwrap();
        let text = format!(
            "[push_stats]\nenabled = true\n[push_stats.cloudwatch]\nendpoint = \"http://127.0.0.1:9/\"\ncredential_file = \"{}\"\n",
            f.display()
        );
        let c = PushStatsConfig::from_agent_toml(&text).unwrap();
        let sinks = c.build_sinks(None).unwrap();
        assert_eq!(sinks.len(), 1);
        assert_eq!(sinks[0].target(), "cloudwatch");
        std::fs::remove_file(&f).unwrap();
        let e = c.build_sinks(None).err().unwrap();
        assert!(e.to_string().contains("cfn-credentials"), "{e}");
    }
}
