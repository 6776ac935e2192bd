//! The metric sets: what a node and what the broker push, computed from the
//! figures the agents already have (a [`NodeReport`], [`GroupStats`]).
//!
//! Names are CloudWatch-style (the OpenShift autoscaling template alarmed on
//! `NodeUtilization` in namespace `system/linux`); Gnocchi gets them in
//! snake case behind a prefix (`gearshift.node_utilization`).
//!
//! | set | metric | unit | value |
//! |---|---|---|---|
//! | node | `NodeUtilization` | Percent | 100 × active gears / `max_active_gears` |
//! | node | `ActiveGears` | Count | total − idle − stopped |
//! | node | `MaxActiveGears` | Count | `max_active_gears` |
//! | node | `AvailableActiveGears` | Count | max(0, max − active) on an active node, else 0 |
//! | node | `GearsTotal`, `GearsStarted`, `GearsIdle`, `GearsStopped`, `GearsDeploying`, `GearsUnknown` | Count | gear counts by state |
//! | node | `NodeActive` | None | 1 while the node takes new gears, 0 once deactivated |
//! | node | `FreeMemory` | Megabytes | `MemAvailable` (when the report knows memory) |
//! | node | `MemoryUtilization` | Percent | 100 × (total − free) / total (idem) |
//! | fleet | `CapacityUtilization` | Percent | `oo-stats` usage: 100 × active / (available + active) |
//! | fleet | `ActiveGears`, `TotalGears` | Count | gears on reporting nodes |
//! | fleet | `AvailableActiveGears` | Count | sum over active nodes of max(0, max − active) |
//! | fleet | `EffectiveAvailableGears` | Count | min(available, district's free UIDs) |
//! | fleet | `NodesActive`, `NodesInactive`, `NodesMissing` | Count | node counts |
//!
//! Fleet samples carry a `Profile` or `District` dimension, and a Gnocchi
//! resource per group (`<prefix>profile-<name>`, `<prefix>district-<uuid>`).

use std::collections::BTreeMap;

use gearshift_proto::msg::{GroupStats, NodeReport};

use crate::sample::{Sample, Unit};

/// Every metric name of the node set.
pub const NODE_METRICS: &[&str] = &[
    "NodeUtilization",
    "ActiveGears",
    "MaxActiveGears",
    "AvailableActiveGears",
    "GearsTotal",
    "GearsStarted",
    "GearsIdle",
    "GearsStopped",
    "GearsDeploying",
    "GearsUnknown",
    "NodeActive",
    "FreeMemory",
    "MemoryUtilization",
];

/// Every metric name of the fleet set.
pub const FLEET_METRICS: &[&str] = &[
    "CapacityUtilization",
    "ActiveGears",
    "TotalGears",
    "AvailableActiveGears",
    "EffectiveAvailableGears",
    "NodesActive",
    "NodesInactive",
    "NodesMissing",
];

/// Cfn-push-stats' one-off metrics.
pub const EVENT_METRICS: &[&str] = &["Heartbeat", "ServiceFailure"];

/// Which kind of group a fleet sample describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupKind {
    /// Per node profile: dimension `Profile`.
    Profile,
    /// Per district: dimension `District`.
    District,
}

impl GroupKind {
    /// The dimension name.
    pub fn dimension(self) -> &'static str {
        match self {
            GroupKind::Profile => "Profile",
            GroupKind::District => "District",
        }
    }
    /// The lower-case word used in resource ids and config keys.
    pub fn word(self) -> &'static str {
        match self {
            GroupKind::Profile => "profile",
            GroupKind::District => "district",
        }
    }
}

fn pct(part: f64, whole: f64) -> f64 {
    if whole > 0.0 {
        100.0 * part / whole
    } else {
        0.0
    }
}

/// The node set for one report (no dimensions yet: the configuration adds them).
pub fn node_samples(r: &NodeReport) -> Vec<Sample> {
    let active = r.gears.active();
    let max = r.max_active_gears;
    let utilization = if max == 0 {
        if active > 0 { 100.0 } else { 0.0 }
    } else {
        pct(active as f64, max as f64)
    };
    let available = if r.active {
        max.saturating_sub(active)
    } else {
        0
    };
    let c = |name: &str, v: u32| Sample::new(name, v as f64, Unit::COUNT);
    let mut out = vec![
        Sample::new("NodeUtilization", utilization, Unit::PERCENT),
        c("ActiveGears", active),
        c("MaxActiveGears", max),
        c("AvailableActiveGears", available),
        c("GearsTotal", r.gears.total()),
        c("GearsStarted", r.gears.started),
        c("GearsIdle", r.gears.idle),
        c("GearsStopped", r.gears.stopped),
        c("GearsDeploying", r.gears.deploying),
        c("GearsUnknown", r.gears.unknown),
        Sample::new("NodeActive", if r.active { 1.0 } else { 0.0 }, Unit::NONE),
    ];
    if r.mem_total_mb > 0 {
        let free = r.mem_free_mb.min(r.mem_total_mb);
        out.push(Sample::new("FreeMemory", free as f64, Unit::MEGABYTES));
        out.push(Sample::new(
            "MemoryUtilization",
            pct((r.mem_total_mb - free) as f64, r.mem_total_mb as f64),
            Unit::PERCENT,
        ));
    }
    out
}

