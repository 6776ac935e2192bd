//! Synthetic traces: a small workload description (TOML, or JSON when the
//! file ends in `.json`) turned into the trace a fleet of that shape would
//! have sent, generated lazily (a day of 1,000 nodes never sits in memory).
//!
//! ```toml
//! start = "2026-11-27T00:00:00Z"   # default: that date
//! duration = "24h"
//! report_interval = "1m"
//!
//! [[groups]]
//! district = "d-east"
//! profile = "small"
//! nodes = 40
//! max_active_gears = 100
//! idle_percent = 20          # idle gears, as a share of active gears
//! # Active gears in percent of the group's initial capacity
//! # (nodes x max_active_gears), linear between the points.
//! curve = [["0h", 40], ["9h", 88], ["18h", 35], ["24h", 40]]
//! ```
//!
//! The recorded nodes carry the load: gears land on the group's initial
//! nodes, spread evenly, as a trace of a real fleet shows them landing on
//! the nodes that existed then.

use std::path::Path;
use std::time::Duration as StdDuration;

use chrono::{DateTime, Duration, Utc};
use gearshift_broker::trace::TraceLine;
use gearshift_proto::msg::{DistrictInfo, GearCounts, NodeReport};
use serde::Deserialize;

/// Bounds of a description (it is read from a file an operator wrote).
const MAX_NODES: u32 = 100_000;
const MAX_POINTS: usize = 10_000;

/// A workload description.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Workload {
    /// Virtual time of the first report.
    #[serde(default = "default_start")]
    pub start: DateTime<Utc>,
    /// How long the trace lasts.
    #[serde(with = "humantime_serde")]
    pub duration: StdDuration,
    /// How often each node reports.
    #[serde(default = "default_interval", with = "humantime_serde")]
    pub report_interval: StdDuration,
    /// The node groups.
    pub groups: Vec<GroupLoad>,
}

/// One node group's shape and load.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GroupLoad {
    /// District UUID.
    pub district: String,
    /// Profile.
    pub profile: String,
    /// Nodes at the start.
    pub nodes: u32,
    /// `max_active_gears` of each.
    pub max_active_gears: u32,
    /// Idle gears as a percent of active ones. Default 0.
    #[serde(default)]
    pub idle_percent: u32,
    /// `(time offset, percent of initial capacity)` points, in time order.
    pub curve: Vec<(String, f64)>,
}

fn default_start() -> DateTime<Utc> {
    DateTime::from_timestamp(1_795_737_600, 0).unwrap_or_default()
}

fn default_interval() -> StdDuration {
    StdDuration::from_secs(60)
}

impl Workload {
    /// Reads and checks a description.
    pub fn load(path: &Path) -> Result<Workload, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let w: Workload = if path.extension().is_some_and(|e| e == "json") {
            serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?
        } else {
            toml::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?
        };
        w.check().map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(w)
    }

    /// The bounds: some nodes, a curve in time order within the duration.
    pub fn check(&self) -> Result<(), String> {
        if self.report_interval < StdDuration::from_secs(1) {
            return Err("report_interval: must be at least 1s".into());
        }
        if self.duration > StdDuration::from_secs(366 * 86_400) {
            return Err("duration: at most a year".into());
        }
        let nodes: u64 = self.groups.iter().map(|g| u64::from(g.nodes)).sum();
        if self.groups.is_empty() || nodes == 0 || nodes > u64::from(MAX_NODES) {
            return Err(format!("groups: 1..={MAX_NODES} nodes in all"));
        }
        for (i, g) in self.groups.iter().enumerate() {
            if g.curve.is_empty() || g.curve.len() > MAX_POINTS {
                return Err(format!("groups[{i}].curve: 1..={MAX_POINTS} points"));
            }
            let mut last = StdDuration::ZERO;
            for (k, (t, pct)) in g.curve.iter().enumerate() {
                let t = humantime::parse_duration(t)
                    .map_err(|e| format!("groups[{i}].curve[{k}]: {e}"))?;
                if t < last || !(0.0..=1000.0).contains(pct) {
                    return Err(format!(
                        "groups[{i}].curve[{k}]: times in order, percent 0..=1000"
                    ));
                }
                last = t;
            }
            if g.max_active_gears == 0 || g.max_active_gears > 100_000 {
                return Err(format!("groups[{i}].max_active_gears: 1..=100000"));
            }
        }
        Ok(())
    }

    /// The trace, in receive order.
    pub fn lines(&self) -> impl Iterator<Item = Result<TraceLine, String>> + '_ {
        let nodes: Vec<(usize, u32)> = self
            .groups
            .iter()
            .enumerate()
            .flat_map(|(gi, g)| (0..g.nodes).map(move |k| (gi, k)))
            .collect();
        let total = nodes.len() as i64;
        let every = Duration::from_std(self.report_interval).unwrap_or(Duration::minutes(1));
        let rounds =
            (self.duration.as_secs_f64() / self.report_interval.as_secs_f64()).ceil() as i64;
        (0..=rounds).flat_map(move |round| {
            let nodes = nodes.clone();
            nodes.into_iter().enumerate().map(move |(i, (gi, k))| {
                // Spread each round's reports over the interval, as real nodes do.
                let at = self.start + every * round as i32 + every * i as i32 / total.max(1) as i32;
                Ok(TraceLine {
                    at,
                    report: self.report(gi, k, at),
                })
            })
        })
    }

    fn report(&self, gi: usize, k: u32, at: DateTime<Utc>) -> NodeReport {
        let g = &self.groups[gi];
        let active_total = (g.load_pct(at - self.start) / 100.0
            * f64::from(g.nodes * g.max_active_gears))
        .round() as u32;
        let active = active_total / g.nodes + u32::from(k < active_total % g.nodes);
        let idle = active * g.idle_percent / 100;
        NodeReport {
            node: format!("{}-{}-{k:04}", g.district, g.profile),
            seq: (at.timestamp_micros().max(0)) as u64,
            profile: g.profile.clone(),
            district: Some(DistrictInfo {
                uuid: g.district.clone(),
                active: true,
                first_uid: None,
                max_uid: None,
            }),
            max_active_gears: g.max_active_gears,
            gears: GearCounts {
                started: active,
                idle,
                ..Default::default()
            },
            active: true,
            region: None,
            zone: None,
            mem_free_mb: 0,
            mem_total_mb: 0,
            started_at: self.start - Duration::hours(1),
            booted_at: Some(self.start - Duration::hours(1)),
            booted_for: None,
            do_not_disrupt: false,
            pinned_gears: 0,
            operation: None,
            interval_secs: self.report_interval.as_secs().max(1) as u32,
            agent_version: "synthetic".into(),
        }
    }
}

