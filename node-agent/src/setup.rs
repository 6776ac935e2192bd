//! From the configuration file to a runnable agent: the node's name, key
//! files, `booted_for`, the runtime and the Heat signaller.

use std::sync::Arc;

use thiserror::Error;

use crate::agent::AgentConfig;
use crate::config::NodeConfig;
use crate::metrics::Metrics;

/// Why the agent cannot be set up from its configuration.
#[derive(Debug, Error)]
pub enum SetupError {
    /// A key file is missing or malformed.
    #[error("{key}: {source}")]
    Keys {
        /// Config key naming the file.
        key: String,
        /// The error.
        source: gearshift_service::keys::KeyFileError,
    },
    /// The node name could not be determined.
    #[error("node.name: {0}")]
    Name(String),
    /// `node.booted_for_file` is unreadable or invalid.
    #[error("node.booted_for_file: {0}")]
    BootedFor(String),
    /// The runtime could not be set up.
    #[error("runtime: {0}")]
    Runtime(#[from] crate::runtime::RuntimeError),
    /// `[enroll]`: the token file or the key's directory is unusable.
    #[error("enroll: {0}")]
    Enroll(String),
    /// Heat credentials are configured but unusable.
    #[error("heat: {0}")]
    Heat(String),
}

/// The host's fully qualified name: the kernel's host name when it has a
/// dot, else what `hostname --fqdn` says, else the short name.
pub fn host_fqdn() -> Result<String, String> {
    let short = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .map_err(|e| format!("cannot read the host name: {e}"))?;
    if short.contains('.') {
        return Ok(short);
    }
    let fqdn = std::process::Command::new("hostname")
        .arg("--fqdn")
        .stderr(std::process::Stdio::null())
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .filter(|s| !s.is_empty() && crate::config::valid_node_name(s).is_ok());
    Ok(fqdn.unwrap_or(short))
}

/// The node's name: `node.name`, else the host's FQDN.
pub fn node_name(cfg: &NodeConfig) -> Result<String, SetupError> {
    let name = match &cfg.node.name {
        Some(n) => n.clone(),
        None => host_fqdn().map_err(SetupError::Name)?,
    };
    crate::config::valid_node_name(&name).map_err(|r| SetupError::Name(format!("{name:?} {r}")))?;
    Ok(name)
}

fn booted_for(cfg: &NodeConfig) -> Result<Option<String>, SetupError> {
    if let Some(b) = &cfg.node.booted_for {
        return Ok(Some(b.clone()));
    }
    let Some(path) = &cfg.node.booted_for_file else {
        return Ok(None);
    };
    match std::fs::read_to_string(path) {
        Ok(t) => {
            let t = t.trim();
            if t.is_empty() {
                return Ok(None);
            }
            // The nova handler's default user data writes a JSON object
            // (`/etc/gearshift/boot.json`: node, domain, profile, district,
            // bus_url, op); other provisioning writes just the id.
            let op_json;
            let t = if t.starts_with('{') {
                let v: serde_json::Value = serde_json::from_str(t).map_err(|e| {
                    SetupError::BootedFor(format!("{}: not valid JSON: {e}", path.display()))
                })?;
                op_json = v;
                match op_json.get("op") {
                    Some(serde_json::Value::String(op)) => op.trim(),
                    None | Some(serde_json::Value::Null) => return Ok(None),
                    Some(_) => {
                        return Err(SetupError::BootedFor(format!(
                            "{}: \"op\" is not a string",
                            path.display()
                        )));
                    }
                }
            } else {
                t
            };
            if t.is_empty() {
                return Ok(None);
            }
            if t.len() > gearshift_proto::envelope::MAX_CORR || t.chars().any(char::is_control) {
                return Err(SetupError::BootedFor(format!(
                    "{}: not an operation id (1..=128 bytes, one line)",
                    path.display()
                )));
            }
            Ok(Some(t.to_string()))
        }
        // A node not created by a scale-up has no such file.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(SetupError::BootedFor(format!("{}: {e}", path.display()))),
    }
}

/// Loads and parses every key file `cfg` names, as `run` does: the
/// signing key and the trusted public keys (`check-config` runs this too).
pub fn load_keys(
    cfg: &NodeConfig,
) -> Result<(gearshift_proto::KeyPair, gearshift_proto::Keyring), SetupError> {
    let keypair =
        gearshift_service::keys::load_keypair(&cfg.keys.signing_key).map_err(|source| {
            SetupError::Keys {
                key: "keys.signing_key".into(),
                source,
            }
        })?;
    Ok((keypair, load_trusted(cfg)?))
}

/// Loads the trusted public keys `cfg` names (broker, operator, client).
pub fn load_trusted(cfg: &NodeConfig) -> Result<gearshift_proto::Keyring, SetupError> {
    let mut keyring = gearshift_proto::Keyring::new();
    for (key, role, path) in cfg.keys.every_key() {
        gearshift_service::keys::trust(&mut keyring, path, role).map_err(|source| {
            SetupError::Keys {
                key: format!("keys.{key}"),
                source,
            }
        })?;
    }
    Ok(keyring)
}

/// Loads keys and resolves everything the agent needs from `cfg`.
pub fn agent_config(cfg: &NodeConfig, metrics: Metrics) -> Result<AgentConfig, SetupError> {
    let name = node_name(cfg)?;
    let (keypair, keyring) = load_keys(cfg)?;
    let mut a = AgentConfig::new(name, keypair, keyring, cfg.state.dir.clone());
    a.time_window = cfg.keys.time_window;
    a.replay_capacity = cfg.keys.replay_capacity;
    a.fsync = cfg.state.fsync;
    a.region = cfg.node.region.clone();
    a.zone = cfg.node.zone.clone();
    a.booted_for = booted_for(cfg)?;
    a.do_not_disrupt = cfg.node.do_not_disrupt;
    a.report = cfg.report.clone();
    a.evacuation = cfg.evacuation.clone();
    a.shutdown_grace = cfg.service.shutdown_grace;
    a.prefetch = cfg.bus.prefetch;
    a.outbox_capacity = cfg.bus.outbox_capacity;
    a.retry_min = cfg.bus.reconnect_min;
    a.retry_max = cfg.bus.reconnect_max;
    a.remove_action = cfg.heat.remove_action;
    a.signaller = crate::heat::signaller_from_config(cfg, &a.name).map_err(SetupError::Heat)?;
    a.metrics = metrics;
    Ok(a)
}

/// The signaller as a trait object, for callers that build their own.
pub type SharedSignaller = Arc<dyn crate::heat::Signaller>;

#[cfg(test)]
mod tests {
    use super::*;

    fn with_file(content: Option<&str>) -> Result<Option<String>, SetupError> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("boot");
        if let Some(c) = content {
            std::fs::write(&path, c).unwrap();
        }
        let mut cfg = NodeConfig::default();
        cfg.node.booted_for_file = Some(path);
        booted_for(&cfg)
    }

    #[test]
    fn booted_for_file_forms() {
        assert_eq!(
            with_file(None).unwrap(),
            None,
            "a node not made by a scale-up"
        );
        assert_eq!(with_file(Some("op-1\n")).unwrap().as_deref(), Some("op-1"));
        // What the nova handler's default user data writes.
        let json = r#"{"node":"n-3.example.com","domain":"example.com","profile":"small","district":"d1","bus_url":"amqp://h","op":"op-7"}"#;
        assert_eq!(with_file(Some(json)).unwrap().as_deref(), Some("op-7"));
        assert_eq!(with_file(Some(r#"{"node":"n"}"#)).unwrap(), None);
        assert!(with_file(Some(r#"{"op":5}"#)).is_err());
        assert!(with_file(Some("{not json")).is_err());
        assert!(with_file(Some(&"x".repeat(500))).is_err());
    }
}