/// The fleet set for one group, with its `Profile`/`District` dimension and
/// its Gnocchi resource `<resource_prefix><kind>-<key>`.
pub fn group_samples(
    kind: GroupKind,
    key: &str,
    s: &GroupStats,
    resource_prefix: &str,
) -> Vec<Sample> {
    let resource = format!("{resource_prefix}{}-{key}", kind.word());
    let c = |name: &str, v: u32| Sample::new(name, v as f64, Unit::COUNT);
    let usage = if s.usage_pct.is_finite() {
        s.usage_pct
    } else {
        0.0
    };
    vec![
        Sample::new("CapacityUtilization", usage, Unit::PERCENT),
        c("ActiveGears", s.gears_active),
        c("TotalGears", s.gears_total),
        c("AvailableActiveGears", s.available_active_gears),
        c("EffectiveAvailableGears", s.effective_available_gears),
        c("NodesActive", s.nodes_active),
        c("NodesInactive", s.nodes_inactive),
        c("NodesMissing", s.nodes_missing),
    ]
    .into_iter()
    .map(|x| {
        x.with_dimension(kind.dimension(), key)
            .with_resource(resource.clone())
    })
    .collect()
}

/// The fleet set: every profile, then every district.
pub fn fleet_samples(
    profiles: &BTreeMap<String, GroupStats>,
    districts: &BTreeMap<String, GroupStats>,
    resource_prefix: &str,
) -> Vec<Sample> {
    let mut out = Vec::new();
    for (k, s) in profiles {
        out.extend(group_samples(GroupKind::Profile, k, s, resource_prefix));
    }
    for (k, s) in districts {
        out.extend(group_samples(GroupKind::District, k, s, resource_prefix));
    }
    out
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use gearshift_proto::msg::{DistrictInfo, GearCounts};

    pub(crate) fn report() -> NodeReport {
        NodeReport {
            node: "node-1.example.com".into(),
            seq: 1,
            profile: "small".into(),
            district: Some(DistrictInfo {
                uuid: "d1".into(),
                active: true,
                first_uid: None,
                max_uid: None,
            }),
            max_active_gears: 50,
            gears: GearCounts {
                started: 10,
                idle: 3,
                stopped: 2,
                deploying: 1,
                unknown: 1,
            },
            active: true,
            region: None,
            zone: None,
            mem_free_mb: 1024,
            mem_total_mb: 4096,
            started_at: chrono::Utc::now(),
            booted_at: None,
            booted_for: None,
            do_not_disrupt: false,
            pinned_gears: 0,
            operation: None,
            interval_secs: 60,
            agent_version: "t".into(),
        }
    }

    fn value(samples: &[Sample], name: &str) -> f64 {
        samples
            .iter()
            .find(|s| s.name == name)
            .unwrap_or_else(|| panic!("no {name}"))
            .value
    }

    #[test]
    fn node_set() {
        let s = node_samples(&report());
        // active = 17 - 3 - 2 = 12
        assert_eq!(value(&s, "ActiveGears"), 12.0);
        assert_eq!(value(&s, "NodeUtilization"), 24.0);
        assert_eq!(value(&s, "AvailableActiveGears"), 38.0);
        assert_eq!(value(&s, "GearsTotal"), 17.0);
        assert_eq!(value(&s, "GearsIdle"), 3.0);
        assert_eq!(value(&s, "FreeMemory"), 1024.0);
        assert_eq!(value(&s, "MemoryUtilization"), 75.0);
        assert_eq!(value(&s, "NodeActive"), 1.0);
        let names: Vec<&str> = s.iter().map(|x| x.name.as_str()).collect();
        assert_eq!(names, NODE_METRICS);
        for x in &s {
            x.validate().unwrap();
        }
    }

    #[test]
    fn inactive_node_and_unknown_memory() {
        let mut r = report();
        r.active = false;
        r.mem_total_mb = 0;
        let s = node_samples(&r);
        assert_eq!(value(&s, "AvailableActiveGears"), 0.0);
        assert_eq!(value(&s, "NodeActive"), 0.0);
        assert!(!s.iter().any(|x| x.name == "FreeMemory"));
        r.max_active_gears = 0;
        assert_eq!(value(&node_samples(&r), "NodeUtilization"), 100.0);
    }

    #[test]
    fn fleet_set() {
        let g = GroupStats {
            nodes_active: 3,
            nodes_inactive: 1,
            nodes_missing: 0,
            gears_active: 80,
            gears_total: 120,
            available_active_gears: 20,
            effective_available_gears: 15,
            usage_pct: 80.0,
            district_free_uids: Some(15),
        };
        let profiles = BTreeMap::from([("small".to_string(), g.clone())]);
        let districts = BTreeMap::from([("d1".to_string(), g)]);
        let s = fleet_samples(&profiles, &districts, "gearshift-");
        assert_eq!(s.len(), 2 * FLEET_METRICS.len());
        let p = &s[0];
        assert_eq!(p.name, "CapacityUtilization");
        assert_eq!(p.value, 80.0);
        assert_eq!(
            p.dimensions.get("Profile").map(String::as_str),
            Some("small")
        );
        assert_eq!(p.resource.as_deref(), Some("gearshift-profile-small"));
        let d = s
            .iter()
            .find(|x| x.name == "EffectiveAvailableGears" && x.dimensions.contains_key("District"))
            .unwrap();
        assert_eq!(d.value, 15.0);
        assert_eq!(d.resource.as_deref(), Some("gearshift-district-d1"));
    }
}
