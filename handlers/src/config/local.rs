//! The handlers that run on the broker host: `exec`, `spool`, `email`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use gearshift_service::check::{absolute, nonempty, positive};
use gearshift_service::config::Invalid;
use serde::{Deserialize, Serialize};

/// `exec`: runs `<dir>/<program> create-node --profile=P --district=D` and
/// `<dir>/<program> remove-node --host=H --district=D`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecConfig {
    /// Directory of the handler (the seeds' `/opt/rh/openshift/nodemgr/<handler>`). Required.
    pub dir: PathBuf,
    /// Program in `dir`. Default `event`.
    #[serde(default = "default_event")]
    pub program: String,
    /// Longest run; the process group is killed after it. Default `10m`.
    #[serde(default = "default_exec_timeout", with = "humantime_serde")]
    pub timeout: Duration,
    /// Exit code meaning "the cloud is out of quota". Default `3`.
    #[serde(default = "default_quota_code")]
    pub quota_exit_code: i32,
    /// Exit code meaning "busy, try later". Default `4`.
    #[serde(default = "default_busy_code")]
    pub busy_exit_code: i32,
    /// Exit codes meaning "temporary failure, retry". Default `[75]` (EX_TEMPFAIL).
    #[serde(default = "default_retry_codes")]
    pub retry_exit_codes: Vec<i32>,
    /// Extra environment variables. Default none.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Bytes of stdout and of stderr kept for the log. Default `65536`.
    #[serde(default = "default_max_output")]
    pub max_output: usize,
}

fn default_event() -> String {
    "event".into()
}
fn default_exec_timeout() -> Duration {
    Duration::from_secs(600)
}
fn default_quota_code() -> i32 {
    3
}
fn default_busy_code() -> i32 {
    4
}
fn default_retry_codes() -> Vec<i32> {
    vec![75]
}
fn default_max_output() -> usize {
    64 * 1024
}

impl ExecConfig {
    /// Checks the settings.
    pub fn validate(&self) -> Result<(), Invalid> {
        absolute("dir", &self.dir)?;
        nonempty("program", &self.program)?;
        if self.program.contains('/') {
            return Err(Invalid::new("program", "must be a file name inside dir"));
        }
        positive("timeout", self.timeout)?;
        for (k, c) in [
            ("quota_exit_code", self.quota_exit_code),
            ("busy_exit_code", self.busy_exit_code),
        ] {
            if !(1..=255).contains(&c) {
                return Err(Invalid::new(k, "must be an exit code in 1..=255"));
            }
        }
        if self.quota_exit_code == self.busy_exit_code {
            return Err(Invalid::new(
                "busy_exit_code",
                "must differ from quota_exit_code",
            ));
        }
        for c in &self.retry_exit_codes {
            if !(1..=255).contains(c) || *c == self.quota_exit_code || *c == self.busy_exit_code {
                return Err(Invalid::new(
                    "retry_exit_codes",
                    format!("{c} must be in 1..=255 and differ from the quota and busy codes"),
                ));
            }
        }
        for k in self.env.keys() {
            if k.is_empty() || k.contains('=') || k.contains('\0') || k.starts_with("GEARSHIFT_") {
                return Err(Invalid::new(
                    format!("env.{k}"),
                    "must be a variable name, not starting with GEARSHIFT_ (reserved)",
                ));
            }
        }
        if !(1024..=16 * 1024 * 1024).contains(&self.max_output) {
            return Err(Invalid::new("max_output", "must be in 1024..=16777216"));
        }
        Ok(())
    }
}

/// `spool`: writes one JSON file per event.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpoolConfig {
    /// The spool directory (created with mode 0750 if missing). Required.
    pub dir: PathBuf,
}

impl SpoolConfig {
    /// Checks the settings.
    pub fn validate(&self) -> Result<(), Invalid> {
        absolute("dir", &self.dir)
    }
}

/// How the SMTP connection is secured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum SmtpSecurity {
    /// Plain SMTP (a local relay). The default.
    #[default]
    None,
    /// Plain, then `STARTTLS` (required: fails if the server does not offer it).
    Starttls,
    /// TLS from the first byte (SMTPS, usually port 465).
    Tls,
}

/// `email`: one message per event.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EmailConfig {
    /// SMTP server host. Default `127.0.0.1`.
    #[serde(default = "default_smtp_host")]
    pub smtp_host: String,
    /// SMTP port. Default `25` (`none`, `starttls`) — set 587 or 465 as your relay needs.
    #[serde(default = "default_smtp_port")]
    pub smtp_port: u16,
    /// `none`, `starttls` or `tls`. Default `none`.
    #[serde(default)]
    pub security: SmtpSecurity,
    /// PEM CA file to trust for the server's certificate. Default none (system roots).
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// SMTP AUTH user name. Default none (no AUTH).
    #[serde(default)]
    pub username: Option<String>,
    /// File holding the SMTP AUTH password (first line). Default none.
    #[serde(default)]
    pub password_file: Option<PathBuf>,
    /// Sender address. Required.
    pub from: String,
    /// Recipients. Required, at least one.
    pub to: Vec<String>,
    /// Subject prefix. Default `[gearshift]`.
    #[serde(default = "default_subject_prefix")]
    pub subject_prefix: String,
    /// Bound on one delivery. Default `30s`.
    #[serde(default = "default_smtp_timeout", with = "humantime_serde")]
    pub timeout: Duration,
}

fn default_smtp_host() -> String {
    "127.0.0.1".into()
}
fn default_smtp_port() -> u16 {
    25
}
fn default_subject_prefix() -> String {
    "[gearshift]".into()
}
fn default_smtp_timeout() -> Duration {
    Duration::from_secs(30)
}

fn is_loopback(host: &str) -> bool {
    host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .map(|ip| ip.is_loopback())
            .unwrap_or(false)
}

impl EmailConfig {
    /// Checks the settings.
    pub fn validate(&self) -> Result<(), Invalid> {
        nonempty("smtp_host", &self.smtp_host)?;
        if self.smtp_port == 0 {
            return Err(Invalid::new("smtp_port", "must not be 0"));
        }
        self.from
            .parse::<lettre::message::Mailbox>()
            .map_err(|e| Invalid::new("from", format!("{:?} is not an address: {e}", self.from)))?;
        if self.to.is_empty() {
            return Err(Invalid::new("to", "needs at least one recipient"));
        }
        for (i, t) in self.to.iter().enumerate() {
            t.parse::<lettre::message::Mailbox>().map_err(|e| {
                Invalid::new(format!("to[{i}]"), format!("{t:?} is not an address: {e}"))
            })?;
        }
        if self.username.is_some() != self.password_file.is_some() {
            return Err(Invalid::new(
                "password_file",
                "username and password_file go together",
            ));
        }
        if self.username.is_some()
            && self.security == SmtpSecurity::None
            && !is_loopback(&self.smtp_host)
        {
            return Err(Invalid::new(
                "security",
                "SMTP AUTH over an unencrypted connection to another host would expose the password; use starttls or tls",
            ));
        }
        if let Some(p) = &self.password_file {
            absolute("password_file", p)?;
        }
        if let Some(p) = &self.ca_file {
            absolute("ca_file", p)?;
        }
        if self.subject_prefix.contains(['\r', '\n']) {
            return Err(Invalid::new("subject_prefix", "must be one line"));
        }
        positive("timeout", self.timeout)
    }
}
