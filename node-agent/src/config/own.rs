//! The node agent's own keys in the shared `[bus]` and `[keys]` sections.

use std::path::PathBuf;
use std::time::Duration;

use gearshift_service::check;
use gearshift_service::config::Invalid;
use gearshift_service::sections::{BusPart, KeysPart, Part};
use serde::Serialize;
use serde::de::MapAccess;

/// The node's own `[bus]` keys; its reconnect defaults are `500ms` to `30s`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NodeBus {
    /// Unacknowledged commands in flight from the node's queue. Default `16`.
    pub prefetch: u16,
    /// Events kept while the bus is away; the oldest progress events are
    /// dropped first when it is full. Default `10000`.
    pub outbox_capacity: usize,
}

impl Default for NodeBus {
    fn default() -> Self {
        NodeBus {
            prefetch: 16,
            outbox_capacity: 10_000,
        }
    }
}

impl Part for NodeBus {
    const KEYS: &'static [&'static str] = &["prefetch", "outbox_capacity"];

    fn read<'de, A: MapAccess<'de>>(&mut self, key: &str, map: &mut A) -> Result<bool, A::Error> {
        match key {
            "prefetch" => self.prefetch = map.next_value()?,
            "outbox_capacity" => self.outbox_capacity = map.next_value()?,
            _ => return Ok(false),
        }
        Ok(true)
    }

    fn check(&self, section: &str) -> Result<(), Invalid> {
        if self.prefetch == 0 {
            return Err(Invalid::new(
                format!("{section}.prefetch"),
                "must be at least 1",
            ));
        }
        if !(16..=1_000_000).contains(&self.outbox_capacity) {
            return Err(Invalid::new(
                format!("{section}.outbox_capacity"),
                "must be in 16..=1000000",
            ));
        }
        Ok(())
    }
}

impl BusPart for NodeBus {
    const RECONNECT_MIN: Duration = Duration::from_millis(500);
    const RECONNECT_MAX: Duration = Duration::from_secs(30);
}

/// The node's trusted keys in `[keys]`, one list per role, and its replay
/// memory.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NodeKeys {
    /// Public keys of broker agents (role `broker`). Default
    /// `["/etc/gearshift/broker.pub"]`.
    pub broker_keys: Vec<PathBuf>,
    /// Public keys of operators (role `operator`). Default none.
    pub operator_keys: Vec<PathBuf>,
    /// Public keys of third-party clients (role `client`: they may only
    /// ping). Default none.
    pub client_keys: Vec<PathBuf>,
    /// Command ids remembered for replay detection (oldest forgotten
    /// first). Default `10000`.
    pub replay_capacity: usize,
}

impl Default for NodeKeys {
    fn default() -> Self {
        NodeKeys {
            broker_keys: vec!["/etc/gearshift/broker.pub".into()],
            operator_keys: vec![],
            client_keys: vec![],
            replay_capacity: 10_000,
        }
    }
}

impl Part for NodeKeys {
    const KEYS: &'static [&'static str] = &[
        "broker_keys",
        "operator_keys",
        "client_keys",
        "replay_capacity",
    ];

    fn read<'de, A: MapAccess<'de>>(&mut self, key: &str, map: &mut A) -> Result<bool, A::Error> {
        match key {
            "broker_keys" => self.broker_keys = map.next_value()?,
            "operator_keys" => self.operator_keys = map.next_value()?,
            "client_keys" => self.client_keys = map.next_value()?,
            "replay_capacity" => self.replay_capacity = map.next_value()?,
            _ => return Ok(false),
        }
        Ok(true)
    }

    fn check(&self, section: &str) -> Result<(), Invalid> {
        if self.broker_keys.is_empty() && self.operator_keys.is_empty() {
            return Err(Invalid::new(
                format!("{section}.broker_keys"),
                "no trusted key: every command would be refused",
            ));
        }
        if !(16..=10_000_000).contains(&self.replay_capacity) {
            return Err(Invalid::new(
                format!("{section}.replay_capacity"),
                "must be in 16..=10000000",
            ));
        }
        for p in self.every_key() {
            check::names_a_path(&format!("{section}.{}", p.0), p.2, "file")?;
        }
        Ok(())
    }
}

impl KeysPart for NodeKeys {
    const SIGNING_KEY: &'static str = "/etc/gearshift/node.key";
}

impl NodeKeys {
    /// Every trusted key file: (its list's key, its role, the file).
    pub fn every_key(
        &self,
    ) -> impl Iterator<Item = (&'static str, gearshift_proto::msg::Role, &std::path::Path)> {
        use gearshift_proto::msg::Role;
        [
            ("broker_keys", Role::Broker, &self.broker_keys),
            ("operator_keys", Role::Operator, &self.operator_keys),
            ("client_keys", Role::Client, &self.client_keys),
        ]
        .into_iter()
        .flat_map(|(key, role, list)| list.iter().map(move |p| (key, role, p.as_path())))
    }
}
