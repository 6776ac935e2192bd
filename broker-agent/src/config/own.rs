//! The broker agent's own keys in the shared `[bus]` and `[keys]` sections.

use std::path::PathBuf;
use std::time::Duration;

use gearshift_service::config::Invalid;
use gearshift_service::sections::{BusPart, KeysPart, Part};
use serde::de::MapAccess;
use serde::{Deserialize, Serialize};

/// `[bus]` has no key of the broker agent's own; its reconnect defaults are
/// `100ms` to `2s` (what the agent used before they were settings).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct BrokerBus {}

impl Part for BrokerBus {
    const KEYS: &'static [&'static str] = &[];

    fn read<'de, A: MapAccess<'de>>(&mut self, _: &str, _: &mut A) -> Result<bool, A::Error> {
        Ok(false)
    }
}

impl BusPart for BrokerBus {
    const RECONNECT_MIN: Duration = Duration::from_millis(100);
    const RECONNECT_MAX: Duration = Duration::from_secs(2);
}

/// The broker agent's trusted keys in `[keys]`: directories of node and
/// operator keys, and single keys with their role.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BrokerKeys {
    /// Every `<host>.pub` here is trusted as the node key of `<host>`, and
    /// speaks only for it: signed as another node, a report or event is
    /// refused (`identity`). Read at start and on every reload (SIGHUP), so
    /// that removing a file revokes that node. Default `/etc/gearshift/nodes.d`.
    pub node_keys_dir: PathBuf,
    /// Every `*.pub` here is trusted as an operator key. Default `/etc/gearshift/operators.d`.
    pub operator_keys_dir: PathBuf,
    /// Further trusted keys with their role. Default none. A `node` key here
    /// is a fleet-wide key: it may speak for any node (prefer `nodes.d`).
    pub trust: Vec<TrustEntry>,
}

impl Default for BrokerKeys {
    fn default() -> Self {
        BrokerKeys {
            node_keys_dir: "/etc/gearshift/nodes.d".into(),
            operator_keys_dir: "/etc/gearshift/operators.d".into(),
            trust: vec![],
        }
    }
}

impl Part for BrokerKeys {
    const KEYS: &'static [&'static str] = &["node_keys_dir", "operator_keys_dir", "trust"];

    fn read<'de, A: MapAccess<'de>>(&mut self, key: &str, map: &mut A) -> Result<bool, A::Error> {
        match key {
            "node_keys_dir" => self.node_keys_dir = map.next_value()?,
            "operator_keys_dir" => self.operator_keys_dir = map.next_value()?,
            "trust" => self.trust = map.next_value()?,
            _ => return Ok(false),
        }
        Ok(true)
    }

    fn check(&self, section: &str) -> Result<(), Invalid> {
        for (i, t) in self.trust.iter().enumerate() {
            gearshift_service::check::names_a_path(
                &format!("{section}.trust[{i}].path"),
                &t.path,
                "file",
            )?;
        }
        Ok(())
    }
}

impl KeysPart for BrokerKeys {
    const SIGNING_KEY: &'static str = "/etc/gearshift/broker.key";
}

/// One extra trusted key (`[[keys.trust]]`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrustEntry {
    /// `node`, `operator`, `client` or `broker`.
    pub role: gearshift_proto::Role,
    /// SubjectPublicKeyInfo PEM file.
    pub path: PathBuf,
}

impl BrokerKeys {
    /// Adds every key this configuration trusts to `ring`: the node and
    /// operator key directories, then `[[keys.trust]]`. Returns the number
    /// of node and of operator keys read from the directories.
    pub fn trust_into(
        &self,
        ring: &mut gearshift_proto::Keyring,
    ) -> Result<(usize, usize), gearshift_service::keys::KeyFileError> {
        use gearshift_proto::msg::Role;
        use gearshift_service::keys::{trust, trust_dir, trust_dir_bound};
        let nodes = trust_dir_bound(ring, &self.node_keys_dir, Role::Node)?;
        let operators = trust_dir(ring, &self.operator_keys_dir, Role::Operator)?;
        for t in &self.trust {
            trust(ring, &t.path, t.role)?;
            if t.role == Role::Node {
                tracing::warn!(path = %t.path.display(),
                    "a fleet-wide node key: it may speak for any node (nodes.d/<host>.pub binds a key to one node)");
            }
        }
        Ok((nodes, operators))
    }
}
