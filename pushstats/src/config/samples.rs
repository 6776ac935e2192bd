//! The samples an agent pushes: its set (node or fleet), filtered by
//! `metrics` and with the configured dimensions.

use std::collections::BTreeMap;

use gearshift_proto::msg::{GroupStats, NodeReport};

use super::PushStatsConfig;
use crate::sample::Sample;
use crate::sets;

impl PushStatsConfig {
    fn wanted(&self, name: &str) -> bool {
        self.metrics.is_empty() || self.metrics.iter().any(|m| m == name)
    }

    fn decorate(&self, mut s: Sample) -> Sample {
        for (k, v) in &self.dimensions {
            s.dimensions.entry(k.clone()).or_insert_with(|| v.clone());
        }
        if let Some(id) = &self.instance_id {
            s.dimensions
                .entry("InstanceId".into())
                .or_insert_with(|| id.clone());
        }
        s
    }

    /// The node set for `report`, filtered and with the configured dimensions.
    pub fn node_samples(&self, report: &NodeReport) -> Vec<Sample> {
        sets::node_samples(report)
            .into_iter()
            .filter(|s| self.wanted(&s.name))
            .map(|s| self.decorate(s))
            .collect()
    }

    /// The fleet set, filtered and with the configured (and per-group) dimensions.
    pub fn fleet_samples(
        &self,
        profiles: &BTreeMap<String, GroupStats>,
        districts: &BTreeMap<String, GroupStats>,
    ) -> Vec<Sample> {
        sets::fleet_samples(profiles, districts, &self.group_resource_prefix)
            .into_iter()
            .filter(|s| self.wanted(&s.name))
            .map(|mut s| {
                let key = if let Some(p) = s.dimensions.get("Profile") {
                    format!("profile:{p}")
                } else if let Some(d) = s.dimensions.get("District") {
                    format!("district:{d}")
                } else {
                    String::new()
                };
                if let Some(extra) = self.group_dimensions.get(&key) {
                    for (k, v) in extra {
                        s.dimensions.insert(k.clone(), v.clone());
                    }
                }
                self.decorate(s)
            })
            .collect()
    }

    /// A heartbeat (cfn-push-stats `--heartbeat`) with the configured
    /// dimensions: with `alarm_names`, it fires those alarms.
    pub fn heartbeat(&self) -> Vec<Sample> {
        vec![self.decorate(Sample::heartbeat(self.event_unit))]
    }
}
