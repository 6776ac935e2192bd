//! The operator's standing controls: pauses (of the fleet or of one group)
//! and cordons (a node out of placement and of scale-down choice). Both are
//! journaled, so a restarted agent keeps them.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// A pause of scaling decisions, for the fleet or one group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pause {
    /// Who paused (the request's `from`).
    pub by: String,
    /// Why, as the operator said it.
    pub reason: String,
    /// When.
    pub since: DateTime<Utc>,
    /// When it lifts by itself; none: until `resume`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until: Option<DateTime<Utc>>,
}

impl Pause {
    /// Whether the pause still holds at `now`.
    pub fn holds(&self, now: DateTime<Utc>) -> bool {
        self.until.is_none_or(|u| now < u)
    }

    /// `paused by alice until 2026-11-22 10:00:00 UTC: kernel upgrade`.
    pub fn describe(&self) -> String {
        let until = self
            .until
            .map(|u| format!(" until {}", u.format("%Y-%m-%d %H:%M:%S UTC")))
            .unwrap_or_default();
        let reason = if self.reason.is_empty() {
            "no reason given"
        } else {
            &self.reason
        };
        format!("paused by {}{until}: {reason}", self.by)
    }
}

/// Why a node is cordoned.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cordon {
    /// Who cordoned it (an operator, or the maintenance drain's operator).
    pub by: String,
    /// Why.
    pub reason: String,
    /// When.
    pub since: DateTime<Utc>,
    /// The maintenance drain (`drain --keep`) that left it cordoned, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub op: Option<String>,
}

impl Cordon {
    /// `cordoned by alice: disk swap`.
    pub fn describe(&self) -> String {
        let reason = if self.reason.is_empty() {
            "no reason given"
        } else {
            &self.reason
        };
        format!("cordoned by {}: {reason}", self.by)
    }
}

/// Cordoned nodes (journaled).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Cordons {
    nodes: BTreeMap<String, Cordon>,
}

impl Cordons {
    /// Cordons as journaled.
    pub fn from_map(nodes: BTreeMap<String, Cordon>) -> Cordons {
        Cordons { nodes }
    }

    /// Every cordoned node.
    pub fn nodes(&self) -> &BTreeMap<String, Cordon> {
        &self.nodes
    }

    /// Why `node` is cordoned, if it is.
    pub fn get(&self, node: &str) -> Option<&Cordon> {
        self.nodes.get(node)
    }

    /// Whether `node` is cordoned.
    pub fn contains(&self, node: &str) -> bool {
        self.nodes.contains_key(node)
    }

    /// Cordons `node` (replacing an earlier reason) or uncordons it (`None`);
    /// whether that changed anything.
    pub fn set(&mut self, node: &str, c: Option<Cordon>) -> bool {
        match c {
            Some(c) => self.nodes.insert(node.to_string(), c.clone()) != Some(c),
            None => self.nodes.remove(node).is_some(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000 + s, 0).unwrap()
    }

    #[test]
    fn pauses_hold_until_their_expiry_and_say_who_and_why() {
        let p = Pause {
            by: "alice".into(),
            reason: "upgrade".into(),
            since: t(0),
            until: Some(t(60)),
        };
        assert!(p.holds(t(59)) && !p.holds(t(60)));
        assert_eq!(
            p.describe(),
            "paused by alice until 2027-01-15 08:01:00 UTC: upgrade"
        );
        let forever = Pause { until: None, ..p };
        assert!(forever.holds(t(1_000_000)));
        assert_eq!(forever.describe(), "paused by alice: upgrade");
    }

    #[test]
    fn cordons_report_changes() {
        let mut c = Cordons::default();
        let why = Cordon {
            by: "bob".into(),
            reason: String::new(),
            since: t(0),
            op: None,
        };
        assert!(c.set("n1", Some(why.clone())));
        assert!(!c.set("n1", Some(why)));
        assert_eq!(
            c.get("n1").unwrap().describe(),
            "cordoned by bob: no reason given"
        );
        assert!(c.set("n1", None));
        assert!(!c.set("n1", None));
        assert!(!c.contains("n1"));
    }
}
