//! `[policy]`: when to scale (the seeds' thresholds and the peer
//! autoscalers' guards), with its checks.

use std::time::Duration;

use gearshift_service::check::at_least;
use gearshift_service::config::{Invalid, duration};
use serde::{Deserialize, Serialize};

use super::MIN_PERIOD;
use crate::perkey::PerKey;

/// How the victim of a scale-down is chosen (inactive nodes always come first).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VictimStrategy {
    /// Fewest active gears, then fewest gears (cheapest to empty).
    #[default]
    LeastBusy,
    /// Only nodes without any gear.
    EmptyOnly,
    /// The node whose agent started first.
    Oldest,
    /// The node whose agent started last.
    Newest,
}

impl VictimStrategy {
    /// The configuration name.
    pub fn as_str(self) -> &'static str {
        match self {
            VictimStrategy::LeastBusy => "least_busy",
            VictimStrategy::EmptyOnly => "empty_only",
            VictimStrategy::Oldest => "oldest",
            VictimStrategy::Newest => "newest",
        }
    }
}

/// `[policy]`: when to scale. Per-profile keys take `"default, profile: value"`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PolicyConfig {
    /// `INTERVAL`: time between evaluations. Default `60s`.
    #[serde(with = "duration")]
    pub interval: Duration,
    /// After a report pushes a group over a scale-up threshold, evaluate
    /// this soon instead of waiting for the next interval. Default `1s`.
    #[serde(with = "duration")]
    pub react_delay: Duration,
    /// After the agent starts, hold every decision this long while reports
    /// come in (the fleet model starts empty). Default `30s`.
    #[serde(with = "duration")]
    pub startup_grace: Duration,
    /// `PROFILE_THRESHOLD`: active usage % of a profile at which a node is
    /// added to its district with the most free capacity. Default `80`.
    pub profile_threshold: PerKey,
    /// `DISTRICT_THRESHOLD`: active usage % of one district at which a node is
    /// added to it. Default `90`.
    pub district_threshold: PerKey,
    /// `COMPACT_THRESHOLD`: active usage % of a district below which it is
    /// compacted (a node emptied and removed). Default `50`.
    pub compact_threshold: PerKey,
    /// `GEAR_UP_THRESHOLD`: scale up a profile whose effective available
    /// gears fall below this. Default `none` (off).
    pub gear_up_threshold: PerKey,
    /// `GEAR_UP_SIZE`: gears of capacity to add when `gear_up_threshold`
    /// fires (rounded up to whole nodes). Default `200`.
    pub gear_up_size: PerKey,
    /// `GEAR_DOWN_THRESHOLD`: scale down a profile with at least this many
    /// available gears. Default `none` (off).
    pub gear_down_threshold: PerKey,
    /// `GEAR_EXPECTED_ACTIVE_PERCENT`: share of a node's gears expected to be
    /// active; a new node needs `max_active_gears * 100 / this` free UIDs in
    /// its district. Default `5`.
    pub gear_expected_active_percent: PerKey,
    /// A node is missing after this many of its report intervals without a
    /// report. Default `3`.
    pub stale_after_intervals: u32,
    /// A missing node is forgotten (no longer holds scaling) after this. Default `30m`.
    #[serde(with = "duration")]
    pub forget_missing_after: Duration,
    /// Breaker: all scaling stops while more than this % of nodes are missing. Default `45`.
    pub breaker_stale_percent: u32,
    /// No scale-down in a group this long after a scale-up. Default `10m`.
    #[serde(with = "duration")]
    pub cooldown_after_scale_up: Duration,
    /// No further scale-down in a group this long after a removal. Default `5m`.
    #[serde(with = "duration")]
    pub cooldown_after_scale_down: Duration,
    /// No scale-down in a group this long after a failed (aborted) one. Default `3m`.
    #[serde(with = "duration")]
    pub cooldown_after_failure: Duration,
    /// A group must stay below its compact threshold this long before a
    /// scale-down. Default `10m`.
    #[serde(with = "duration")]
    pub scale_down_stabilization: Duration,
    /// A requested node that has not reported within this is given up. Default `15m`.
    #[serde(with = "duration")]
    pub provision_timeout: Duration,
    /// First wait before a group scales up again after a failed scale-up. Default `5m`.
    #[serde(with = "duration")]
    pub backoff_initial: Duration,
    /// Longest such wait (the wait doubles per consecutive failure). Default `30m`.
    #[serde(with = "duration")]
    pub backoff_max: Duration,
    /// Consecutive quota failures that mark a group exhausted. Default `2`.
    pub exhausted_after_quota_failures: u32,
    /// How often an exhausted group's handler is asked for capacity. Default `5m`.
    #[serde(with = "duration")]
    pub exhaustion_check_interval: Duration,
    /// Disruption budget: nodes draining at once per group, in % of its nodes
    /// (at least 1). Default `10`.
    pub disruption_budget_percent: u32,
    /// Disruption budget: nodes draining at once in the whole fleet, in % of
    /// its nodes (at least 1). Default `10`.
    pub fleet_disruption_budget_percent: u32,
    /// Victim choice after inactive nodes. Default `least_busy`.
    pub victim_strategy: VictimStrategy,
    /// Scale-ups in flight at once per group. Default `3`.
    pub max_scale_ups_in_flight: u32,
}