impl GroupLoad {
    /// Percent of initial capacity at offset `t` (linear between points,
    /// flat before the first and after the last).
    fn load_pct(&self, t: Duration) -> f64 {
        let pts: Vec<(f64, f64)> = self
            .curve
            .iter()
            .map(|(at, p)| {
                (
                    humantime::parse_duration(at)
                        .map(|d| d.as_secs_f64())
                        .unwrap_or(0.0),
                    *p,
                )
            })
            .collect();
        let x = t.num_milliseconds() as f64 / 1000.0;
        match pts.iter().position(|(at, _)| *at > x) {
            Some(0) => pts[0].1,
            None => pts.last().map_or(0.0, |p| p.1),
            Some(i) => {
                let ((x0, y0), (x1, y1)) = (pts[i - 1], pts[i]);
                y0 + (y1 - y0) * (x - x0) / (x1 - x0)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMALL: &str = r#"
duration = "2h"
report_interval = "1m"
[[groups]]
district = "d1"
profile = "small"
nodes = 4
max_active_gears = 10
idle_percent = 50
curve = [["0h", 50], ["1h", 100], ["2h", 0]]
"#;

    #[test]
    fn the_curve_sets_the_groups_active_gears_spread_over_its_nodes() {
        let w: Workload = toml::from_str(SMALL).unwrap();
        w.check().unwrap();
        let lines: Vec<TraceLine> = w.lines().map(Result::unwrap).collect();
        // 121 rounds of 4 nodes, in time order.
        assert_eq!(lines.len(), 121 * 4);
        assert!(lines.windows(2).all(|p| p[0].at <= p[1].at));
        let sum = |round: usize| -> u32 {
            lines[round * 4..round * 4 + 4]
                .iter()
                .map(|l| l.report.gears.started)
                .sum()
        };
        assert_eq!(sum(0), 20);
        assert_eq!(sum(30), 30);
        assert_eq!(sum(60), 40);
        assert_eq!(sum(120), 0);
        assert_eq!(lines[60 * 4].report.gears.idle, 5);
    }

    #[test]
    fn bad_descriptions_are_refused_naming_the_key() {
        let mut w: Workload = toml::from_str(SMALL).unwrap();
        w.groups[0].curve = vec![("2h".into(), 10.0), ("1h".into(), 10.0)];
        assert!(w.check().unwrap_err().contains("groups[0].curve[1]"));
        w.groups[0].curve = vec![("soon".into(), 10.0)];
        assert!(w.check().unwrap_err().contains("groups[0].curve[0]"));
        w.groups.clear();
        assert!(w.check().unwrap_err().starts_with("groups"));
        assert!(toml::from_str::<Workload>("duration = \"1h\"\ngroups = []\nextra = 1").is_err());
    }
}
