//! `push-stats`: a one-shot push in the spirit of heat-cfntools'
//! `cfn-push-stats`, for cron jobs and operators. Both agents mount it as a
//! subcommand (`gearshift-node push-stats ...`, `gearshift-broker push-stats ...`).
//!
//! ```text
//! # what the OpenShift templates' notify-scale-up script did:
//! gearshift-broker push-stats --credential-file /etc/heat/heat-credentials \
//!     --url http://heat:8003/v1 --heartbeat --watch openshift-NodeScaleUp-x1
//! # a figure, as their node crontab did:
//! gearshift-node push-stats --url http://heat:8003/v1 \
//!     --metric NodeUtilization --units Percent --value 90 --watch openshift-NodeAlarmHigh-x1
//! # a node's whole set from a saved report, to Gnocchi with the OS_* variables:
//! gearshift-node push-stats --gnocchi --from-report report.json --resource-id $SERVER_ID
//! # the targets of an agent's [push_stats] section:
//! gearshift-node push-stats --config /etc/gearshift/node.toml --heartbeat
//! ```

use std::path::PathBuf;
use std::time::Duration;

use gearshift_proto::msg::NodeReport;

use crate::cloudwatch::{encode_form, form_params};
use crate::config::{CloudWatchConfig, GnocchiConfig, PushStatsConfig};
use crate::error::PushError;
use crate::gnocchi::plan;
use crate::pusher::backoff;
use crate::sample::{Sample, Unit};

/// Largest report file read by `--from-report`.
const MAX_REPORT_FILE: u64 = 1024 * 1024;

fn parse_unit(s: &str) -> Result<Unit, String> {
    Unit::parse(s)
}

fn parse_dimension(s: &str) -> Result<(String, String), String> {
    let (k, v) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?}: expected NAME=VALUE"))?;
    crate::sample::check_name("dimension name", k.trim())?;
    crate::sample::check_dimension_value(k.trim(), v.trim())?;
    Ok((k.trim().to_string(), v.trim().to_string()))
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s.trim())
        .map_err(|e| format!("{s:?}: expected a duration like 10s: {e}"))
}

/// The options of `push-stats`.
#[derive(Debug, Clone, clap::Args)]
pub struct PushStatsArgs {
    /// Name of a metric to push (with --value), e.g. NodeUtilization.
    #[arg(long, value_name = "NAME", requires = "value")]
    pub metric: Option<String>,
    /// Its value.
    #[arg(
        long,
        value_name = "V",
        requires = "metric",
        allow_negative_numbers = true
    )]
    pub value: Option<f64>,
    /// Its unit: a CloudWatch unit (Percent, Count, Megabytes, None, ...). Default None.
    #[arg(long, value_name = "U", value_parser = parse_unit)]
    pub units: Option<Unit>,
    /// Send a Heartbeat (= 1): with --watch, fires that alarm, as the
    /// templates' notify-scale-up/notify-scale-down scripts did.
    #[arg(long)]
    pub heartbeat: bool,
    /// Send a ServiceFailure (= 1).
    #[arg(long)]
    pub service_failure: bool,
    /// Unit of Heartbeat and ServiceFailure. Default: the config's, else Counter (cfn-push-stats').
    #[arg(long, value_name = "U", value_parser = parse_unit)]
    pub event_unit: Option<Unit>,
    /// Alarm (watch) to post to: adds an AlarmName dimension. Repeatable.
    #[arg(long = "watch", value_name = "ALARM")]
    pub watch: Vec<String>,
    /// Push a node's whole metric set from a saved NodeReport (JSON).
    #[arg(long, value_name = "FILE")]
    pub from_report: Option<PathBuf>,
    /// Take targets and dimensions from the `[push_stats]` section of an
    /// agent's configuration file (options below override it).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,

    /// CloudWatch-compatible endpoint, e.g. http://heat:8003/v1.
    #[arg(long, value_name = "URL", env = "GEARSHIFT_CLOUDWATCH_URL")]
    pub url: Option<String>,
    /// cfn-credentials file (AWSAccessKeyId=, AWSSecretKey=). Default /etc/cfn/cfn-credentials.
    #[arg(long, value_name = "FILE")]
    pub credential_file: Option<PathBuf>,
    /// Region in the signature scope. Default us-east-1.
    #[arg(long)]
    pub region: Option<String>,
    /// Namespace. Default system/linux.
    #[arg(long)]
    pub namespace: Option<String>,
    /// A dimension NAME=VALUE on every datum. Repeatable.
    #[arg(long = "dimension", value_name = "NAME=VALUE", value_parser = parse_dimension)]
    pub dimensions: Vec<(String, String)>,
    /// Adds AutoScalingGroupName=NAME.
    #[arg(long, value_name = "NAME")]
    pub auto_scaling_group: Option<String>,
    /// Adds InstanceId=ID.
    #[arg(long, value_name = "ID")]
    pub instance_id: Option<String>,

    /// Push to Gnocchi (Keystone credentials from OS_* or --os-cloud).
    #[arg(long)]
    pub gnocchi: bool,
    /// Gnocchi's URL, instead of the catalog's metric endpoint (implies --gnocchi).
    #[arg(long, value_name = "URL")]
    pub gnocchi_url: Option<String>,
    /// Cloud in clouds.yaml.
    #[arg(long, value_name = "NAME", env = "OS_CLOUD")]
    pub os_cloud: Option<String>,
    /// A file of `export OS_X=value` lines (auth.env).
    #[arg(long, value_name = "FILE")]
    pub os_env_file: Option<PathBuf>,
    /// Gnocchi resource of the samples. Default: the config's, else the report's node name.
    #[arg(long, value_name = "ID")]
    pub resource_id: Option<String>,
    /// Type of a resource created when missing. Default generic.
    #[arg(long, value_name = "TYPE")]
    pub resource_type: Option<String>,
    /// Archive policy of a metric created when missing.
    #[arg(long, value_name = "NAME")]
    pub archive_policy: Option<String>,
    /// Do not create missing metrics or resources.
    #[arg(long)]
    pub no_create: bool,

    /// Attempts per target (retryable failures only).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=20))]
    pub attempts: u32,
    /// Timeout of one request (500ms, 10s, 1m).
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub timeout: Duration,
    /// Print what would be sent; send nothing.
    #[arg(long)]
    pub dry_run: bool,
}

