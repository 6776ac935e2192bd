//! The checks of `[push_stats]`: what can be checked without the network,
//! each problem naming its key (`push_stats.cloudwatch.endpoint`, ...).

use std::collections::BTreeMap;
use std::time::Duration;

use gearshift_service::config::Invalid;

use super::{CloudWatchConfig, GnocchiConfig, PushStatsConfig, SECTION};
use crate::sample::{check_dimension_value, check_name};
use crate::sets;

fn invalid(key: &str, reason: impl Into<String>) -> Invalid {
    Invalid::new(format!("{SECTION}.{key}"), reason)
}

fn check_url(key: &str, s: &str) -> Result<(), Invalid> {
    gearshift_service::check::http_url(&format!("{SECTION}.{key}"), s)
}

fn check_dims(key: &str, dims: &BTreeMap<String, String>) -> Result<(), Invalid> {
    for (k, v) in dims {
        check_name("dimension name", k).map_err(|e| invalid(&format!("{key}.{k}"), e))?;
        check_dimension_value(k, v).map_err(|e| invalid(&format!("{key}.{k}"), e))?;
    }
    Ok(())
}

impl PushStatsConfig {
    /// Checks the section; keys in errors start with `push_stats.`.
    pub fn validate(&self) -> Result<(), Invalid> {
        if !self.enabled {
            return Ok(());
        }
        if self.cloudwatch.is_none() && self.gnocchi.is_none() {
            return Err(invalid(
                "enabled",
                "push_stats is enabled but neither [push_stats.cloudwatch] nor [push_stats.gnocchi] is set",
            ));
        }
        if self.interval < Duration::from_secs(1) {
            return Err(invalid("interval", "must be at least 1s"));
        }
        if self.debounce > self.interval {
            return Err(invalid("debounce", "must not be longer than interval"));
        }
        if self.queue_capacity == 0 || self.queue_capacity > 100_000 {
            return Err(invalid("queue_capacity", "must be between 1 and 100000"));
        }
        if self.max_attempts == 0 || self.max_attempts > 100 {
            return Err(invalid("max_attempts", "must be between 1 and 100"));
        }
        if self.retry_min.is_zero() || self.retry_min > self.retry_max {
            return Err(invalid(
                "retry_min",
                "must be above zero and at most retry_max",
            ));
        }
        if self.timeout.is_zero() || self.timeout > Duration::from_secs(300) {
            return Err(invalid("timeout", "must be between 1ms and 5m"));
        }
        self.check_figures()?;
        if let Some(cw) = &self.cloudwatch {
            cw.check()?;
        }
        if let Some(g) = &self.gnocchi {
            g.check()?;
        }
        Ok(())
    }

    /// The metrics and dimensions asked for.
    fn check_figures(&self) -> Result<(), Invalid> {
        let known: Vec<&str> = sets::NODE_METRICS
            .iter()
            .chain(sets::FLEET_METRICS)
            .chain(sets::EVENT_METRICS)
            .copied()
            .collect();
        for m in &self.metrics {
            if !known.contains(&m.as_str()) {
                return Err(invalid(
                    "metrics",
                    format!(
                        "unknown metric {m:?}: expected some of {}",
                        known.join(", ")
                    ),
                ));
            }
        }
        if self.dimensions.len() + 2 > crate::sample::MAX_DIMENSIONS {
            return Err(invalid("dimensions", "too many dimensions"));
        }
        check_dims("dimensions", &self.dimensions)?;
        if let Some(id) = &self.instance_id {
            check_dimension_value("InstanceId", id).map_err(|e| invalid("instance_id", e))?;
        }
        for (group, dims) in &self.group_dimensions {
            let ok = group
                .split_once(':')
                .is_some_and(|(k, v)| matches!(k, "profile" | "district") && !v.is_empty());
            if !ok {
                return Err(invalid(
                    &format!("group_dimensions.{group}"),
                    "keys are profile:<name> or district:<uuid>",
                ));
            }
            check_dims(&format!("group_dimensions.{group}"), dims)?;
        }
        check_name(
            "resource prefix",
            &format!("{}x", self.group_resource_prefix),
        )
        .map_err(|e| invalid("group_resource_prefix", e))?;
        Ok(())
    }
}

impl CloudWatchConfig {
    fn check(&self) -> Result<(), Invalid> {
        let cw = self;
        check_url("cloudwatch.endpoint", &cw.endpoint)?;
        if cw.region.is_empty() {
            return Err(invalid("cloudwatch.region", "must not be empty"));
        }
        if cw.service.is_empty() {
            return Err(invalid("cloudwatch.service", "must not be empty"));
        }
        if cw.namespace.is_empty() || cw.namespace.len() > 255 || cw.namespace.starts_with(':') {
            return Err(invalid("cloudwatch.namespace", "must have 1 to 255 bytes"));
        }
        if cw.max_per_request == 0 || cw.max_per_request > 1000 {
            return Err(invalid(
                "cloudwatch.max_per_request",
                "must be between 1 and 1000",
            ));
        }
        for a in &cw.alarm_names {
            check_dimension_value("AlarmName", a)
                .map_err(|e| invalid("cloudwatch.alarm_names", e))?;
        }
        cw.credential_source()
            .map_err(|e| invalid("cloudwatch.secret_access_key", e.to_string()))?;
        Ok(())
    }
}

impl GnocchiConfig {
    fn check(&self) -> Result<(), Invalid> {
        let g = self;
        if let Some(ep) = &g.endpoint {
            check_url("gnocchi.endpoint", ep)?;
        }
        if g.resource_type.is_empty()
            || !g
                .resource_type
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        {
            return Err(invalid(
                "gnocchi.resource_type",
                "must be a resource type name",
            ));
        }
        if let Some(r) = &g.resource_id {
            check_name("resource id", r).map_err(|e| invalid("gnocchi.resource_id", e))?;
        }
        if g.metric_prefix.contains('/') {
            return Err(invalid("gnocchi.metric_prefix", "must not contain '/'"));
        }
        if g.cloud.is_none() && g.clouds_yaml.is_some() {
            return Err(invalid("gnocchi.clouds_yaml", "needs gnocchi.cloud"));
        }
        Ok(())
    }
}