impl Default for PolicyConfig {
    fn default() -> Self {
        PolicyConfig {
            interval: Duration::from_secs(60),
            react_delay: Duration::from_secs(1),
            startup_grace: Duration::from_secs(30),
            profile_threshold: PerKey::all(80),
            district_threshold: PerKey::all(90),
            compact_threshold: PerKey::all(50),
            gear_up_threshold: PerKey::off(),
            gear_up_size: PerKey::all(200),
            gear_down_threshold: PerKey::off(),
            gear_expected_active_percent: PerKey::all(5),
            stale_after_intervals: 3,
            forget_missing_after: Duration::from_secs(30 * 60),
            breaker_stale_percent: 45,
            cooldown_after_scale_up: Duration::from_secs(600),
            cooldown_after_scale_down: Duration::from_secs(300),
            cooldown_after_failure: Duration::from_secs(180),
            scale_down_stabilization: Duration::from_secs(600),
            provision_timeout: Duration::from_secs(900),
            backoff_initial: Duration::from_secs(300),
            backoff_max: Duration::from_secs(1800),
            exhausted_after_quota_failures: 2,
            exhaustion_check_interval: Duration::from_secs(300),
            disruption_budget_percent: 10,
            fleet_disruption_budget_percent: 10,
            victim_strategy: VictimStrategy::LeastBusy,
            max_scale_ups_in_flight: 3,
        }
    }
}

fn check_percent(key: &str, v: &PerKey, lo: u32, hi: u32) -> Result<(), Invalid> {
    for (who, x) in v.values() {
        if x < lo || x > hi {
            return Err(Invalid::new(
                key,
                format!("{who}: {x} is outside {lo}..={hi}"),
            ));
        }
    }
    Ok(())
}

fn at_least_one(key: &str, n: u32) -> Result<(), Invalid> {
    if n == 0 {
        return Err(Invalid::new(key, "must be at least 1"));
    }
    Ok(())
}

impl PolicyConfig {
    /// Checks the section; keys in errors start with `policy.`.
    pub fn check(&self) -> Result<(), Invalid> {
        self.check_thresholds()?;
        self.check_guards()
    }

    /// The seeds' thresholds, and that scale-up and scale-down cannot flap.
    fn check_thresholds(&self) -> Result<(), Invalid> {
        let p = self;
        at_least("policy.interval", p.interval, MIN_PERIOD)?;
        check_percent("policy.profile_threshold", &p.profile_threshold, 1, 100)?;
        check_percent("policy.district_threshold", &p.district_threshold, 1, 100)?;
        check_percent("policy.compact_threshold", &p.compact_threshold, 0, 99)?;
        check_percent(
            "policy.gear_expected_active_percent",
            &p.gear_expected_active_percent,
            1,
            100,
        )?;
        check_percent("policy.gear_up_size", &p.gear_up_size, 1, 1_000_000)?;
        // Compacting must stop well before a scale-up starts, or the agent flaps.
        for (who, compact) in p.compact_threshold.values() {
            let prof = match who {
                "default" => p.profile_threshold.default,
                k => p.profile_threshold.get(k, k),
            };
            if let Some(up) = prof
                && compact >= up
            {
                return Err(Invalid::new(
                    "policy.compact_threshold",
                    format!(
                        "{who}: {compact} must be below profile_threshold {up}, or scale-down and scale-up would flap"
                    ),
                ));
            }
        }
        if let (Some(up), Some(down)) = (p.gear_up_threshold.default, p.gear_down_threshold.default)
            && down <= up
        {
            return Err(Invalid::new(
                "policy.gear_down_threshold",
                format!("{down} must be above gear_up_threshold {up}, or scaling would flap"),
            ));
        }
        Ok(())
    }

    /// The peer autoscalers' guards: staleness, breaker, backoff, budgets.
    fn check_guards(&self) -> Result<(), Invalid> {
        let p = self;
        at_least_one("policy.stale_after_intervals", p.stale_after_intervals)?;
        if p.breaker_stale_percent == 0 || p.breaker_stale_percent > 100 {
            return Err(Invalid::new(
                "policy.breaker_stale_percent",
                "must be 1..=100",
            ));
        }
        if p.backoff_max < p.backoff_initial {
            return Err(Invalid::new(
                "policy.backoff_max",
                "must not be shorter than backoff_initial",
            ));
        }
        at_least_one(
            "policy.exhausted_after_quota_failures",
            p.exhausted_after_quota_failures,
        )?;
        at_least(
            "policy.exhaustion_check_interval",
            p.exhaustion_check_interval,
            MIN_PERIOD,
        )?;
        at_least("policy.provision_timeout", p.provision_timeout, MIN_PERIOD)?;
        if p.disruption_budget_percent > 100 || p.fleet_disruption_budget_percent > 100 {
            return Err(Invalid::new(
                "policy.disruption_budget_percent",
                "budgets are percentages (0..=100; at least one node may always drain)",
            ));
        }
        at_least_one("policy.max_scale_ups_in_flight", p.max_scale_ups_in_flight)
    }
}