#[derive(clap::Parser)]
#[command(name = "push-stats")]
struct Standalone {
    #[command(flatten)]
    args: PushStatsArgs,
}

impl PushStatsArgs {
    /// Parses `push-stats` options from `argv` (`argv[0]` is the program name).
    pub fn try_parse_from<I, T>(argv: I) -> Result<Self, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        <Standalone as clap::Parser>::try_parse_from(argv).map(|s| s.args)
    }
}

/// What a target received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetReport {
    /// `cloudwatch` or `gnocchi`.
    pub target: String,
    /// Samples sent.
    pub samples: usize,
    /// Attempts made.
    pub attempts: u32,
}

/// The outcome of [`run_push_stats`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PushReport {
    /// One entry per target pushed to.
    pub targets: Vec<TargetReport>,
    /// With `--dry-run`: the requests that would be sent, one per line
    /// (bodies shown, no credentials, nothing signed).
    pub dry_run: Vec<String>,
}

/// Merges the options into a configuration (the `--config` file's section,
/// or the defaults) and builds the samples.
pub fn resolve(
    args: &PushStatsArgs,
) -> Result<(PushStatsConfig, Vec<Sample>, Option<String>), PushError> {
    let mut cfg = match &args.config {
        Some(p) => PushStatsConfig::from_agent_file(p)?,
        None => PushStatsConfig::default(),
    };
    cfg.timeout = args.timeout;
    if let Some(u) = args.event_unit {
        cfg.event_unit = u;
    }
    if let Some(url) = &args.url {
        cfg.cloudwatch
            .get_or_insert_with(CloudWatchConfig::default)
            .endpoint = url.clone();
    }
    if let Some(cw) = cfg.cloudwatch.as_mut() {
        if let Some(f) = &args.credential_file {
            cw.credential_file = f.clone();
            cw.access_key_id = None;
            cw.secret_access_key = None;
        }
        if let Some(r) = &args.region {
            cw.region = r.clone();
        }
        if let Some(n) = &args.namespace {
            cw.namespace = n.clone();
        }
        if !args.watch.is_empty() {
            cw.alarm_names = args.watch.clone();
        }
    } else if !args.watch.is_empty() {
        return Err(PushError::Config(
            "--watch names a CloudWatch alarm: give --url (or a config with [push_stats.cloudwatch])".into(),
        ));
    }
    if args.gnocchi || args.gnocchi_url.is_some() {
        cfg.gnocchi.get_or_insert_with(GnocchiConfig::default);
    }
    if let Some(g) = cfg.gnocchi.as_mut() {
        if let Some(u) = &args.gnocchi_url {
            g.endpoint = Some(u.clone());
        }
        if let Some(c) = &args.os_cloud {
            g.cloud = Some(c.clone());
        }
        if let Some(f) = &args.os_env_file {
            g.auth_env_file = Some(f.clone());
        }
        if let Some(r) = &args.resource_id {
            g.resource_id = Some(r.clone());
        }
        if let Some(t) = &args.resource_type {
            g.resource_type = t.clone();
        }
        if let Some(a) = &args.archive_policy {
            g.archive_policy = Some(a.clone());
        }
        if args.no_create {
            g.create_missing = false;
        }
    }
    for (k, v) in &args.dimensions {
        cfg.dimensions.insert(k.clone(), v.clone());
    }
    if let Some(asg) = &args.auto_scaling_group {
        cfg.dimensions
            .insert("AutoScalingGroupName".into(), asg.clone());
    }
    if let Some(id) = &args.instance_id {
        cfg.instance_id = Some(id.clone());
    }
    if cfg.cloudwatch.is_none() && cfg.gnocchi.is_none() {
        return Err(PushError::Config(
            "no target: give --url (CloudWatch-compatible) or --gnocchi, or --config with a [push_stats] section".into(),
        ));
    }
    // A one-shot push works whether or not the agent's pusher is enabled.
    let mut check = cfg.clone();
    check.enabled = true;
    check
        .validate()
        .map_err(|i| PushError::Config(format!("{}: {}", i.key, i.reason)))?;

    let mut samples = Vec::new();
    let mut default_resource = None;
    if let Some(path) = &args.from_report {
        let report = read_report(path)?;
        default_resource = Some(report.node.clone());
        // Operators name what they want with --metric; the config's filter applies.
        samples.extend(cfg.node_samples(&report));
    }
    if let (Some(name), Some(value)) = (&args.metric, args.value) {
        samples.push(decorate(
            &cfg,
            Sample::new(name.clone(), value, args.units.unwrap_or(Unit::NONE)),
        ));
    }
    if args.heartbeat {
        samples.extend(cfg.heartbeat());
    }
    if args.service_failure {
        samples.push(decorate(&cfg, Sample::service_failure(cfg.event_unit)));
    }
    if samples.is_empty() {
        return Err(PushError::Config(
            "nothing to push: give --metric with --value, --heartbeat, --service-failure or --from-report".into(),
        ));
    }
    let now = chrono::Utc::now();
    for s in &mut samples {
        s.timestamp.get_or_insert(now);
        s.validate()?;
    }
    Ok((cfg, samples, default_resource))
}

