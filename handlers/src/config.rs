//! Handler configuration: one [`HandlerConfig`] per `[handlers.<name>]`
//! table of `conf/broker.toml`, checked by [`HandlerConfig::validate`]
//! without touching the network or the disk. Problems are the agents'
//! one validation error, [`Invalid`], with keys relative to the handler's
//! table (the broker agent prefixes `handlers.<name>.`).
//!
//! `docs/handlers.md` documents every field with an example; the doc
//! comments give each field's default. `local` holds the handlers that
//! run on the broker host (`exec`, `spool`, `email`), `openstack` those
//! that call OpenStack APIs (`nova`, `heat`, `magnum`, `heat-via-node`).

use std::time::Duration;

pub use gearshift_service::config::Invalid;
use serde::{Deserialize, Serialize};

mod local;
mod openstack;
#[cfg(test)]
mod tests;

pub use local::{EmailConfig, ExecConfig, SmtpSecurity, SpoolConfig};
pub use openstack::{
    HeatConfig, HeatRemove, HeatScaleUp, HeatViaNodeConfig, MagnumConfig, NovaConfig,
    OpenStackAuth, ServerName,
};

/// One handler's settings, selected by `type`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "kebab-case", deny_unknown_fields)]
pub enum HandlerConfig {
    /// `type = "log"`: the dry run; no settings.
    Log {},
    /// `type = "exec"`: the seeds' `event` script contract.
    Exec(ExecConfig),
    /// `type = "spool"`: one JSON file per event in a directory.
    Spool(SpoolConfig),
    /// `type = "email"`: one message per event over SMTP.
    Email(EmailConfig),
    /// `type = "nova"`: Keystone v3 + Nova (+ Cinder) with the seeds' naming.
    Nova(NovaConfig),
    /// `type = "heat"`: a Heat stack's scaling policy or ResourceGroup.
    Heat(HeatConfig),
    /// `type = "magnum"`: a Magnum cluster's node group resize.
    Magnum(MagnumConfig),
    /// `type = "heat-via-node"`: a node agent sends the Heat signal.
    HeatViaNode(HeatViaNodeConfig),
}

impl HandlerConfig {
    /// The `type` name.
    pub fn kind(&self) -> &'static str {
        match self {
            HandlerConfig::Log {} => "log",
            HandlerConfig::Exec(_) => "exec",
            HandlerConfig::Spool(_) => "spool",
            HandlerConfig::Email(_) => "email",
            HandlerConfig::Nova(_) => "nova",
            HandlerConfig::Heat(_) => "heat",
            HandlerConfig::Magnum(_) => "magnum",
            HandlerConfig::HeatViaNode(_) => "heat-via-node",
        }
    }

    /// Whether the handler reads the broker agent's fleet view
    /// ([`crate::FleetView`]): only then does the agent keep one up to date.
    pub fn reads_fleet(&self) -> bool {
        matches!(self, HandlerConfig::HeatViaNode(_))
    }

    /// The longest one create or remove call may legitimately take with these
    /// settings (the handler's own waits for a server, a volume, a stack update,
    /// a resize, a node's answer); `None` for handlers that return at once.
    /// The broker agent never times a call out before this.
    pub fn longest_call(&self) -> Option<Duration> {
        match self {
            HandlerConfig::Log {} | HandlerConfig::Spool(_) => None,
            HandlerConfig::Exec(c) => Some(c.timeout),
            HandlerConfig::Email(c) => Some(c.timeout),
            HandlerConfig::Nova(c) => {
                Some((c.volume_timeout + c.boot_timeout).max(c.delete_timeout))
            }
            HandlerConfig::Heat(c) => Some(c.update_timeout),
            HandlerConfig::Magnum(c) => Some(c.resize_timeout),
            // One action, trying up to `max_nodes_tried` nodes (kept at twice
            // that: the broker's bound must not shrink for existing configs).
            HandlerConfig::HeatViaNode(c) => Some(c.node_timeout * c.max_nodes_tried.max(1) * 2),
        }
    }

    /// Checks the settings (no network, no files read).
    pub fn validate(&self) -> Result<(), Invalid> {
        match self {
            HandlerConfig::Log {} => Ok(()),
            HandlerConfig::Exec(c) => c.validate(),
            HandlerConfig::Spool(c) => c.validate(),
            HandlerConfig::Email(c) => c.validate(),
            HandlerConfig::Nova(c) => c.validate(),
            HandlerConfig::Heat(c) => c.validate(),
            HandlerConfig::Magnum(c) => c.validate(),
            HandlerConfig::HeatViaNode(c) => c.validate(),
        }
    }
}

/// A DNS label or dotted name (`[a-z0-9-]`, labels 1..=63, total <= 253).
pub(crate) fn dns_name(key: &str, s: &str, dotted: bool) -> Result<(), Invalid> {
    let bad = |why: &str| Err(Invalid::new(key, format!("{s:?} {why}")));
    if s.is_empty() || s.len() > 253 {
        return bad("must be 1..=253 characters");
    }
    for label in s.split('.') {
        if !dotted && s.contains('.') {
            return bad("must be a single DNS label (no dots)");
        }
        if label.is_empty() || label.len() > 63 {
            return bad("has an empty or over-long label");
        }
        if !label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
            || label.starts_with('-')
            || label.ends_with('-')
        {
            return bad("may hold only letters, digits and inner hyphens");
        }
    }
    Ok(())
}

impl From<Invalid> for crate::BuildError {
    fn from(e: Invalid) -> Self {
        crate::BuildError::Invalid(e)
    }
}
