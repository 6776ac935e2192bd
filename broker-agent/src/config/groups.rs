//! `[group_defaults]` and `[[groups]]`: node groups, their handler, size
//! bounds and cloud shape.

use gearshift_handlers::{GroupKey, NodeShape};
use gearshift_service::config::Invalid;
use serde::{Deserialize, Serialize};

use super::{BrokerConfig, VictimStrategy};

/// `[group_defaults]`
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GroupDefaults {
    /// Handler name. Default `log` (dry run).
    pub handler: String,
    /// Fewest nodes; below it the group scales up. Default `0`.
    pub min_nodes: u32,
    /// Most nodes, booting ones included. Default `20`.
    pub max_nodes: u32,
    /// Cloud shape of new nodes. Default empty.
    pub shape: NodeShape,
}

impl Default for GroupDefaults {
    fn default() -> Self {
        GroupDefaults {
            handler: "log".into(),
            min_nodes: 0,
            max_nodes: 20,
            shape: NodeShape::default(),
        }
    }
}

/// `[[groups]]`: one node group's own settings.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GroupConfig {
    /// District UUID (`_none` for undistricted nodes).
    pub district: String,
    /// Node profile.
    pub profile: String,
    /// Handler name; `group_defaults.handler` when absent.
    #[serde(default)]
    pub handler: Option<String>,
    /// Fewest nodes; `group_defaults.min_nodes` when absent.
    #[serde(default)]
    pub min_nodes: Option<u32>,
    /// Most nodes; `group_defaults.max_nodes` when absent.
    #[serde(default)]
    pub max_nodes: Option<u32>,
    /// Victim strategy; `policy.victim_strategy` when absent.
    #[serde(default)]
    pub victim_strategy: Option<VictimStrategy>,
    /// Cloud shape; `group_defaults.shape` when absent.
    #[serde(default)]
    pub shape: Option<NodeShape>,
}

/// A group's effective settings.
#[derive(Debug, Clone, PartialEq)]
pub struct GroupSettings {
    /// Handler name.
    pub handler: String,
    /// Fewest nodes.
    pub min_nodes: u32,
    /// Most nodes.
    pub max_nodes: u32,
    /// Victim strategy.
    pub victim_strategy: VictimStrategy,
    /// Cloud shape.
    pub shape: NodeShape,
}

impl BrokerConfig {
    /// The effective settings of a group.
    pub fn group(&self, key: &GroupKey) -> GroupSettings {
        let own = self
            .groups
            .iter()
            .find(|g| g.district == key.district && g.profile == key.profile);
        let d = &self.group_defaults;
        GroupSettings {
            handler: own
                .and_then(|g| g.handler.clone())
                .unwrap_or_else(|| d.handler.clone()),
            min_nodes: own.and_then(|g| g.min_nodes).unwrap_or(d.min_nodes),
            max_nodes: own.and_then(|g| g.max_nodes).unwrap_or(d.max_nodes),
            victim_strategy: own
                .and_then(|g| g.victim_strategy)
                .unwrap_or(self.policy.victim_strategy),
            shape: own
                .and_then(|g| g.shape.clone())
                .unwrap_or_else(|| d.shape.clone()),
        }
    }

    /// Groups named in the configuration.
    pub fn configured_groups(&self) -> Vec<GroupKey> {
        self.groups
            .iter()
            .map(|g| GroupKey {
                district: g.district.clone(),
                profile: g.profile.clone(),
            })
            .collect()
    }

    /// Whether group `g`'s handler is the `log` handler: a dry run, where
    /// decisions are published and explained and nothing reaches a node or
    /// the cloud.
    pub fn dry_run(&self, g: &GroupKey) -> bool {
        let name = self.group(g).handler;
        match self.handlers.get(&name) {
            Some(h) => matches!(h, gearshift_handlers::HandlerConfig::Log {}),
            None => name == "log",
        }
    }

    /// Whether a handler of this name exists (`log` always does).
    pub fn has_handler(&self, name: &str) -> bool {
        name == "log" || self.handlers.contains_key(name)
    }

    /// Checks `[group_defaults]` and every `[[groups]]` entry.
    pub(super) fn check_groups(&self) -> Result<(), Invalid> {
        if !self.has_handler(&self.group_defaults.handler) {
            return Err(Invalid::new(
                "group_defaults.handler",
                format!(
                    "no handler named {:?} in [handlers]",
                    self.group_defaults.handler
                ),
            ));
        }
        if self.group_defaults.min_nodes > self.group_defaults.max_nodes {
            return Err(Invalid::new(
                "group_defaults.min_nodes",
                "must not exceed group_defaults.max_nodes",
            ));
        }
        let mut seen = std::collections::BTreeSet::new();
        for (i, g) in self.groups.iter().enumerate() {
            let key = |f: &str| format!("groups[{i}].{f}");
            if g.district.is_empty() || g.profile.is_empty() {
                return Err(Invalid::new(
                    key("district"),
                    "district and profile are required",
                ));
            }
            if !seen.insert((g.district.clone(), g.profile.clone())) {
                return Err(Invalid::new(
                    key("district"),
                    format!("group {}/{} is configured twice", g.district, g.profile),
                ));
            }
            if let Some(h) = &g.handler
                && !self.has_handler(h)
            {
                return Err(Invalid::new(
                    key("handler"),
                    format!("no handler named {h:?} in [handlers]"),
                ));
            }
            let s = self.group(&GroupKey {
                district: g.district.clone(),
                profile: g.profile.clone(),
            });
            if s.min_nodes > s.max_nodes {
                return Err(Invalid::new(key("min_nodes"), "must not exceed max_nodes"));
            }
        }
        Ok(())
    }
}