fn decorate(cfg: &PushStatsConfig, mut s: Sample) -> Sample {
    for (k, v) in &cfg.dimensions {
        s.dimensions.entry(k.clone()).or_insert_with(|| v.clone());
    }
    if let Some(id) = &cfg.instance_id {
        s.dimensions
            .entry("InstanceId".into())
            .or_insert_with(|| id.clone());
    }
    s
}

fn read_report(path: &std::path::Path) -> Result<NodeReport, PushError> {
    let err = |m: String| PushError::Config(format!("--from-report {}: {m}", path.display()));
    let meta = std::fs::metadata(path).map_err(|e| err(e.to_string()))?;
    if meta.len() > MAX_REPORT_FILE {
        return Err(err(format!("larger than {MAX_REPORT_FILE} bytes")));
    }
    let text = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
    // Either the bare report or a whole bus envelope whose body is one.
    let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| err(e.to_string()))?;
    let body = if v.get("kind").is_some() && v.get("body").is_some() {
        v["body"].clone()
    } else {
        v
    };
    let report: NodeReport = serde_json::from_value(body).map_err(|e| err(e.to_string()))?;
    gearshift_proto::msg::Validate::validate(&report).map_err(err)?;
    Ok(report)
}

/// Runs `push-stats`: pushes the samples once to every target, retrying
/// retryable failures, and reports what was sent. Every target is tried;
/// the first failure is returned after all were.
pub async fn run_push_stats(args: &PushStatsArgs) -> Result<PushReport, PushError> {
    let (cfg, samples, default_resource) = resolve(args)?;
    let mut report = PushReport::default();
    if args.dry_run {
        let now = chrono::Utc::now();
        if let Some(cw) = &cfg.cloudwatch {
            let per = (cw.max_per_request / cw.alarm_names.len().max(1)).max(1);
            for chunk in samples.chunks(per) {
                report.dry_run.push(format!(
                    "cloudwatch POST {} {}",
                    cw.endpoint,
                    encode_form(&form_params(&cw.namespace, chunk, &cw.alarm_names, now))
                ));
            }
        }
        if let Some(g) = &cfg.gnocchi {
            let opts = cfg.gnocchi_options(g, default_resource.as_deref());
            for r in plan(&samples, &opts, now)? {
                report.dry_run.push(format!(
                    "gnocchi POST {}{} {}",
                    g.endpoint.as_deref().unwrap_or("<catalog metric endpoint>"),
                    r.path,
                    r.body
                ));
            }
        }
        return Ok(report);
    }
    let sinks = cfg.build_sinks(default_resource.as_deref())?;
    let mut first_error = None;
    for sink in sinks {
        let mut attempts = 0;
        loop {
            attempts += 1;
            match sink.push(&samples).await {
                Ok(()) => {
                    report.targets.push(TargetReport {
                        target: sink.target().to_string(),
                        samples: samples.len(),
                        attempts,
                    });
                    break;
                }
                Err(e) if e.is_retryable() && attempts < args.attempts => {
                    let d = backoff(attempts, Duration::from_secs(1), Duration::from_secs(10));
                    tracing::warn!(target = sink.target(), attempt = attempts, error = %e, retry_in = ?d, "push failed; retrying");
                    tokio::time::sleep(d).await;
                }
                Err(e) => {
                    tracing::error!(target = sink.target(), attempt = attempts, error = %e, "push failed");
                    first_error.get_or_insert(e);
                    break;
                }
            }
        }
    }
    match first_error {
        Some(e) => Err(e),
        None => Ok(report),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(argv: &[&str]) -> Result<PushStatsArgs, clap::Error> {
        let mut v = vec!["push-stats"];
        v.extend_from_slice(argv);
        PushStatsArgs::try_parse_from(v)
    }

    #[test]
    fn cfn_push_stats_style_options() {
        let a = parse(&[
            "--url",
            "http://heat:8003/v1",
            "--metric",
            "NodeUtilization",
            "--units",
            "percent",
            "--value",
            "90",
            "--watch",
            "High",
            "--watch",
            "Low",
            "--dimension",
            "AutoScalingGroupName=asg",
        ])
        .unwrap();
        assert_eq!(a.units, Some(Unit::PERCENT));
        assert_eq!(a.watch, vec!["High", "Low"]);
        let (cfg, samples, _) = resolve(&a).unwrap();
        assert_eq!(cfg.cloudwatch.unwrap().alarm_names, vec!["High", "Low"]);
        assert_eq!(samples.len(), 1);
        assert_eq!(samples[0].value, 90.0);
        assert_eq!(samples[0].dimensions["AutoScalingGroupName"], "asg");
        assert!(parse(&["--metric", "X"]).is_err(), "--metric needs --value");
        assert!(parse(&["--units", "furlongs"]).is_err());
        assert!(parse(&["--dimension", "novalue"]).is_err());
        assert!(parse(&["--value", "-3", "--metric", "M"]).is_ok());
    }

    #[test]
    fn resolve_errors() {
        let e = resolve(&parse(&["--heartbeat"]).unwrap()).unwrap_err();
        assert!(e.to_string().contains("no target"), "{e}");
        let e = resolve(&parse(&["--url", "http://h/"]).unwrap()).unwrap_err();
        assert!(e.to_string().contains("nothing to push"), "{e}");
        let e =
            resolve(&parse(&["--gnocchi", "--heartbeat", "--watch", "A"]).unwrap()).unwrap_err();
        assert!(e.to_string().contains("--watch"), "{e}");
        let e = resolve(&parse(&["--url", "h:8003", "--heartbeat"]).unwrap()).unwrap_err();
        assert!(e.to_string().contains("cloudwatch.endpoint"), "{e}");
    }

    #[tokio::test]
    async fn dry_run_shows_both_targets_without_credentials() {
        let dir = tempfile::tempdir().unwrap();
        let report = dir.path().join("report.json");
        std::fs::write(
            &report,
            serde_json::to_string(&crate::sets::tests::report()).unwrap(),
        )
        .unwrap();
        let a = parse(&[
            "--url",
            "http://heat:8003/v1",
            "--gnocchi-url",
            "http://gnocchi:8041",
            "--heartbeat",
            "--watch",
            "ScaleUp",
            "--from-report",
            report.to_str().unwrap(),
            "--dry-run",
            "--credential-file",
            "/nonexistent",
        ])
        .unwrap();
        let out = run_push_stats(&a).await.unwrap();
        let cw: Vec<_> = out
            .dry_run
            .iter()
            .filter(|l| l.starts_with("cloudwatch "))
            .collect();
        assert!(!cw.is_empty());
        assert!(
            cw.iter()
                .any(|l| l.contains("MetricName=Heartbeat") && l.contains("Value=ScaleUp"))
        );
        assert!(out.dry_run.iter().any(|l| l.starts_with(
            "gnocchi POST http://gnocchi:8041/v1/resource/generic/node-1.example.com/metric/gearshift.node_utilization/measures"
        )));
        assert!(out.targets.is_empty());
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert!(parse_duration("soon").is_err());
    }
}
